"""The staging fix (``StagingFix``) on a fake manager: what it wraps and restores, the capture path, the
refusal (every injected structure fault, the platform, strict mode), the log lines and the stand-down."""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from typing import Any

import pytest
import torch
from fakes import (
    FULL,
    PIECEWISE,
    Desc,
    FakeManager,
    build,
    config,
    descs,
    fresh_class,
    install_fake_module,
    installed_fix,
    make_module,
)
from stable import assert_says
from wrappers import is_patched

import vllm_staging_plugin
from vllm_staging_plugin._engine import agreement, compat, staging
from vllm_staging_plugin._engine.policies import PolicyRegistry
from vllm_staging_plugin._engine.settings import Settings, read_settings
from vllm_staging_plugin._engine.staging_fix import StagingFix

MODULE = compat.CUDAGRAPH_MODULE
STOCK_CRASH = "must match the existing size"  # what the fake (like vLLM) raises at a short staging copy


def assert_inactive(warnings: list[str], reason: str, ignored: str = "") -> None:
    """One warning: inactive and unpatched, why, which of the operator's settings is not applied, and the
    strict switch."""
    (warning,) = warnings
    ending = (
        f": {reason}. " + (f"{ignored} " if ignored else "") + "Set STAGING_PLUGIN_STRICT=1 to fail instead."
    )
    assert_says(warning, "vllm-staging-plugin is inactive, vLLM runs unpatched", end=ending)


def ascending(manager: Any) -> None:
    for mode in manager._capture_descs:
        manager._capture_descs[mode].sort(key=lambda d: d.num_tokens)


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake class installed where register() looks for vLLM's module, on a supported platform."""
    return install_fake_module(monkeypatch)


# ---- wrapping and restoring ----------------------------------------------------------------------


def test_register_twice_patches_once(fake_module: Any) -> None:
    cls = fake_module.ModelCudaGraphManager
    vllm_staging_plugin.register()
    first = (cls.__dict__["__init__"], cls.__dict__["capture"])
    vllm_staging_plugin.register()
    assert is_patched(cls)
    assert (cls.__dict__["__init__"], cls.__dict__["capture"]) == first
    assert installed_fix("staging").wrap.original["__init__"] is FakeManager.__init__


def test_unregister_restores_the_class_exactly(fake_module: Any) -> None:
    cls = fake_module.ModelCudaGraphManager
    before = dict(cls.__dict__)
    vllm_staging_plugin.register()
    assert dict(cls.__dict__) != before
    vllm_staging_plugin.unregister()
    assert dict(cls.__dict__) == before
    vllm_staging_plugin.unregister()  # a second unregister() is a no-op
    assert dict(cls.__dict__) == before


def test_patch_and_uninstall_say_what_they_did(plugin_log: Any) -> None:
    cls, other = fresh_class(), fresh_class()
    manager_patch = StagingFix(Settings())
    assert manager_patch.apply(cls) is True
    assert manager_patch.apply(cls) is False and manager_patch.apply(other) is False  # one class per patch
    assert is_patched(cls) and not is_patched(other)
    (patched,) = plugin_log.at(10)
    assert_says(patched, "patched", f"{cls.__module__}.ModelCudaGraphManager", "(__init__, capture)")
    assert manager_patch.uninstall() == [] and manager_patch.wrap is None and not is_patched(cls)
    assert manager_patch.uninstall() == []  # nothing held: nothing to restore


def test_patched_manager_survives_ascending_order(fake_module: Any, plugin_log: Any) -> None:
    vllm_staging_plugin.register()
    manager = build(fake_module.ModelCudaGraphManager)
    ascending(manager)
    manager.capture(aux=2)
    assert manager.hidden_states.shape == (8, 8)
    assert [t.shape[0] for t in manager.aux_hidden_states] == [8, 8]
    assert any("sized to 8 rows" in m for m in plugin_log.at(20))


def test_stock_fake_crashes_under_ascending_order() -> None:
    """The control for the test above: the fake reproduces vLLM's crash when nothing is patched."""
    manager = build(fresh_class())
    ascending(manager)
    with pytest.raises(RuntimeError, match=STOCK_CRASH):
        manager.capture()


def test_nothing_to_capture_allocates_nothing(fake_module: Any) -> None:
    vllm_staging_plugin.register()
    manager = fake_module.ModelCudaGraphManager(config(), "cpu", "NONE", 1, capture_descs={})
    assert staging.state_of(manager).capacity == 0
    assert manager.capture() == [] and manager.hidden_states is None


def test_kill_switch_leaves_vllm_untouched(fake_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_DISABLE", "1")
    vllm_staging_plugin.register()
    assert not is_patched(fake_module.ModelCudaGraphManager)
    assert staging.state_of(build(fake_module.ModelCudaGraphManager)) is None


def test_presize_off_leaves_vllms_lazy_staging(fake_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``off-allow-crash`` reorders on stock staging: the upstream crash, reproduced on purpose."""
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", "off-allow-crash")
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    manager = build(fake_module.ModelCudaGraphManager)
    assert staging.state_of(manager).capacity is None
    with pytest.raises(RuntimeError, match=STOCK_CRASH):
        manager.capture()


def test_ranks_are_checked_on_the_order_that_will_be_captured(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    cls = fake_module.ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    spy = mocker.patch.object(agreement, "check_coupled_ranks", return_value=3)
    manager = build(cls)
    assert manager.capture() == [1, 2, 4, 8, 1, 2]
    ((settings, ordered, vllm_config),) = [c.args for c in spy.call_args_list]
    assert settings.order == "ascending" and vllm_config is manager.vllm_config
    assert {m: [d.num_tokens for d in ds] for m, ds in ordered.items()} == {
        PIECEWISE: [1, 2, 4, 8],
        FULL: [1, 2],
    }
    assert staging.state_of(manager).ranks_agreed == 3
    assert [d.num_tokens for d in manager._capture_descs[PIECEWISE]] == [8, 4, 2, 1]  # vLLM's lists back
    profiling = build(cls)
    profiling._max_full_descs_to_capture = 1  # vLLM's profiling pass samples the largest: vLLM's order
    assert profiling.capture() == [8, 4, 2, 1, 2, 1] and spy.call_count == 1
    vllm_staging_plugin.unregister()
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "descending")
    vllm_staging_plugin.register()
    build(cls).capture()
    assert spy.call_count == 1  # vLLM's own order cannot split ranks: no check, no store round-trip


def test_a_vllm_that_presizes_itself_is_left_alone_with_one_info_line(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    cls = fake_module.ModelCudaGraphManager
    seen: list[type] = []

    def capture(self: Any, hidden: int = 8, aux: int = 0) -> list[int]:  # sizes by the largest itself
        seen.append(type(self))
        largest = max(d.num_tokens for ds in self._capture_descs.values() for d in ds)
        self.hidden_states = torch.empty(largest, hidden)
        return FakeManager.capture(self, hidden, aux)

    cls.capture = capture
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    first = build(cls)
    own = first.capture()
    assert (
        own == [1, 2, 4, 8, 1, 2]
        and first.hidden_states.shape == (8, 8)
        and installed_fix("staging").vllm_sizes_staging
    )
    assert build(cls).capture() == [1, 2, 4, 8, 1, 2]  # the order knob keeps working ...
    assert seen[0] is not cls and seen[1] is cls  # ... and later captures leave vLLM's staging alone
    stand_down = [m for m in plugin_log.at(20) if "itself; the plugin leaves them to vLLM" in m]
    (line,) = stand_down
    assert_says(
        line,
        "vllm-staging-plugin: vLLM sizes ModelCudaGraphManager's staging buffers",
        "capture descriptors (8 rows) itself; the plugin leaves them to vLLM",
        end="; capture order: ascending",
    )


@pytest.mark.parametrize(
    ("presize", "sizing"),
    [
        ("on", "sized to 8 rows, the largest"),
        ("off-allow-crash", "left to vLLM's lazy sizing (off-allow-crash; largest is 8 rows)"),
    ],
)
def test_the_announcement_names_the_buffers_their_sizing_and_the_order_once_per_process(
    presize: str, sizing: str, fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", presize)
    vllm_staging_plugin.register()
    build(fake_module.ModelCudaGraphManager)
    build(fake_module.ModelCudaGraphManager)
    (line,) = plugin_log.at(20)  # INFO once ...
    assert_says(
        line,
        "vllm-staging-plugin: ModelCudaGraphManager staging buffers",
        "(hidden_states, aux_hidden_states, intermediate_tensors)",
        sizing,
        "of 6 capture descriptors",
        end="capture order: ascending",
    )
    assert plugin_log.at(10)[-1] == line  # ... then DEBUG for every later manager


# ---- the refusal ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "ignored"),
    [
        (None, ""),
        ("descending", ""),
        ("", ""),
        ("  ascending ", "STAGING_PLUGIN_ORDER=ascending is NOT applied."),
        ("shuffle:3", "STAGING_PLUGIN_ORDER=shuffle:3 is NOT applied."),
    ],
)
def test_the_inactive_warning_names_the_reason_and_the_ignored_order_once_per_patch(
    order: str | None, ignored: str, plugin_log: Any
) -> None:
    refusing = StagingFix(read_settings({} if order is None else {"STAGING_PLUGIN_ORDER": order}))
    refusing.refuse("the reason")
    refusing.refuse("a second reason")  # one warning per patch, so one per process
    assert_inactive(plugin_log.warnings, "the reason", ignored)


def test_refuse_raises_exactly_when_its_settings_are_strict(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    """A patch refuses with the settings it was built with, whatever the environment says now."""
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    StagingFix(Settings(strict=False)).refuse("built lenient")  # no raise
    assert_inactive(plugin_log.warnings, "built lenient")
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "0")
    strict = StagingFix(Settings(strict=True))
    with pytest.raises(compat.IncompatibleVllm, match=r"^vllm-staging-plugin \(strict mode\): built strict$"):
        strict.refuse("built strict")
    assert len(plugin_log.warnings) == 1  # the lenient one's only


def test_deactivating_a_patch_that_holds_no_class_still_warns(plugin_log: Any) -> None:
    """unregister() raced with a manager's construction: the class is stock already; the warning stays."""
    idle = StagingFix(Settings())
    idle._deactivate("gone")
    assert_inactive(plugin_log.warnings, "gone")
    assert idle.wrap is None and idle.uninstall() == []


def _init_then(change: Any) -> Any:
    @functools.wraps(FakeManager.__init__)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        FakeManager.__init__(self, *args, **kwargs)
        change(self)

    return __init__


def _changed_signature_init(self: Any, config: Any, uses_mrope: bool, device: Any, *a: Any, **k: Any) -> None:
    FakeManager.__init__(self, config, device, "FULL", 1, **k)


def _capture_what_is_left(self: Any) -> list[int]:  # vLLM's own capture of whatever __init__ left
    return FakeManager.capture(self) if isinstance(getattr(self, "_capture_descs", {}), dict) else []


def _manager_fault(change: Any, **members: Any) -> Any:
    return lambda: make_module(
        fresh_class(__init__=_init_then(change), capture=_capture_what_is_left, **members)
    )


# fault -> (the module vLLM would have, the reason the warning gives)
FAULTS = {
    "class missing": (
        lambda: make_module(None),
        "vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager is missing (vLLM < 0.18.0?)",
    ),
    "signature changed": (
        lambda: make_module(fresh_class(__init__=_changed_signature_init)),
        "ModelCudaGraphManager.__init__ takes (config, uses_mrope, device, a, k), expected it to start with",
    ),
    "_capture_descs absent": (
        _manager_fault(
            lambda m: setattr(m, "_capture_descs_v2", m.__dict__.pop("_capture_descs")),  # restructured
            _descs_for=lambda self, mode: self._capture_descs_v2.get(mode, []),
        ),
        "IncompatibleVllm: ModelCudaGraphManager._capture_descs is missing or not a dict",
    ),
    "_capture_descs not a dict": (
        _manager_fault(lambda m: setattr(m, "_capture_descs", list(m._capture_descs.values()))),
        "IncompatibleVllm: ModelCudaGraphManager._capture_descs is missing or not a dict",
    ),
    "num_tokens not an integer": (
        _manager_fault(lambda m: m._capture_descs.update({FULL: [Desc(FULL, 2.0)]})),  # type: ignore[arg-type]
        "IncompatibleVllm: capture descriptors for FULL have no integer num_tokens",
    ),
    "num_tokens missing": (
        _manager_fault(lambda m: m._capture_descs.update({FULL: [object()]})),
        "IncompatibleVllm: capture descriptors for FULL have no integer num_tokens",
    ),
    "attribute renamed": (
        _manager_fault(lambda m: setattr(m, "aux_staging", m.__dict__.pop("aux_hidden_states"))),
        "IncompatibleVllm: ModelCudaGraphManager.aux_hidden_states is not set by __init__",
    ),
    "hidden_states pre-filled": (
        _manager_fault(lambda m: setattr(m, "hidden_states", torch.zeros(8, 8))),
        "IncompatibleVllm: ModelCudaGraphManager.hidden_states starts as tensor(",
    ),
    "aux_hidden_states pre-filled": (
        _manager_fault(lambda m: setattr(m, "aux_hidden_states", [torch.zeros(8, 8)])),
        "IncompatibleVllm: ModelCudaGraphManager.aux_hidden_states starts as [tensor(",
    ),
    "intermediate_tensors pre-filled": (
        _manager_fault(lambda m: setattr(m, "intermediate_tensors", {})),
        "IncompatibleVllm: ModelCudaGraphManager.intermediate_tensors starts as {}, expected None",
    ),
}
CLASS_FAULTS = ("class missing", "signature changed")  # refused at import; the others at the first manager


def _install_fault(fault: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    module = FAULTS[fault][0]()
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    return getattr(module, "ModelCudaGraphManager", None)


def _build_faulty(fault: str, cls: type) -> Any:
    if fault == "signature changed":
        return cls(config(), True, "cpu", capture_descs={FULL: descs(FULL, [4, 2])})
    return build(cls)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_leaves_stock_manager_and_one_warning(
    fault: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    cls = _install_fault(fault, monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    vllm_staging_plugin.register()
    if cls is not None:
        assert is_patched(cls) is (fault not in CLASS_FAULTS)  # a manager fault shows in the built manager
        first = _build_faulty(fault, cls)
        assert not is_patched(cls) and type(first) is cls  # stock for this and every later manager
        assert staging.state_of(first) is None
        if "num_tokens" not in fault:
            first.capture()  # the manager works as stock vLLM's, in vLLM's descending order
        _build_faulty(fault, cls)  # a second manager in the same process: still one warning
    assert len(plugin_log.warnings) == 1, plugin_log.warnings
    warning = plugin_log.warnings[0]
    assert warning.startswith("vllm-staging-plugin is inactive") and FAULTS[fault][1] in warning
    assert "STAGING_PLUGIN_ORDER=ascending is NOT applied" in warning  # the order asked for is said ignored


@pytest.mark.parametrize(
    "fault",
    [
        "class missing",
        "_capture_descs absent",
        "_capture_descs not a dict",
        "attribute renamed",
        "hidden_states pre-filled",
    ],
)
def test_strict_mode_raises_clearly(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = _install_fault(fault, monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    prefix = re.escape(f"vllm-staging-plugin (strict mode): {FAULTS[fault][1]}")
    with pytest.raises(compat.IncompatibleVllm, match=f"^{prefix}"):
        vllm_staging_plugin.register()
        build(cls)
    assert cls is None or not is_patched(cls)


def test_unsupported_platform_is_refused(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "oot")
    vllm_staging_plugin.register()
    assert not is_patched(fake_module.ModelCudaGraphManager)
    # one warning per fix: the staging fix's, and the KDA fix's where this process imported its layer
    staging, kda = (
        [w for w in plugin_log.warnings if w.startswith(prefix)]
        for prefix in ("vllm-staging-plugin is inactive", "vllm-staging-plugin: the KDA state-slot fix")
    )
    assert len(staging) == 1 and "platform 'oot'" in staging[0]
    assert len(kda) <= 1 and all("platform 'oot'" in w for w in kda)
    assert len(plugin_log.warnings) == len(staging) + len(kda)


def test_an_unexpected_error_in_the_structure_check_is_one_warning_naming_it(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    def broken(module: Any) -> type:
        raise KeyError("renamed")

    monkeypatch.setattr(compat, "manager_class", broken)
    StagingFix(Settings()).install(make_module(fresh_class()))  # never breaks the import of vLLM's module
    assert_inactive(plugin_log.warnings, "KeyError: 'renamed'")


def test_a_tools_patch_loads_the_installed_policies_once() -> None:

    tool = StagingFix(Settings(order="ascending"))
    registry = tool._policies()
    assert isinstance(registry, PolicyRegistry) and "ascending" in registry.names()
    assert tool._policies() is registry
    given = PolicyRegistry([])
    assert StagingFix(Settings(order="ascending"), policies=given)._policies() is given


# ---- the profiling pass's mark ---------------------------------------------------------------------
# upstream main (vllm/v1/worker/gpu/cudagraph_utils.py after vllm-project/vllm#51700): no
# ``_max_full_descs_to_capture``; ``_sample_full_descs`` (a bool) is True only inside
# ``profile_cudagraph_memory``'s capture. A manager with neither, on a module that has the profiling
# entry point, cannot tell its passes apart.


def in_mains_shape(manager: Any, sample: bool | None) -> Any:
    del manager._max_full_descs_to_capture
    if sample is not None:
        manager._sample_full_descs = sample
    return manager


@pytest.mark.parametrize(("sample", "captured"), [(False, [1, 2, 4, 8, 1, 2]), (True, [8, 4, 2, 1, 2, 1])])
def test_mains_mark_reorders_the_real_capture_only(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any, sample: bool, captured: list[int]
) -> None:
    fake_module.profile_cudagraph_memory = lambda *a: None
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    manager = in_mains_shape(build(fake_module.ModelCudaGraphManager), sample)
    assert manager.capture() == captured and manager.hidden_states.shape == (8, 8)
    assert plugin_log.warnings == []


def test_an_unknown_mark_keeps_vllms_order_with_one_warning_and_still_presizes(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any, mocker: Any
) -> None:
    fake_module.profile_cudagraph_memory = lambda *a: None
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    spy = mocker.spy(agreement, "check_coupled_ranks")
    cls = fake_module.ModelCudaGraphManager
    first, second = (in_mains_shape(build(cls), None) for _ in range(2))
    first._capture_descs[PIECEWISE].reverse()  # vLLM's own order starting small: pre-sizing still acts
    assert first.capture() == [1, 2, 4, 8, 2, 1] and first.hidden_states.shape == (8, 8)
    assert second.capture() == [8, 4, 2, 1, 2, 1]
    (warning,) = plugin_log.warnings  # once per process
    assert_says(
        warning,
        "vllm-staging-plugin: this vLLM's manager has neither _max_full_descs_to_capture nor ",
        "_sample_full_descs, so the memory-profiling capture cannot be told from the real one; "
        "STAGING_PLUGIN_ORDER=ascending is NOT applied",
        "still pre-sized",
        end="Set STAGING_PLUGIN_STRICT=1 to fail instead.",
    )
    assert spy.call_count == 0  # nothing reordered: no rank check
    installed_fix("staging").refuse("a later reason")  # its own warning: the order's did not use it up
    assert len(plugin_log.warnings) == 2 and "a later reason" in plugin_log.warnings[1]


def test_an_unknown_mark_under_vllms_own_order_says_nothing(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    fake_module.profile_cudagraph_memory = lambda *a: None
    vllm_staging_plugin.register()
    manager = in_mains_shape(build(fake_module.ModelCudaGraphManager), None)
    assert manager.capture() == [8, 4, 2, 1, 2, 1]
    assert plugin_log.warnings == []


def test_an_unknown_mark_in_strict_mode_stops_the_capture_before_it_starts(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_module.profile_cudagraph_memory = lambda *a: None
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()
    manager = in_mains_shape(build(fake_module.ModelCudaGraphManager), None)
    with pytest.raises(compat.IncompatibleVllm, match=r"^vllm-staging-plugin \(strict mode\): this vLLM's"):
        manager.capture()
    assert manager.hidden_states is None  # nothing captured


# ---- a manager in upstream main's shape ------------------------------------------------------------
# Names and signatures as read from upstream main's vllm/v1/worker/gpu/cudagraph_utils.py (the public code
# index's newest copy, after vllm-project/vllm#51700; docs/compatibility.md, "Upstream main"): the
# constructor's new keywords, capture()'s new keyword defaults, descriptors with exact_num_tokens and
# num_ubatches, graphs keyed by descriptor, the profiling mark _sample_full_descs.


@dataclasses.dataclass(frozen=True)
class MainDesc:
    cg_mode: str
    num_tokens: int
    num_reqs: int | None = None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    exact_num_tokens: bool = False
    num_ubatches: int = 1


class MainShapeManager(FakeManager):
    """Main's signatures; its two methods go into a fresh class's own ``__dict__`` (as vLLM's are)."""

    def __init__(  # type: ignore[override]
        self,
        vllm_config: Any,
        device: Any,
        cudagraph_mode: Any,
        decode_query_len: int,
        lora_capture_cases: list[int] | None = None,
        varlen_decode: bool = False,
        ubatch_runner: Any = None,
        specialize_full_decode: bool = False,
        single_request_prefill_tokens: int = 0,
    ) -> None:
        FakeManager.__init__(self, vllm_config, device, cudagraph_mode, decode_query_len)
        del self._max_full_descs_to_capture
        self._sample_full_descs = False
        self.knobs = (specialize_full_decode, single_request_prefill_tokens)
        self._capture_descs = {
            PIECEWISE: [MainDesc(PIECEWISE, n) for n in (8, 4, 2, 1)],
            FULL: [MainDesc(FULL, n, uniform_token_count=2, exact_num_tokens=True) for n in (10, 2)],
        }

    def capture(  # type: ignore[override]
        self,
        model: Any,
        model_state: Any,
        input_buffers: Any,
        intermediate_tensors: Any,
        block_tables: Any,
        attn_groups: Any,
        kv_cache_config: Any,
        pcp_manager: Any = None,
        has_lora: bool = False,
        use_aux_hidden_state_outputs: bool = False,
        lora_capture_hook: Any = None,
        capture_logits: bool = False,
        progress_bar_desc: str = "Capturing CUDA graphs",
    ) -> list[int]:
        self.passed = (model, kv_cache_config, pcp_manager, capture_logits, progress_bar_desc)
        return FakeManager.capture(self, aux=2 if use_aux_hidden_state_outputs else 0)


@pytest.mark.parametrize("order", ["descending", "ascending"])
def test_a_manager_in_mains_shape_is_presized_and_its_arguments_pass_through(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any, order: str
) -> None:
    module = make_module(fresh_class())
    own = {name: MainShapeManager.__dict__[name] for name in ("__init__", "capture")}
    cls = module.ModelCudaGraphManager = type("ModelCudaGraphManager", (FakeManager,), own)  # type: ignore[attr-defined]
    module.profile_cudagraph_memory = lambda *a: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    assert is_patched(cls)
    manager = cls(
        config(), "cpu", "FULL_AND_PIECEWISE", 2, specialize_full_decode=True, single_request_prefill_tokens=7
    )
    assert manager.knobs == (True, 7) and staging.state_of(manager).capacity == 10
    args = ("model", "state", "buffers", None, "tables", [], "kv")
    seen = manager.capture(*args, pcp_manager="pcp", use_aux_hidden_state_outputs=True, capture_logits=True)
    assert manager.passed == ("model", "kv", "pcp", True, "Capturing CUDA graphs")
    assert seen == ([8, 4, 2, 1, 10, 2] if order == "descending" else [1, 2, 4, 8, 2, 10])
    assert manager.hidden_states.shape[0] == 10 and [a.shape[0] for a in manager.aux_hidden_states] == [
        10,
        10,
    ]
    profiling = cls(config(), "cpu", "FULL_AND_PIECEWISE", 2)
    profiling._sample_full_descs = True  # what profile_cudagraph_memory sets on the manager it profiles
    assert profiling.capture(*args) == [8, 4, 2, 1, 10, 2]  # vLLM's order, whatever STAGING_PLUGIN_ORDER says
    assert plugin_log.warnings == []


def _init_034(
    self: Any, vllm_config: Any, device: Any, cudagraph_mode: Any, decode_query_lens: Any, **kwargs: Any
) -> None:
    FakeManager.__init__(self, vllm_config, device, cudagraph_mode, 1, **kwargs)


def _capture_034(self: Any, hidden: int = 8, aux: int = 0) -> list[int]:
    """vLLM 0.34.0's staging: the buffer sized by the largest descriptor before the first store."""
    self.hidden_states = torch.empty(
        max(d.num_tokens for ds in self._capture_descs.values() for d in ds), hidden
    )
    return FakeManager.capture(self, hidden, aux)  # type: ignore[no-any-return]


@pytest.mark.parametrize("order", ["descending", "ascending"])
def test_a_manager_in_0340s_shape_is_left_to_vllm_with_one_true_line(
    order: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any, mocker: Any
) -> None:
    """vLLM 0.34.0's constructor (``decode_query_lens``) is the shape whose capture sizes the staging
    itself: no capacity, no capture view, one INFO line saying so (later managers at DEBUG); the order knob
    still reorders."""
    module = install_fake_module(monkeypatch)
    cls = module.ModelCudaGraphManager = fresh_class(__init__=_init_034, capture=_capture_034)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    assert is_patched(cls) and installed_fix("staging").vllm_sizes_staging
    view = mocker.spy(staging, "capture_view")
    first, second = build(cls), build(cls)
    assert staging.state_of(first).capacity is None and staging.state_of(first).vllm_sizes_staging
    seen = first.capture()
    assert seen == ([8, 4, 2, 1, 2, 1] if order == "descending" else [1, 2, 4, 8, 1, 2])
    assert view.call_count == 0 and type(first) is cls
    (line,) = [m for m in plugin_log.at(20) if "staging buffers" in m]
    assert line == (
        "vllm-staging-plugin: vLLM sizes ModelCudaGraphManager's staging buffers (hidden_states, "
        "aux_hidden_states, intermediate_tensors) to the largest of its 6 capture descriptors (8 rows) "
        f"itself; the plugin leaves them to vLLM; capture order: {order}"
    )
    assert sum("staging buffers" in m for m in plugin_log.at(10)) == 1  # the second manager
    assert staging.state_of(second).capacity is None
