"""Around one capture, only when ``STAGING_PLUGIN_RECEIPTS_DIR`` is set: the receipt and what it measures.

The CUDA-only fields are checked with a fake ``torch.cuda`` seen by capture_session alone: on a CPU machine
they are None, so without a fake device the arithmetic that fills them (graph memory as a free-memory drop,
the graph pool's bytes from the allocator snapshot, the driver through NVML, vLLM's profiling estimate)
would go unchecked. The receipt-directory faults run on the fake manager: a receipt never fails a capture.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import FULL, PIECEWISE, build, descs, install_fake_module
from stable import assert_says

import vllm_staging_plugin
from vllm_staging_plugin._engine import capture_session, receipts
from vllm_staging_plugin._offline import cpu_replay, receipt_reader

SMALL = cpu_replay.ReplayConfig(sizes=(1, 2, 4, 8), max_num_seqs=8, hidden_size=16)
POOL = (0, 7)
MIB = 1 << 20


class FakeCuda:
    """Free memory drops by ``step`` at every reading; the snapshot mixes our pool with others."""

    def __init__(self, free: int = 900 * MIB, step: int = 96 * MIB) -> None:
        self.free, self.step, self.synchronized = free, step, 0

    def is_available(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synchronized += 1

    def mem_get_info(self) -> tuple[int, int]:
        free, self.free = self.free, self.free - self.step
        return free, 1000 * MIB

    def get_device_name(self, device: Any) -> str:
        return f"Fake GPU on {device}"

    def memory_snapshot(self) -> list[dict[str, Any]]:
        return [
            {"segment_pool_id": POOL, "total_size": 20 * MIB, "active_size": 2 * MIB},
            {"segment_pool_id": (0, 0), "total_size": 500 * MIB, "active_size": 400 * MIB},
            {"segment_pool_id": POOL, "total_size": 6 * MIB, "active_size": 0},
            {"total_size": 1 * MIB, "active_size": 1 * MIB},  # no pool id
        ]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    # vLLM first, with the real NVML: its platform detection at import would call the fake one
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    cuda = FakeCuda()
    fake_torch = types.SimpleNamespace(
        cuda=cuda,
        version=types.SimpleNamespace(cuda="13.0"),
        __version__=torch.__version__,
        distributed=torch.distributed,
    )
    monkeypatch.setattr(capture_session, "torch", fake_torch)
    nvml = types.SimpleNamespace(
        calls=[],
        nvmlInit=lambda: nvml.calls.append("init"),
        nvmlSystemGetDriverVersion=lambda: b"580.159.04",
        nvmlShutdown=lambda: nvml.calls.append("shutdown"),
    )
    monkeypatch.setitem(sys.modules, "vllm.third_party.pynvml", nvml)
    monkeypatch.setattr(sys.modules["vllm.third_party"], "pynvml", nvml, raising=False)
    cuda.nvml = nvml  # type: ignore[attr-defined]
    return cuda


def capture_receipts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **attrs: Any) -> list[dict[str, Any]]:
    """One capture of the real manager (CPU replay), patched by the process's installer."""
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(SMALL):
        manager = cpu_replay.build_manager(SMALL)
        manager.pool = POOL
        for key, value in attrs.items():
            setattr(manager, key, value)
        assert cpu_replay.run_capture(manager, SMALL).ok
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("receipt-*.json"))]


@pytest.mark.contract
def test_capture_receipt_reads_the_device(
    fake_cuda: FakeCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    (receipt,) = capture_receipts(tmp_path, monkeypatch)
    assert receipt["gpu_name"] == "Fake GPU on cpu"
    assert receipt["cuda_version"] == "13.0" and receipt["torch_version"] == torch.__version__
    assert receipt["driver_version"] == "580.159.04" and fake_cuda.nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert receipt["graph_memory_bytes"] == 96 * MIB  # free before minus free after
    assert fake_cuda.synchronized == 2  # before and after the capture
    assert receipt["graph_pool_reserved_bytes"] == 26 * MIB  # our pool's segments only
    assert receipt["graph_pool_active_bytes"] == 2 * MIB
    assert receipt["profiling_estimate_bytes"] is None and receipt["kind"] == "capture"
    assert receipt["rank"] == 3 and receipt["policy"] == "ascending"
    assert receipt["captured_sequence"] == {"FULL": [1, 2, 4, 8], "PIECEWISE": [1, 2, 4, 8]}


@pytest.mark.contract
def test_profiling_receipt_recomputes_vllms_estimate(
    fake_cuda: FakeCuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extrapolate = pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")._extrapolate_full_graph_memory
    samples = [30 * MIB, 10 * MIB]
    (receipt,) = capture_receipts(
        tmp_path, monkeypatch, _max_full_descs_to_capture=2, _capture_mem_samples=samples
    )
    n_full = 4  # FULL descriptors 8, 4, 2, 1
    expected = 96 * MIB - sum(samples) + extrapolate(samples, n_full)
    assert (
        receipt["kind"] == "profiling" and receipt["policy"] == "descending"
    )  # profiling keeps vLLM's order
    assert receipt["captured_sequence"]["FULL"] == [8, 4]  # cut to the profiling pass's two FULL graphs
    assert receipt["profiling_estimate_bytes"] == expected > 0


@pytest.mark.parametrize(
    ("pool", "snapshot", "expected"),
    [
        (None, None, (None, None)),
        (POOL, "raise", (None, None)),
        ((9, 9), None, (0, 0)),  # a pool with no segment yet
    ],
)
def test_pool_bytes_edges(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch, pool: Any, snapshot: Any, expected: Any
) -> None:
    if snapshot == "raise":
        monkeypatch.setattr(fake_cuda, "memory_snapshot", lambda: (_ for _ in ()).throw(RuntimeError("no")))
    assert capture_session._pool_bytes(pool) == expected


def test_driver_version_as_text_and_on_nvml_failure(
    fake_cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_cuda.nvml  # type: ignore[attr-defined]
    monkeypatch.setattr(nvml, "nvmlSystemGetDriverVersion", lambda: "575.1")
    assert capture_session._driver_version() == "575.1"

    def broken() -> None:
        raise RuntimeError("NVML not found")

    monkeypatch.setattr(nvml, "nvmlInit", broken)
    assert capture_session._driver_version() is None


def test_without_cuda_every_device_field_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda()
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    monkeypatch.setattr(
        capture_session, "torch", types.SimpleNamespace(cuda=cuda, distributed=torch.distributed)
    )
    assert capture_session._free_memory() is None and cuda.synchronized == 0
    assert capture_session._driver_version() is None
    assert capture_session._pool_bytes(POOL) == (None, None)


def test_rank_comes_from_the_process_group_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 5)
    monkeypatch.setattr(capture_session, "torch", types.SimpleNamespace(distributed=group))
    monkeypatch.setenv("RANK", "1")
    assert capture_session._rank() == 5
    group.is_initialized = lambda: False
    assert capture_session._rank() == 1
    monkeypatch.delenv("RANK")
    assert capture_session._rank() == 0


def test_a_guarded_step_that_fails_is_one_warning_naming_the_step_and_the_error(plugin_log: Any) -> None:
    def step(x: int) -> int:
        raise KeyError(x)

    assert capture_session._guarded("do the thing", step, 7) is None
    (warning,) = plugin_log.warnings
    assert_says(
        warning, "vllm-staging-plugin: could not do the thing", "capture is unaffected", end="KeyError(7)"
    )
    assert capture_session._guarded("add", lambda a: a + 1, 1) == 2


def _stub_manager(**extra: Any) -> Any:
    model = types.SimpleNamespace(architectures=["FakeForCausalLM", "Other"], get_hidden_size=lambda: 24.0)
    config = types.SimpleNamespace(
        model_config=model, compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=[1, 2])
    )
    manager = types.SimpleNamespace(
        vllm_config=config,
        cudagraph_mode=types.SimpleNamespace(name="FULL_AND_PIECEWISE"),
        device="cpu",
        is_last_pp_rank=False,
        **extra,
    )
    return manager


def _state(order: str = "descending", agreed: int | None = None) -> Any:
    from vllm_staging_plugin._engine.settings import Settings
    from vllm_staging_plugin._engine.staging import ManagerState

    return ManagerState(Settings(order=order), capacity=2, ranks_agreed=agreed)


def test_environment_fields_from_the_manager(fake_cuda: FakeCuda) -> None:
    env = capture_session._environment(_stub_manager(), _state("ascending", 2), profiling=False)
    assert env["architecture"] == "FakeForCausalLM" and env["hidden_size"] == 24
    assert isinstance(env["hidden_size"], int)
    assert env["cudagraph_mode"] == "FULL_AND_PIECEWISE" and env["capture_sizes"] == [1, 2]
    assert env["is_last_pp_rank"] is False and env["ranks_agreed"] == 2
    assert env["policy"] == env["requested_policy"] == "ascending"
    bare = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(cudagraph_capture_sizes=None)
        ),
        cudagraph_mode="PIECEWISE",
        device="cpu",
    )
    env = capture_session._environment(bare, _state(), profiling=True)
    assert env["architecture"] is None and env["hidden_size"] is None and env["capture_sizes"] == []
    assert (
        env["cudagraph_mode"] == "PIECEWISE"
        and env["is_last_pp_rank"] is True
        and env["ranks_agreed"] is None
    )
    assert env["policy"] == "descending"


def _descs(*tokens: int) -> list[Any]:
    return [types.SimpleNamespace(num_tokens=n) for n in tokens]


def test_finish_cuts_full_only_for_profiling_and_tolerates_missing_readings(fake_cuda: FakeCuda) -> None:
    CUDAGraphMode = pytest.importorskip("vllm.config.compilation").CUDAGraphMode

    captured = {CUDAGraphMode.FULL: _descs(8, 4, 2)}
    manager = types.SimpleNamespace(
        _max_full_descs_to_capture=2, _capture_mem_samples=[1, 1], _capture_descs=captured
    )
    receipt = capture_session._finish({}, None, manager, 1.5, profiling=False)  # type: ignore[typeddict-item]
    assert receipt["captured_sequence"] == {"FULL": [8, 4, 2]}  # the real capture is never cut
    assert receipt["profiling_estimate_bytes"] is None  # only profiling receipts carry vLLM's estimate
    assert receipt["graph_memory_bytes"] is None  # no reading before the capture: no difference
    plain = types.SimpleNamespace(_capture_descs=captured)
    receipt = capture_session._finish({}, 10 * MIB, plain, 0.5, profiling=True)  # type: ignore[typeddict-item]
    assert receipt["captured_sequence"] == {"FULL": [8, 4, 2]}  # no limit known: nothing cut
    assert receipt["profiling_estimate_bytes"] is None  # no samples on this manager
    assert receipt["capture_seconds"] == 0.5


def test_finish_estimate_only_when_profiling_even_with_a_reading(fake_cuda: FakeCuda) -> None:
    CUDAGraphMode = pytest.importorskip("vllm.config.compilation").CUDAGraphMode

    captured = {CUDAGraphMode.FULL: _descs(8, 4)}
    manager = types.SimpleNamespace(_capture_mem_samples=[3 * MIB, 1 * MIB], _capture_descs=captured)
    receipt = capture_session._finish({}, 500 * MIB, manager, 1.234567, profiling=False)  # type: ignore[typeddict-item]
    assert receipt["graph_memory_bytes"] is not None and receipt["profiling_estimate_bytes"] is None
    assert receipt["capture_seconds"] == 1.2346  # rounded to 0.1 ms


def test_hidden_size_that_cannot_be_read_is_none(fake_cuda: FakeCuda) -> None:
    def unreadable() -> int:
        raise ValueError("exotic config")

    manager = _stub_manager()
    manager.vllm_config.model_config.get_hidden_size = unreadable
    assert capture_session._environment(manager, _state(), profiling=False)["hidden_size"] is None


# ---- vLLM's profiling estimate, recomputed for profiling receipts ------------------------------------


def _profiled(full: int, samples: list[int] | None) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, [1, 2, 4]), FULL: descs(FULL, list(range(1, full + 1)))}
    return types.SimpleNamespace(_capture_descs=capture_descs, _capture_mem_samples=samples)


def test_profiling_estimate_is_vllms_extrapolation_over_this_window() -> None:
    """measured - sampled + first sample + (FULL descriptors - 1) x max(second sample, 1 MiB), as vLLM's
    _extrapolate_full_graph_memory computes it (0.29+); written out here so a wrong term is seen."""
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    estimate = capture_session._profiling_estimate
    assert estimate(_profiled(full=5, samples=[64 * MIB, 8 * MIB]), 100 * MIB) == (
        100 * MIB - 72 * MIB + 64 * MIB + 4 * 8 * MIB
    )
    small_second = _profiled(full=3, samples=[64 * MIB, 1024])  # per-graph floor of 1 MiB
    assert estimate(small_second, 70 * MIB) == 70 * MIB - 64 * MIB - 1024 + 64 * MIB + 2 * MIB
    no_full = types.SimpleNamespace(
        _capture_descs={PIECEWISE: descs(PIECEWISE, [1])}, _capture_mem_samples=[5 * MIB, 2 * MIB]
    )
    assert estimate(no_full, 9 * MIB) == 9 * MIB - 7 * MIB + 5 * MIB - 2 * MIB  # (0 - 1) x 2 MiB
    unnamed = types.SimpleNamespace(  # keys without a name count no FULL descriptor instead of failing
        _capture_descs={"FULL": descs(FULL, [4])}, _capture_mem_samples=[5 * MIB, 2 * MIB]
    )
    assert estimate(unnamed, 9 * MIB) == estimate(no_full, 9 * MIB)
    assert estimate(_profiled(full=2, samples=[2 * MIB, 2 * MIB]), 0) == 0  # never negative
    assert estimate(_profiled(full=2, samples=None), 10 * MIB) is None  # not a profiling pass
    assert estimate(_profiled(full=2, samples=[MIB]), None) is None  # no CUDA: nothing measured


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
    module = install_fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(directory))
    vllm_staging_plugin.register()
    manager = build(module.ModelCudaGraphManager)
    assert manager.capture() == [1, 2, 4, 8, 1, 2]  # the order applied, every descriptor captured
    assert manager.hidden_states.shape == (8, 8)
    assert len(plugin_log.warnings) == 1, plugin_log.warnings
    assert "could not write the receipt (the capture is unaffected)" in plugin_log.warnings[0]
    assert message in plugin_log.warnings[0]
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "file"]
    assert leftovers == []  # neither a receipt nor a temporary file


def test_receipt_directory_without_faults_gets_one_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault tests above are not vacuous: the same capture, undisturbed, writes its receipt."""
    module = install_fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path / "receipts"))
    vllm_staging_plugin.register()
    build(module.ModelCudaGraphManager).capture()
    (receipt,) = receipt_reader.read_receipts(tmp_path)
    assert receipt["captured_sequence"] == {"PIECEWISE": [1, 2, 4, 8], "FULL": [1, 2]}
    assert receipt["capacity"] == 8 and receipt["kind"] == "capture" and receipt["ok"] is True


def test_a_failed_capture_writes_a_receipt_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = install_fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", "off-allow-crash")  # the stock crash, on purpose
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    vllm_staging_plugin.register()
    with pytest.raises(RuntimeError, match="must match the existing size") as caught:
        build(module.ModelCudaGraphManager).capture()
    (receipt,) = receipt_reader.read_receipts(tmp_path)
    assert receipt["ok"] is False and receipt["error"] == f"RuntimeError: {caught.value}"
