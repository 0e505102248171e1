"""Injected faults not covered elsewhere (docs/testing.md, "Fault injection", lists every row and its test).

Each test states what the engine does (boots stock with one warning / refuses with a named error / keeps
working) and checks that nothing is left half-done: no patched class, no hook, no stray file.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fakes import FULL, PIECEWISE, FakeManager, config, descs, fresh_class, make_module

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, installer, patch, policies, receipts, staging
from vllm_staging_plugin._engine.import_hook import PostImportHook
from vllm_staging_plugin._engine.policies import PolicyError
from vllm_staging_plugin._engine.settings import ConfigError
from vllm_staging_plugin._offline import receipt_reader

MODULE = compat.CUDAGRAPH_MODULE


def hooks() -> list[str]:
    return [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]


def build(cls: type, full: list[int] | None = None) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, [1, 2, 4, 8]), FULL: descs(FULL, full or [1, 2])}
    return cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)


def install(monkeypatch: pytest.MonkeyPatch, cls: type) -> Any:
    module = make_module(cls)
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    return module


# ---- a bad value in each STAGING_PLUGIN_* variable: register() refuses, naming variable and values ---

BAD_VALUES = {
    "STAGING_PLUGIN_DISABLE": ({"STAGING_PLUGIN_DISABLE": "maybe"}, "allowed values: 0, false, no, off, 1"),
    "STAGING_PLUGIN_STRICT": ({"STAGING_PLUGIN_STRICT": "2"}, "allowed values: 0, false, no, off, 1"),
    "STAGING_PLUGIN_ORDER": (
        {"STAGING_PLUGIN_ORDER": "fastest"},
        "allowed values: descending, ascending, max-first, shuffle:SEED",
    ),
    "STAGING_PLUGIN_ORDER argument": (
        {"STAGING_PLUGIN_ORDER": "shuffle:x"},
        "shuffle needs an integer seed, as in shuffle:1 (got 'x'); allowed values: descending,",
    ),
    "STAGING_PLUGIN_PRESIZE": (
        {"STAGING_PLUGIN_PRESIZE": "half"},
        "allowed values: on, off, off-allow-crash",
    ),
    "STAGING_PLUGIN_PRESIZE=off with an order": (
        {"STAGING_PLUGIN_PRESIZE": "off", "STAGING_PLUGIN_ORDER": "ascending"},
        "Allowed: STAGING_PLUGIN_PRESIZE=on, or STAGING_PLUGIN_PRESIZE=off-allow-crash",
    ),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_variable_value_refuses_at_register(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env, allowed = BAD_VALUES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(installer.RAY_PREFIXES_VARIABLE, raising=False)
    variable = case.split()[0].split("=")[0]
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    with pytest.raises(ConfigError) as caught:
        vllm_staging_plugin.register()
    text = str(caught.value)
    assert text.startswith(f"{variable}=") or f" {variable}=" in text, text
    assert allowed in text
    assert MODULE not in hooks()  # nothing half-registered: no import hook ...
    assert installer.RAY_PREFIXES_VARIABLE not in os.environ  # ... and no Ray forwarding


def test_vllms_plugin_loader_passes_the_refusal_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own loader (what every engine process runs at start-up) does not swallow the ConfigError."""
    plugins = pytest.importorskip("vllm.plugins")
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_staging_plugin")
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", "half")
    with pytest.raises(ConfigError, match="STAGING_PLUGIN_PRESIZE='half'; allowed values: on, off"):
        plugins.load_general_plugins()


def test_receipts_dir_accepts_any_path_at_register(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STAGING_PLUGIN_RECEIPTS_DIR has no bad value at start-up: a path that cannot be written is a warning
    at capture (see the receipt-directory tests below), never a refused boot."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(blocker / "receipts"))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    vllm_staging_plugin.register()
    assert MODULE in hooks()


# ---- structure the patch relies on, changed upstream: stock with one warning -------------------------


def _init_then(change: Any) -> Any:
    @functools.wraps(FakeManager.__init__)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        FakeManager.__init__(self, *args, **kwargs)
        change(self)

    return __init__


STRUCTURE_FAULTS = {
    "_capture_descs not a dict": _init_then(
        lambda m: setattr(m, "_capture_descs", list(m._capture_descs.values()))
    ),
    "num_tokens not an integer": _init_then(
        lambda m: m._capture_descs.update({FULL: [SimpleNamespace(num_tokens=2.0)]})
    ),
    "num_tokens missing": _init_then(lambda m: m._capture_descs.update({FULL: [SimpleNamespace(tokens=2)]})),
    "hidden_states pre-filled": _init_then(lambda m: setattr(m, "hidden_states", torch.zeros(8, 8))),
    "aux_hidden_states pre-filled": _init_then(
        lambda m: setattr(m, "aux_hidden_states", [torch.zeros(8, 8)])
    ),
    "intermediate_tensors pre-filled": _init_then(lambda m: setattr(m, "intermediate_tensors", {})),
}


@pytest.mark.parametrize("fault", list(STRUCTURE_FAULTS))
def test_changed_structure_leaves_a_stock_manager_and_one_warning(
    fault: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    def capture_stock(self: Any) -> list[int]:  # vLLM's own capture of whatever __init__ left
        return [] if not isinstance(self._capture_descs, dict) else FakeManager.capture(self)

    module = install(monkeypatch, fresh_class(__init__=STRUCTURE_FAULTS[fault], capture=capture_stock))
    cls = module.ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    assert patch.is_patched(cls)  # the class looked right; the built manager does not
    first = build(cls)
    assert not patch.is_patched(cls) and type(first) is cls  # back to stock for this and later managers
    assert staging.state_of(first) is None
    if "num_tokens" not in fault:
        first.capture()  # the manager works as stock vLLM's
    build(cls)  # a second manager: no second warning
    assert len(plugin_log.warnings) == 1, plugin_log.warnings
    warning = plugin_log.warnings[0]
    assert (
        "vllm-staging-plugin is inactive" in warning
        and "STAGING_PLUGIN_ORDER=ascending is NOT applied" in warning
    )
    expected = {
        "_capture_descs not a dict": "_capture_descs is missing or not a dict",
        "num_tokens not an integer": "have no integer num_tokens",
        "num_tokens missing": "have no integer num_tokens",
    }.get(fault, f"{fault.split()[0]} starts as ")
    assert expected in warning


@pytest.mark.parametrize("fault", ["_capture_descs not a dict", "hidden_states pre-filled"])
def test_changed_structure_is_an_error_in_strict_mode(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = install(monkeypatch, fresh_class(__init__=STRUCTURE_FAULTS[fault]))
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()
    with pytest.raises(
        compat.IncompatibleVllm, match=r"^vllm-staging-plugin \(strict mode\): IncompatibleVllm: "
    ):
        build(module.ModelCudaGraphManager)
    assert not patch.is_patched(module.ModelCudaGraphManager)


# ---- order policies: a non-permutation stops the capture; a broken package is skipped -----------------


class _Policies:
    from vllm_staging_plugin.hookspecs import hookimpl

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["dropper", "duplicator"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        if policy == "dropper":
            return list(descriptors)[1:]
        if policy == "duplicator":  # same length, not the same objects
            return [descriptors[0], *descriptors[:-1]] if descriptors else []
        return None


@pytest.fixture
def bad_policies() -> Iterator[None]:
    pm = policies.plugin_manager()
    pm.register(_Policies(), name="bad-policies")
    yield
    pm.unregister(name="bad-policies")


@pytest.mark.parametrize("policy", ["dropper", "duplicator"])
def test_policy_returning_a_non_permutation_stops_the_capture(
    policy: str, bad_policies: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = install(monkeypatch, fresh_class())
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", policy)
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    vllm_staging_plugin.register()  # on no descriptors the policy looks fine: validation passes
    manager = build(module.ModelCudaGraphManager)
    stock_descs = {mode: list(d) for mode, d in manager._capture_descs.items()}
    with pytest.raises(
        PolicyError, match=rf"order policy '{policy}' returned \d descriptors that are not a permutation"
    ):
        manager.capture()
    assert manager.hidden_states is None  # nothing captured, nothing allocated
    assert manager._capture_descs == stock_descs and type(manager) is module.ModelCudaGraphManager
    assert list(tmp_path.iterdir()) == []  # no receipt of a capture that never started


class _EntryPoint:
    def __init__(self, name: str, value: str, loaded: Any) -> None:
        self.name, self.value, self._loaded = name, value, loaded

    def load(self) -> Any:
        if isinstance(self._loaded, Exception):
            raise self._loaded
        return self._loaded


@pytest.fixture
def broken_policy_package(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    found = [
        _EntryPoint("broken", "no_such_module", ModuleNotFoundError("No module named 'no_such_module'")),
        _EntryPoint("good", "good_policies", _Policies()),
    ]
    monkeypatch.setattr(
        policies, "entry_points", lambda group: found if group == policies.ENTRY_POINT_GROUP else []
    )
    policies.plugin_manager.cache_clear()
    yield
    policies.plugin_manager.cache_clear()


def test_policy_package_failing_to_import_is_skipped_with_one_warning(
    broken_policy_package: None, plugin_log: Any
) -> None:
    names = policies.policy_names()
    assert "dropper" in names and "descending" in names  # the good package and the built-ins still load
    assert plugin_log.warnings == [
        "vllm-staging-plugin: order-policy entry point 'broken' (no_such_module) failed to load and is "
        "skipped: No module named 'no_such_module'"
    ]


def test_policy_package_failing_to_import_is_an_error_in_strict_mode(
    broken_policy_package: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        policies.policy_names()


# ---- receipts: unwritable or full directory -> one warning, the capture goes on, nothing half-written --


def _disk_full(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _permission_denied(*args: Any, **kwargs: Any) -> Any:
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


RECEIPT_FAULTS = {
    "disk full at fsync": ("os.fsync", _disk_full, "No space left on device"),
    "disk full at write": ("json.dump", _disk_full, "No space left on device"),
    "directory unwritable": ("tempfile.mkstemp", _permission_denied, "Permission denied"),
    "path under a file": (None, None, "Not a directory"),
}


@pytest.mark.parametrize("fault", list(RECEIPT_FAULTS))
def test_receipt_directory_faults_never_fail_the_capture(
    fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    target, replacement, message = RECEIPT_FAULTS[fault]
    directory = tmp_path / "receipts"
    if target is None:
        (tmp_path / "file").write_text("")
        directory = tmp_path / "file" / "receipts"
    else:
        module_name, attr = target.split(".")
        monkeypatch.setattr(getattr(receipts, module_name), attr, replacement)
    module = install(monkeypatch, fresh_class())
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(directory))
    vllm_staging_plugin.register()
    manager = build(module.ModelCudaGraphManager)
    assert manager.capture() == [1, 2, 4, 8, 1, 2]  # the order applied, every descriptor captured
    assert manager.hidden_states.shape == (8, 8)
    assert (
        len(plugin_log.warnings) == 1
        and "could not write the receipt (the capture is unaffected)" in (plugin_log.warnings[0])
    )
    assert message in plugin_log.warnings[0]
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "file"]
    assert leftovers == []  # neither a receipt nor a temporary file


def test_receipt_directory_without_faults_gets_one_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault tests above are not vacuous: the same capture, undisturbed, writes its receipt."""
    module = install(monkeypatch, fresh_class())
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path / "receipts"))
    vllm_staging_plugin.register()
    build(module.ModelCudaGraphManager).capture()
    (receipt,) = receipt_reader.read_receipts(tmp_path)
    assert (
        receipt["captured_sequence"] == {"PIECEWISE": [1, 2, 4, 8], "FULL": [1, 2]}
        and receipt["capacity"] == 8
    )


# ---- unregister() after managers were built: they keep working, as stock ---------------------------


def test_unregister_after_managers_were_built(monkeypatch: pytest.MonkeyPatch, plugin_log: Any) -> None:
    module = install(monkeypatch, fresh_class())
    cls = module.ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    captured, fresh = build(cls), build(cls)
    captured.capture()
    assert captured.hidden_states.shape == (8, 8)
    vllm_staging_plugin.unregister()
    assert not patch.is_patched(cls) and MODULE not in hooks()
    assert captured.hidden_states.shape == (8, 8) and type(captured) is cls  # its buffers stay valid
    assert fresh.capture() == [8, 4, 2, 1, 2, 1]  # built patched, captured stock: vLLM's order, lazy staging
    assert fresh.hidden_states.shape == (8, 8)
    assert type(build(cls)) is cls and plugin_log.warnings == []
    vllm_staging_plugin.register()  # and it can come back
    assert patch.is_patched(cls)
