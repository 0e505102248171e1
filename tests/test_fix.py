"""The base of every runtime fix: replacing methods of a class and putting back exactly what was there (a
foreign wrapper left alone on restore, suspend and resume with the same functions), and the
fix's own life: installed when its module is imported, never breaking that import, strict or one warning."""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

import pytest

from vllm_staging_plugin._engine.fix import ClassWrap, Once, RuntimeFix
from vllm_staging_plugin._engine.settings import Settings


def vllms(self: Any, x: int) -> int:
    """vLLM's own."""
    return x


def layer(original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, x: int) -> int:
        return original(self, x) + 1

    return wrapper


def foreign(original: Any) -> Any:
    @functools.wraps(original)
    def theirs(self: Any, x: int) -> int:
        return original(self, x) * 10

    return theirs


def test_apply_and_restore_put_back_exactly_what_the_class_held() -> None:
    cls = type("Manager", (), {"capture": vllms, "other": vllms})
    wrap = ClassWrap(cls, ("capture",))
    assert wrap.saved == {"capture": vllms} and wrap.original == {"capture": vllms} and not wrap.live
    ours = layer(wrap.original["capture"])
    wrap.apply({"capture": ours})
    assert cls.__dict__["capture"] is ours and wrap.replacements == {"capture": ours} and wrap.live
    assert cls().capture(1) == 2
    assert wrap.restore() == [] and not wrap.live
    assert cls.__dict__["capture"] is vllms and cls.__dict__["other"] is vllms


def test_restore_leaves_a_foreign_wrapper_and_names_it() -> None:
    cls = type("Manager", (), {"__init__": lambda self: None, "capture": vllms})
    wrap = ClassWrap(cls, ("__init__", "capture"))
    ours = {name: layer(function) for name, function in wrap.original.items()}
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


def test_a_dead_layer_under_a_foreign_wrapper_stays_where_the_foreign_one_calls_it() -> None:
    cls = type("Manager", (), {"capture": vllms})
    first = ClassWrap(cls, ("capture",))
    first_layer = layer(first.original["capture"])
    first.apply({"capture": first_layer})
    theirs = foreign(first_layer)
    cls.capture = theirs
    assert first.restore() == ["Manager.capture"]
    assert cls.__dict__["capture"] is theirs  # it still calls the (now pass-through) plugin layer


def test_suspend_and_resume_put_back_the_same_functions() -> None:
    cls = type("Manager", (), {"capture": vllms})
    wrap = ClassWrap(cls, ("capture",))
    ours = layer(wrap.original["capture"])
    wrap.apply({"capture": ours})
    wrap.suspend()
    assert cls.__dict__["capture"] is vllms and not wrap.live and cls().capture(1) == 1
    wrap.resume()
    assert cls.__dict__["capture"] is ours and wrap.live and cls().capture(1) == 2
    wrap.resume()  # nothing parked: nothing changes
    assert cls.__dict__["capture"] is ours


def test_a_wrap_another_tool_wrapped_is_over_once_suspended() -> None:
    cls = type("Manager", (), {"capture": vllms})
    wrap = ClassWrap(cls, ("capture",))
    wrap.apply({"capture": layer(wrap.original["capture"])})
    theirs = foreign(cls.__dict__["capture"])
    cls.capture = theirs
    wrap.suspend()
    wrap.resume()
    assert cls.__dict__["capture"] is theirs and not wrap.live  # theirs kept, ours a pass-through


def test_an_inherited_method_is_deleted_again_on_restore() -> None:
    base = type("Base", (), {"capture": vllms})
    cls = type("Manager", (base,), {})
    wrap = ClassWrap(cls, ("capture",))
    wrap.apply({"capture": layer(wrap.original["capture"])})
    assert cls().capture(1) == 2
    assert wrap.restore() == [] and "capture" not in cls.__dict__ and cls().capture(1) == 1


class Boom(RuntimeError):
    pass


class Doubling(RuntimeFix):
    """A fix of a stand-in module's ``Thing.twice``: doubles what vLLM's returns."""

    module = "staging_fix_test_module"
    target = "Thing"
    methods = ("twice",)
    error = Boom
    retired_by = frozenset({"done"})

    def wrappers(self, wrap: ClassWrap) -> dict[str, Any]:
        original = wrap.original["twice"]

        @functools.wraps(original)
        def twice(thing: Any, x: int) -> int:
            return original(thing, x) * 2 if wrap.live else original(thing, x)

        return {"twice": twice}


def _module(**attrs: Any) -> types.ModuleType:
    module = types.ModuleType(Doubling.module)
    vars(module).update(attrs)
    return module


def _thing() -> type:
    return type("Thing", (), {"twice": lambda self, x: x})


def test_a_fix_installs_on_its_module_and_uninstalls_exactly(caplog: pytest.LogCaptureFixture) -> None:
    cls = _thing()
    fix = Doubling(Settings())
    fix.install(_module(Thing=cls))
    assert cls().twice(3) == 6 and fix.wrap is not None
    assert cls.__dict__["twice"] is fix.wrap.replacements["twice"]  # the fix's own wrapper
    assert fix.uninstall() == [] and cls().twice(3) == 3 and fix.wrap is None


def test_a_fix_waits_for_vllms_import_and_retires_its_hook() -> None:
    events: list[str] = []
    fix = Doubling(Settings(), notify=events.append)
    fix.start()
    assert any(getattr(f, "fullname", None) == Doubling.module for f in sys.meta_path)
    fix.retire()
    assert not any(getattr(f, "fullname", None) == Doubling.module for f in sys.meta_path)
    fix.notify("done")
    assert events == ["done"]


def test_a_fix_that_cannot_apply_warns_once_or_raises_in_strict_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fix = Doubling(Settings())
    fix.install(_module())  # no Thing: refused, one warning, the import goes on
    fix.install(_module(Thing=3))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "vllm-staging-plugin: Doubling is inactive: staging_fix_test_module.Thing is missing. "
        "Set STAGING_PLUGIN_STRICT=1 to fail instead."
    ]
    with pytest.raises(Boom, match="strict mode"):
        Doubling(Settings(strict=True)).install(_module())


def test_a_fix_suspended_while_vllm_imports_its_module_installs_on_resume() -> None:
    cls = _thing()
    fix = Doubling(Settings())
    fix.suspend()
    fix.install(_module(Thing=cls))
    assert cls().twice(3) == 3 and fix.wrap is None
    fix.resume()
    assert cls().twice(3) == 6
    fix.suspend()
    assert cls().twice(3) == 3
    fix.resume()
    assert cls().twice(3) == 6 and fix.uninstall() == []


def test_a_fix_applies_to_one_class_only() -> None:
    fix = Doubling(Settings())
    first, second = _thing(), _thing()
    assert fix.apply(first) and not fix.apply(second) and second().twice(2) == 2
    assert fix.uninstall() == []


def test_once_is_true_the_first_time_only() -> None:
    """What a fix says once per process: each thing its own ``Once``."""
    first, second = Once(), Once()
    assert [first(), first(), first()] == [True, False, False] and second()
