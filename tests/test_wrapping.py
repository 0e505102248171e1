"""Replacing functions in a class and putting back exactly what was there: the wrapper mark, vLLM's own
function under any number of plugin layers, and a foreign wrapper left alone on restore."""

from __future__ import annotations

import functools
from typing import Any

from vllm_staging_plugin._engine.wrapping import MARK, ClassWrap, is_plugin_wrapper, plugin_wrapper, stock


def vllms(self: Any, x: int) -> int:
    """vLLM's own."""
    return x


def layer(original: Any) -> Any:
    @plugin_wrapper(original)
    def wrapper(self: Any, x: int) -> int:
        return original(self, x) + 1

    return wrapper


def foreign(original: Any) -> Any:
    @functools.wraps(original)  # copies __dict__, the mark included
    def theirs(self: Any, x: int) -> int:
        return original(self, x) * 10

    return theirs


def test_the_mark_is_the_wrapper_itself() -> None:
    ours = layer(vllms)
    assert is_plugin_wrapper(ours) and getattr(ours, MARK) is ours
    assert (ours.__name__, ours.__doc__, ours.__wrapped__) == ("vllms", "vLLM's own.", vllms)
    assert not is_plugin_wrapper(vllms) and not is_plugin_wrapper(3)


def test_none_is_not_a_plugin_wrapper() -> None:
    assert not is_plugin_wrapper(None)


def test_a_foreign_functools_wraps_copy_is_not_a_plugin_wrapper() -> None:
    theirs = foreign(layer(vllms))
    assert getattr(theirs, MARK) is not None  # the mark was copied ...
    assert not is_plugin_wrapper(theirs)  # ... but it names another function


def test_stock_skips_every_plugin_layer_and_stops_at_a_foreign_one() -> None:
    assert stock(vllms) is vllms
    assert stock(layer(layer(vllms))) is vllms
    theirs = foreign(layer(vllms))
    assert stock(theirs) is theirs  # another tool's wrapper is what the class holds: it is kept
    assert stock(layer(theirs)) is theirs


def test_apply_and_restore_put_back_exactly_what_the_class_held() -> None:
    cls = type("Manager", (), {"capture": vllms, "other": vllms})
    wrap = ClassWrap(cls, ("capture",))
    assert wrap.saved == {"capture": vllms} and wrap.stock == {"capture": vllms} and not wrap.live
    ours = layer(wrap.stock["capture"])
    wrap.apply({"capture": ours})
    assert cls.__dict__["capture"] is ours and wrap.replacements == {"capture": ours} and wrap.live
    assert cls().capture(1) == 2
    assert wrap.restore() == [] and not wrap.live
    assert cls.__dict__["capture"] is vllms and cls.__dict__["other"] is vllms


def test_a_wrap_that_puts_vllms_own_functions_in_leaves_them_unmarked() -> None:
    """The offline stock arm applies vLLM's own functions over the installer's wrapper: afterwards they
    carry nothing of the plugin's, and the installer's wrapper is back."""
    base = type("Manager", (), {"capture": vllms})
    installer = ClassWrap(base, ("capture",))
    ours = layer(installer.stock["capture"])
    installer.apply({"capture": ours})
    stock_arm = ClassWrap(base, ("capture",))
    stock_arm.apply(stock_arm.stock)
    assert base.__dict__["capture"] is vllms and base().capture(1) == 1
    assert stock_arm.restore() == [] and base.__dict__["capture"] is ours
    assert vars(vllms) == {}  # no owner, no mark
    assert installer.restore() == [] and base.__dict__["capture"] is vllms


def test_a_second_wrap_over_a_plugin_wrapper_calls_vllms_own_and_restores_the_first() -> None:
    """An offline tool wrapping a class the process's installer already wrapped runs one plugin layer."""
    cls = type("Manager", (), {"capture": vllms})
    first = ClassWrap(cls, ("capture",))
    first_layer = layer(first.stock["capture"])
    first.apply({"capture": first_layer})
    second = ClassWrap(cls, ("capture",))
    assert second.saved == {"capture": first_layer} and second.stock == {"capture": vllms}
    second.apply({"capture": layer(second.stock["capture"])})
    assert cls().capture(1) == 2  # one plugin layer, not two
    assert second.restore() == [] and cls.__dict__["capture"] is first_layer
    assert first.restore() == [] and cls.__dict__["capture"] is vllms


def test_restore_leaves_a_foreign_wrapper_and_names_it() -> None:
    cls = type("Manager", (), {"__init__": lambda self: None, "capture": vllms})
    wrap = ClassWrap(cls, ("__init__", "capture"))
    ours = {name: layer(function) for name, function in wrap.stock.items()}
    wrap.apply(ours)
    theirs = foreign(ours["capture"])
    cls.capture = theirs
    assert wrap.restore() == ["Manager.capture"] and not wrap.live
    assert cls.__dict__["capture"] is theirs and cls.__dict__["__init__"] is wrap.saved["__init__"]


def test_a_wrap_is_live_only_while_applied_and_restoring_twice_changes_nothing() -> None:
    class Manager:
        def capture(self) -> None:
            return None

    vllms = Manager.__dict__["capture"]
    wrap = ClassWrap(Manager, ("capture",))
    assert not wrap.live and wrap.restore() == [] and Manager.__dict__["capture"] is vllms
    wrap.apply({"capture": lambda self: None})
    assert wrap.live
    assert wrap.restore() == [] and not wrap.live and Manager.__dict__["capture"] is vllms
    Manager.capture = lambda self: "someone else"  # type: ignore[method-assign]
    assert wrap.restore() == []  # not applied any more: nothing of ours to put back


def test_restored_out_of_order_no_dead_plugin_layer_is_put_back() -> None:
    """The first wrap is restored while a second sits on top: the second is no other tool, and its
    restore puts back vLLM's own, not the first's dead layer."""
    cls = type("Manager", (), {"capture": vllms})
    first = ClassWrap(cls, ("capture",))
    first.apply({"capture": layer(first.stock["capture"])})
    second = ClassWrap(cls, ("capture",))
    second_layer = layer(second.stock["capture"])
    second.apply({"capture": second_layer})
    assert first.restore() == [] and cls.__dict__["capture"] is second_layer
    assert second.restore() == [] and cls.__dict__["capture"] is vllms


def test_a_dead_layer_under_a_foreign_wrapper_stays_where_the_foreign_one_calls_it() -> None:
    cls = type("Manager", (), {"capture": vllms})
    first = ClassWrap(cls, ("capture",))
    first_layer = layer(first.stock["capture"])
    first.apply({"capture": first_layer})
    theirs = foreign(first_layer)
    cls.capture = theirs
    assert first.restore() == ["Manager.capture"]
    assert cls.__dict__["capture"] is theirs  # it still calls the (now pass-through) plugin layer


def test_a_signal_reaches_the_live_layers_underneath_only() -> None:
    heard: list[str] = []
    cls = type("Manager", (), {"capture": vllms})
    wraps: list[ClassWrap] = []
    for i in (0, 1, 2):
        wrap = ClassWrap(cls, ("capture",), signals={"capture": lambda i=i: heard.append(f"w{i}")})
        wrap.apply({"capture": layer(wrap.stock["capture"])})
        wraps.append(wrap)
    wraps[2].signal("capture")
    assert heard == ["w1", "w0"]  # underneath, nearest first; never the signalling wrap itself
    heard.clear()
    wraps[1].restore()
    wraps[2].signal("capture")
    assert heard == ["w0"]  # a restored layer is skipped, the live one below it still hears
    heard.clear()
    wraps[2].signal("other")  # a name the wraps do not hold: nothing
    wraps[0].signal("capture")  # the bottom layer has nothing underneath
    assert heard == []


def test_a_chain_of_dead_layers_is_walked_down_to_vllms_own() -> None:
    cls = type("Manager", (), {"capture": vllms})
    wraps = []
    for _ in range(3):
        wrap = ClassWrap(cls, ("capture",))
        wrap.apply({"capture": layer(wrap.stock["capture"])})
        wraps.append(wrap)
    assert wraps[0].restore() == [] and wraps[1].restore() == []  # both under the third: left in place
    assert wraps[2].restore() == [] and cls.__dict__["capture"] is vllms


def test_a_wrapper_no_wrap_applied_has_no_owner() -> None:
    from vllm_staging_plugin._engine.wrapping import owner

    assert owner(layer(vllms)) is None and owner(vllms) is None and owner(None) is None
