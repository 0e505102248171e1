"""Unit tests of the patch on a mocked manager: idempotence, unpatch, every injected fault, strict mode."""

from __future__ import annotations

import functools
import sys
from typing import Any

import pytest
import torch
from fakes import (
    FULL,
    PIECEWISE,
    FakeManager,
    config,
    descs,
    fresh_class,
    install_fake_module,
    installed,
    is_patched,
    make_module,
    policy_order,
)

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, staging
from vllm_staging_plugin._engine.patch import ManagerPatch
from vllm_staging_plugin._engine.settings import Settings
from vllm_staging_plugin._engine.staging import StagingError

MODULE = compat.CUDAGRAPH_MODULE


def build(cls: type, sizes: tuple[list[int], list[int]] = ([1, 2, 4, 8], [1, 2])) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, sizes[0]), FULL: descs(FULL, sizes[1])}
    return cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)


def ascending(manager: Any) -> None:
    for mode in manager._capture_descs:
        manager._capture_descs[mode].sort(key=lambda d: d.num_tokens)


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake class installed where register() looks for vLLM's module, on a supported platform."""
    return install_fake_module(monkeypatch)


def test_register_twice_patches_once(fake_module: Any) -> None:
    cls = fake_module.ModelCudaGraphManager
    vllm_staging_plugin.register()
    first = (cls.__dict__["__init__"], cls.__dict__["capture"])
    vllm_staging_plugin.register()
    assert is_patched(cls)
    assert (cls.__dict__["__init__"], cls.__dict__["capture"]) == first
    assert installed().patch.wrap.stock["__init__"] is FakeManager.__init__


def test_unpatch_restores_class_exactly(fake_module: Any) -> None:
    cls = fake_module.ModelCudaGraphManager
    before = dict(cls.__dict__)
    vllm_staging_plugin.register()
    assert dict(cls.__dict__) != before
    vllm_staging_plugin.unregister()
    assert dict(cls.__dict__) == before
    vllm_staging_plugin.unregister()  # a second unregister() is a no-op
    assert dict(cls.__dict__) == before


def test_patched_manager_survives_ascending_order(fake_module: Any, plugin_log: Any) -> None:
    vllm_staging_plugin.register()
    manager = build(fake_module.ModelCudaGraphManager)
    ascending(manager)
    manager.capture(aux=2)
    assert manager.hidden_states.shape == (8, 8)
    assert [t.shape[0] for t in manager.aux_hidden_states] == [8, 8]
    assert any("sized to 8 rows" in m for m in plugin_log.at(20))


def test_stock_fake_crashes_under_ascending_order() -> None:
    manager = build(fresh_class())
    ascending(manager)
    with pytest.raises(RuntimeError, match="must match the existing size"):
        manager.capture()


def test_default_order_keeps_the_stock_tensor(fake_module: Any, mocker: Any) -> None:
    vllm_staging_plugin.register()
    spy = mocker.spy(staging, "presized")
    manager = build(fake_module.ModelCudaGraphManager)
    manager.capture()
    assert spy.call_count == 0  # vLLM's first output already has capacity rows: kept, nothing allocated
    assert type(manager) is fake_module.ModelCudaGraphManager  # back on vLLM's class after capture


def test_nothing_to_capture_allocates_nothing(fake_module: Any) -> None:
    vllm_staging_plugin.register()
    manager = fake_module.ModelCudaGraphManager(config(), "cpu", "NONE", 1, capture_descs={})
    assert staging.state_of(manager).capacity == 0
    assert manager.capture() == [] and manager.hidden_states is None


def test_kill_switch_leaves_vllm_untouched(fake_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_DISABLE", "1")
    vllm_staging_plugin.register()
    assert not is_patched(fake_module.ModelCudaGraphManager)


def test_register_waits_for_vllms_import_instead_of_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process half of the proof (torch and vLLM are loaded here already; the subprocess test
    ``test_register_is_import_light`` shows neither is imported): the module is not imported by register()."""
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    vllm_staging_plugin.register()  # only installs the import hook
    from vllm_staging_plugin._engine.import_hook import PostImportHook

    assert MODULE not in sys.modules
    assert any(isinstance(f, PostImportHook) and f.fullname == MODULE for f in sys.meta_path)


# ---- injected faults: each leaves a working stock manager and exactly one warning ----------------


@functools.wraps(FakeManager.__init__)
def _renamed_attribute_init(self: Any, *args: Any, **kwargs: Any) -> None:
    FakeManager.__init__(self, *args, **kwargs)
    self.__dict__["aux_staging"] = self.__dict__.pop("aux_hidden_states")  # renamed upstream


@functools.wraps(FakeManager.__init__)
def _no_capture_descs_init(self: Any, *args: Any, **kwargs: Any) -> None:
    FakeManager.__init__(self, *args, **kwargs)
    self._capture_descs_v2 = self.__dict__.pop("_capture_descs")  # restructured upstream


def _changed_signature_init(self: Any, config: Any, uses_mrope: bool, device: Any, *a: Any, **k: Any) -> None:
    FakeManager.__init__(self, config, device, "FULL", 1, **k)


FAULTS = {
    "class missing": lambda: make_module(None),
    "attribute renamed": lambda: make_module(fresh_class(__init__=_renamed_attribute_init)),
    "signature changed": lambda: make_module(fresh_class(__init__=_changed_signature_init)),
    "_capture_descs absent": lambda: make_module(
        fresh_class(
            __init__=_no_capture_descs_init, _descs_for=lambda self, m: self._capture_descs_v2.get(m, [])
        )
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_leaves_stock_manager_and_one_warning(
    fault: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    module = FAULTS[fault]()
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    vllm_staging_plugin.register()
    vllm_staging_plugin.register()
    cls = getattr(module, "ModelCudaGraphManager", None)
    if cls is not None:
        manager = (
            cls(config(), True, "cpu", capture_descs={FULL: descs(FULL, [4, 2])})
            if (fault == "signature changed")
            else build(cls)
        )
        manager.capture()  # stock: works in vLLM's descending order
        assert not is_patched(cls)
        assert staging.state_of(manager) is None
        build_again = cls  # a second manager in the same process: still one warning
        if fault != "signature changed":
            build(build_again).capture()
    assert len(plugin_log.warnings) == 1, plugin_log.warnings
    assert "vllm-staging-plugin is inactive" in plugin_log.warnings[0]


def test_unsupported_platform_is_refused(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "oot")
    vllm_staging_plugin.register()
    assert not is_patched(fake_module.ModelCudaGraphManager)
    assert len(plugin_log.warnings) == 1 and "platform 'oot'" in plugin_log.warnings[0]


@pytest.mark.parametrize("order", ["descending", "ascending", "max-first", "shuffle:1", "shuffle:3"])
def test_allocation_failure_stops_with_a_clear_error_or_is_not_needed(
    order: str, fake_module: Any, mocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allocation is only attempted when vLLM's first buffer is too short; failing it is a clear stop."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    mocker.patch.object(staging, "presized", side_effect=torch.OutOfMemoryError("CUDA out of memory"))
    manager = build(fake_module.ModelCudaGraphManager, sizes=([1, 2, 4, 8, 16], [1, 2, 3]))
    first = policy_order(order, "PIECEWISE", manager._capture_descs[PIECEWISE])[0]
    if first.num_tokens == 16:  # largest first (descending, max-first, shuffle:3): capacity rows already
        manager.capture()
        assert manager.hidden_states.shape == (16, 8)
        return
    with pytest.raises(StagingError, match=rf"allocating hidden_states with 16 rows failed.*{order}"):
        manager.capture()
    assert type(manager) is fake_module.ModelCudaGraphManager  # no half-swapped class left behind


def test_order_requested_but_not_applied_is_said(monkeypatch: pytest.MonkeyPatch, plugin_log: Any) -> None:
    monkeypatch.setitem(sys.modules, MODULE, make_module(None))
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    assert "STAGING_PLUGIN_ORDER=ascending is NOT applied" in plugin_log.warnings[0]


# ---- strict mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["class missing", "attribute renamed", "_capture_descs absent"])
def test_strict_mode_raises_clearly(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = FAULTS[fault]()
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    with pytest.raises(compat.IncompatibleVllm, match=r"vllm-staging-plugin \(strict mode\)"):
        vllm_staging_plugin.register()
        build(module.ModelCudaGraphManager)


def test_strict_allocation_failure_raises(
    fake_module: Any, mocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()
    mocker.patch.object(staging, "presized", side_effect=RuntimeError("boom"))
    manager = build(fake_module.ModelCudaGraphManager)
    ascending(manager)
    failed = r"allocating hidden_states with 8 rows failed \(RuntimeError: boom\)"
    with pytest.raises(StagingError, match=failed):
        manager.capture()


# ---- growth ----------------------------------------------------------------------------------


def test_descriptor_added_after_init_still_fits(fake_module: Any) -> None:
    vllm_staging_plugin.register()
    manager = build(fake_module.ModelCudaGraphManager)
    manager._capture_descs[PIECEWISE].append(descs(PIECEWISE, [16])[0])  # larger than all, last
    manager.capture()
    assert manager.hidden_states.shape[0] == 16


def test_growth_after_capture_regrows_until_graphs_exist(fake_module: Any) -> None:
    vllm_staging_plugin.register()
    manager = build(fake_module.ModelCudaGraphManager)
    manager.capture()
    manager._capture_descs[FULL].insert(0, descs(FULL, [32])[0])
    manager.capture()  # no graph recorded the old buffer: it is replaced at 32 rows
    assert manager.hidden_states.shape[0] == 32
    manager.graphs["captured"] = object()
    manager._capture_descs[FULL].insert(0, descs(FULL, [64])[0])
    with pytest.raises(StagingError, match="replacing them would corrupt those graphs"):
        manager.capture()
    assert manager.hidden_states.shape[0] == 32  # untouched


def test_presized_keeps_dtype_device_and_trailing_shape() -> None:
    from vllm_staging_plugin._engine.staging import presized

    t = torch.zeros(2, 3, 5, dtype=torch.float16)
    grown = presized(t, 7)
    assert (grown.shape, grown.dtype, grown.device) == ((7, 3, 5), torch.float16, t.device)
    assert presized(t, 2) is t
    assert [x.shape[0] for x in presized([t, t], 4)] == [4, 4]


def test_an_unexpected_error_in_the_structure_check_is_one_warning_naming_it(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    def broken(module: Any) -> type:
        raise KeyError("renamed")

    monkeypatch.setattr(compat, "manager_class", broken)
    ManagerPatch(Settings()).install(make_module(fresh_class()))  # never breaks the import of vLLM's module
    assert len(plugin_log.warnings) == 1 and "inactive" in plugin_log.warnings[0]
    assert "KeyError: 'renamed'" in plugin_log.warnings[0]
