"""The installer owns every change the plugin makes to a process; ``unregister()`` undoes exactly those."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import pytest
from fakes import FULL, PIECEWISE, config, descs, fresh_class, make_module

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, installer, patch
from vllm_staging_plugin._engine.import_hook import PostImportHook
from vllm_staging_plugin._engine.installer import INSTALLER, RAY_PREFIXES_VARIABLE, V1_RUNNER_MODULE


def plugin_hooks() -> list[str]:
    return [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]


def build(cls: type) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, [1, 2, 4, 8]), FULL: descs(FULL, [1, 2])}
    return cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)


@pytest.fixture
def pending_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither module vLLM would import is loaded yet: both hooks wait."""
    monkeypatch.delitem(sys.modules, compat.CUDAGRAPH_MODULE, raising=False)
    monkeypatch.delitem(sys.modules, V1_RUNNER_MODULE, raising=False)


def test_register_then_unregister_leaves_the_process_as_it_was(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv(RAY_PREFIXES_VARIABLE, "MYCO_")
    meta_path, environ = list(sys.meta_path), dict(os.environ)
    vllm_staging_plugin.register()
    assert sorted(plugin_hooks()) == sorted([compat.CUDAGRAPH_MODULE, V1_RUNNER_MODULE])
    assert os.environ[RAY_PREFIXES_VARIABLE] == "MYCO_,STAGING_PLUGIN_"
    vllm_staging_plugin.unregister()
    assert sys.meta_path == meta_path and dict(os.environ) == environ
    assert not INSTALLER.classes


def test_a_hook_leaves_sys_meta_path_when_it_fires(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    vllm_staging_plugin.register()
    hook = next(
        f for f in sys.meta_path if isinstance(f, PostImportHook) and f.fullname == compat.CUDAGRAPH_MODULE
    )
    module = make_module(fresh_class())
    hook.fire(module)  # what the hooked loader does once vLLM's module body ran
    assert compat.CUDAGRAPH_MODULE not in plugin_hooks() and patch.is_patched(module.ModelCudaGraphManager)
    build(module.ModelCudaGraphManager)  # a V2 manager: the V1 guard will never be needed here
    assert plugin_hooks() == []


def test_a_v1_runner_takes_the_patch_hook_away(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import ModuleType

    vllm_staging_plugin.register()
    v1 = ModuleType(V1_RUNNER_MODULE)
    v1.GPUModelRunner = type("GPUModelRunner", (), {"__init__": lambda self: None})  # type: ignore[attr-defined]
    next(f for f in sys.meta_path if isinstance(f, PostImportHook) and f.fullname == V1_RUNNER_MODULE).fire(
        v1
    )
    v1.GPUModelRunner()  # vLLM chose V1 in this worker: no manager will ever be built
    assert plugin_hooks() == []
    vllm_staging_plugin.unregister()
    assert "__init__" in v1.GPUModelRunner.__dict__ and v1.GPUModelRunner not in INSTALLER.classes


def test_unwrap_leaves_a_foreign_wrapper_and_makes_its_own_a_pass_through(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    cls = fresh_class()
    monkeypatch.setitem(sys.modules, compat.CUDAGRAPH_MODULE, make_module(cls))
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    vllm_staging_plugin.register()
    ours = cls.__dict__["capture"]

    @functools.wraps(ours)
    def theirs(self: Any, *args: Any, **kwargs: Any) -> Any:  # another tool instruments after us
        return ours(self, *args, **kwargs)

    cls.capture = theirs  # type: ignore[attr-defined]
    vllm_staging_plugin.unregister()
    assert cls.__dict__["capture"] is theirs  # not ours to remove
    assert cls.__dict__["__init__"] is not ours and "__init__" in cls.__dict__  # ours restored
    assert len(plugin_log.warnings) == 1 and "wrapped by another tool" in plugin_log.warnings[0]
    manager = build(cls)
    manager._capture_descs[PIECEWISE].sort(key=lambda d: d.num_tokens)
    with pytest.raises(RuntimeError, match="must match the existing size"):  # our wrapper passes through
        manager.capture()
    vllm_staging_plugin.register()  # wrapping again is possible and takes effect
    assert installer.INSTALLER.classes


def test_disabled_registers_nothing_but_the_ray_prefix(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_DISABLE", "1")
    monkeypatch.delenv(RAY_PREFIXES_VARIABLE, raising=False)
    vllm_staging_plugin.register()
    assert plugin_hooks() == [] and not INSTALLER.classes
    assert os.environ[RAY_PREFIXES_VARIABLE] == "STAGING_PLUGIN_"  # Ray actors must see the kill switch
    vllm_staging_plugin.unregister()
    assert RAY_PREFIXES_VARIABLE not in os.environ
