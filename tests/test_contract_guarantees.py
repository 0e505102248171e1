"""Guarantees on the real installed vLLM (CPU): replay runs no plugin code, allocation failure stops
clearly under every built-in order, receipts never fail a capture, the V1 runner is reported, and the
plugin's variables reach Ray workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from children.harness import frames_under
from fakes import installed_fix
from release import SIZES_STAGING

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

import vllm_staging_plugin
from vllm_staging_plugin._engine import capture_session, installer, receipts, runner_guard, staging
from vllm_staging_plugin._engine.policies import BuiltinPolicies
from vllm_staging_plugin._offline import cpu_replay, seams
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

pytestmark = pytest.mark.contract
PLUGIN_DIR = str(Path(vllm_staging_plugin.__file__).parent)
SMALL = ReplayConfig(sizes=(1, 2, 4, 8, 16, 24, 32), max_num_seqs=32, hidden_size=64)
BUILTIN_ORDERS = [
    "descending", "ascending", "max-first", "shuffle:1", "full-first", "size-descending", "interleaved"
]  # fmt: skip
LARGEST_FIRST = ("descending", "max-first", "full-first", "size-descending", "interleaved")  # 32 first here
assert {o.partition(":")[0] for o in BUILTIN_ORDERS} == set(BuiltinPolicies.NAMES)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real manager after a patched capture under ``ascending`` (the plugin's buffers in use)."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(SMALL):
        manager = cpu_replay.build_manager(SMALL)
        result = cpu_replay.run_capture(manager, SMALL)
        assert result.ok and result.buffers["hidden_states"]["rows"] == 32
        yield manager


def _plugin_frames(action: Any) -> list[str]:
    """Every function of this package that runs while ``action()`` runs."""
    return frames_under(PLUGIN_DIR, action)


def test_graph_replay_runs_no_plugin_code(captured: Any, mocker: Any) -> None:
    cls = seams.cudagraph_module().ModelCudaGraphManager
    assert type(captured) is cls  # back on vLLM's own class after capture
    assert not any(isinstance(v, staging._StagingSlot) for c in cls.__mro__ for v in vars(c).values())
    desc = next(
        d for d in captured._capture_descs[next(m for m in captured._capture_descs if m.name == "FULL")]
    )
    graph = SimpleNamespace(replay=mocker.Mock())
    captured.graphs[desc] = graph
    out: list[Any] = []
    frames = _plugin_frames(lambda: out.append(captured.run_fullgraph(desc)))  # vLLM's per-step replay
    assert graph.replay.call_count == 1 and out[0].shape[0] == desc.num_tokens
    assert frames == []
    assert _plugin_frames(lambda: captured.hidden_states) == []


def test_the_profiler_sees_plugin_code_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: while a capture runs, vLLM's own assignment of the staging buffer goes
    through the plugin's slot and the profiler sees it; once the capture is over it does not."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(SMALL):
        manager = cpu_replay.build_manager(SMALL)
        results: list[Any] = []
        during = _plugin_frames(lambda: results.append(cpu_replay.run_capture(manager, SMALL)))
    assert results[0].ok and results[0].buffers["hidden_states"]["rows"] == 32
    assert "capture" in during  # the plugin's capture wrapper (the order knob)
    # vLLM's store_capture_output assigned through the slot; vLLM 0.34.0 sizes the buffers itself: no slot
    assert ("__set__" in during) is not SIZES_STAGING
    after = _plugin_frames(lambda: setattr(manager, "hidden_states", manager.hidden_states))
    assert after == []  # the same assignment after capture: vLLM's class, a plain attribute


@pytest.mark.parametrize("order", BUILTIN_ORDERS)
def test_allocation_failure_under_every_builtin_order(
    order: str, monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    """Either no allocation is needed (largest first) or the boot stops with the plugin's clear error,
    never with vLLM's staging shape mismatch."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    mocker.patch.object(staging, "presized", side_effect=torch.OutOfMemoryError("CUDA out of memory"))
    with cpu_replay.cpu_stubs(SMALL):
        manager = cpu_replay.build_manager(SMALL)
        result = cpu_replay.run_capture(manager, SMALL)
    cls = seams.cudagraph_module().ModelCudaGraphManager
    assert type(manager) is cls
    first = result.forwards[0]
    if first == 32 or SIZES_STAGING:  # vLLM 0.34.0 allocates the 32 rows itself, the plugin nothing
        assert result.ok and result.buffers["hidden_states"]["rows"] == 32
    else:
        assert not result.ok and "must match the existing size" not in (result.error or "")
        assert result.error is not None and result.error.startswith("StagingError: vllm-staging-plugin: ")
        assert "allocating hidden_states with 32 rows failed (OutOfMemoryError" in result.error
        assert f"STAGING_PLUGIN_ORDER={order} captures a {first}-row descriptor first" in result.error
    assert (order in LARGEST_FIRST) == (first == 32)


@pytest.mark.parametrize("step", ["_environment", "_finish", "json", "write_receipt"])
def test_receipt_failures_never_fail_the_capture(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    if step == "json":  # serialisation fails inside the atomic write
        monkeypatch.setattr(receipts, "json", SimpleNamespace(dump=_raiser(step)))
    else:
        monkeypatch.setattr(capture_session, step, _raiser(step))
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(SMALL):
        result = cpu_replay.run_capture(cpu_replay.build_manager(SMALL), SMALL)
    assert result.ok and result.buffers["hidden_states"]["rows"] == 32
    assert result.forwards[0] == 1  # the order was still applied
    assert len(plugin_log.warnings) == 1 and "capture is unaffected" in plugin_log.warnings[0]
    assert f"injected failure in {step}" in plugin_log.warnings[0]
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def _raiser(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"injected failure in {name}")

    return fail


def test_receipts_are_written_when_nothing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The injection test above is not vacuous: without a fault a receipt appears."""
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(SMALL):
        assert cpu_replay.run_capture(cpu_replay.build_manager(SMALL), SMALL).ok
    (receipt,) = [json.loads(p.read_text()) for p in tmp_path.glob("receipt-*.json")]
    assert receipt["ok"] and receipt["capacity"] == 32 and "_free_before" not in receipt


# ---- the V1 model runner: the plugin is inactive there, and says so ---------------------------------


@pytest.fixture
def v1_runner_class() -> Iterator[type]:
    module = pytest.importorskip(runner_guard.V1_RUNNER_MODULE)
    cls: type = getattr(module, runner_guard.V1_RUNNER_CLASS)
    original = cls.__dict__["__init__"]
    yield cls
    vllm_staging_plugin.unregister()
    assert cls.__dict__["__init__"] is original


def test_v1_runner_is_reported_once(
    v1_runner_class: type, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    original = v1_runner_class.__dict__["__init__"]
    vllm_staging_plugin.register()  # the module is already imported: guarded at once
    guard = installed_fix("guard")
    assert guard.wrap.saved["__init__"] is original and v1_runner_class.__dict__["__init__"] is not original
    for _ in range(2):
        with pytest.raises(TypeError):  # vLLM's own __init__ runs after the warning (and rejects no args)
            v1_runner_class()
    assert plugin_log.warnings == [guard.message()]
    assert (
        "STAGING_PLUGIN_ORDER=ascending" in plugin_log.warnings[0]
        and "V1 model runner" in plugin_log.warnings[0]
    )


def test_v1_runner_is_an_error_in_strict_mode(v1_runner_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()
    with pytest.raises(runner_guard.V1RunnerError, match="V1 model runner"):
        v1_runner_class()


def test_subclassed_runners_are_not_reported(v1_runner_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()
    sub = type("CPUModelRunnerLike", (v1_runner_class,), {})
    with pytest.raises(TypeError):  # vLLM's __init__ itself, not V1RunnerError
        sub()


# ---- Ray: vLLM's own copy list carries the plugin's variables --------------------------------------


def test_plugin_variables_reach_ray_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.ray.ray_env import get_env_vars_to_copy

    monkeypatch.delenv(installer.RAY_PREFIXES_VARIABLE, raising=False)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    assert "STAGING_PLUGIN_ORDER" not in get_env_vars_to_copy()  # vLLM alone drops it
    vllm_staging_plugin.register()
    assert "STAGING_PLUGIN_ORDER" in get_env_vars_to_copy()
    vllm_staging_plugin.register()  # idempotent
    assert __import__("os").environ[installer.RAY_PREFIXES_VARIABLE] == installer.PLUGIN_PREFIX
    vllm_staging_plugin.unregister()  # the exact inverse: the variable is gone again
    assert installer.RAY_PREFIXES_VARIABLE not in __import__("os").environ


def test_ray_v2_executor_hands_workers_the_whole_driver_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.20+'s RayExecutorV2 (the default from 0.21) copies every driver variable to its workers with
    ``os.environ.setdefault`` (a node's own value wins); the plugin's variables need no forwarding there."""
    ray_env_utils = pytest.importorskip("vllm.v1.executor.ray_env_utils")
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    copied = ray_env_utils.get_driver_env_vars(worker_specific_vars={"CUDA_VISIBLE_DEVICES"})
    assert copied["STAGING_PLUGIN_ORDER"] == "ascending"
    assert "CUDA_VISIBLE_DEVICES" not in copied
