"""Around one ``ModelCudaGraphManager.capture`` call, only when ``STAGING_PLUGIN_RECEIPTS_DIR`` is set:
measure the capture and write its receipt. A receipt never takes the capture down: every step is guarded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from . import compat, plugin_version
from .receipts import SCHEMA, Receipt, ReceiptStart, write_receipt
from .settings import DEFAULT_ORDER
from .sizing import capture_sequence, captured_modes, staging_capacity
from .staging import ManagerState, staging_buffer_bytes

logger = logging.getLogger("vllm.staging_plugin")
_T = TypeVar("_T")


@contextmanager
def receipt_session(manager: Any, state: ManagerState, profiling: bool) -> Iterator[None]:
    """Measure the capture in the block and write its receipt to the settings' receipts directory."""
    directory = state.settings.receipts_dir
    assert directory is not None
    started_receipt = _guarded("start the receipt", _start_receipt, manager, state, profiling)
    started = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        if started_receipt is not None:
            started_receipt[0]["ok"] = False
            started_receipt[0]["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        seconds = time.perf_counter() - started
        if started_receipt is not None:
            receipt, free_before = started_receipt
            done = _guarded("finish the receipt", _finish, receipt, free_before, manager, seconds, profiling)
            if done is not None:  # an unfinished receipt is not written
                _guarded("write the receipt", write_receipt, directory, done)


def _guarded(what: str, step: Callable[..., _T], *args: Any) -> _T | None:
    """A receipt must never take the capture down: any failure is one warning, and the capture goes on."""
    try:
        return step(*args)
    except Exception as exc:
        logger.warning("vllm-staging-plugin: could not %s (the capture is unaffected): %r", what, exc)
        return None


def _start_receipt(manager: Any, state: ManagerState, profiling: bool) -> tuple[ReceiptStart, int | None]:
    return _environment(manager, state, profiling), _free_memory()


def _free_memory() -> int | None:
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def _environment(manager: Any, state: ManagerState, profiling: bool) -> ReceiptStart:
    settings = state.settings
    config = manager.vllm_config
    model = getattr(config, "model_config", None)
    try:
        hidden_size: int | None = int(model.get_hidden_size()) if model is not None else None
    except Exception:
        hidden_size = None
    architectures = getattr(model, "architectures", None) or [None]
    versions = compat.installed_versions()
    return {
        "schema": SCHEMA,
        "kind": "profiling" if profiling else "capture",
        "ok": True,
        "error": None,
        "plugin_version": plugin_version(),
        "vllm_version": versions["vllm"],
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "gpu_name": torch.cuda.get_device_name(manager.device) if torch.cuda.is_available() else None,
        "driver_version": _driver_version(),
        "architecture": architectures[0],
        "hidden_size": hidden_size,
        "cudagraph_mode": str(getattr(manager.cudagraph_mode, "name", manager.cudagraph_mode)),
        "capture_sizes": list(config.compilation_config.cudagraph_capture_sizes or []),
        "policy": DEFAULT_ORDER if profiling else settings.order,
        "requested_policy": settings.order,
        "presize": settings.presize,
        "vllm_sizes_staging": state.vllm_sizes_staging,  # vLLM sizes the buffers itself: presize is moot
        "rank": _rank(),
        "ranks_agreed": state.ranks_agreed,
        "is_last_pp_rank": bool(getattr(manager, "is_last_pp_rank", True)),
        "pid": os.getpid(),
    }


def _finish(
    start: ReceiptStart, free_before: int | None, manager: Any, seconds: float, profiling: bool
) -> Receipt:
    captured = compat.capture_descs(manager)  # this capture's lists, in the order it ran them
    sequence, modes = capture_sequence(captured), captured_modes(captured)
    limit = compat.profiling_limit(manager)  # main samples otherwise: recorded as captured
    if profiling and limit is not None and "FULL" in sequence:  # vLLM's order: one list per mode
        sequence["FULL"] = sequence["FULL"][:limit]
        modes = [name for name, tokens in sequence.items() for _ in tokens]
    free_after = _free_memory()
    graph_memory = free_before - free_after if free_before is not None and free_after is not None else None
    reserved, active = _pool_bytes(getattr(manager, "pool", None))
    return {
        **start,
        "captured_sequence": sequence,
        "captured_modes": modes,
        "capacity": staging_capacity(captured),
        "staging_bytes": staging_buffer_bytes(manager),
        "capture_seconds": round(seconds, 4),
        "graph_memory_bytes": graph_memory,
        "graph_pool_reserved_bytes": reserved,
        "graph_pool_active_bytes": active,
        "profiling_estimate_bytes": _profiling_estimate(manager, graph_memory) if profiling else None,
        "created_unix": time.time(),
    }


def _pool_bytes(pool: Any) -> tuple[int | None, int | None]:
    """Bytes the graph pool's segments reserve and the bytes its live blocks use (fragmentation)."""
    if pool is None or not torch.cuda.is_available():
        return None, None
    try:
        segments = [
            s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool)
        ]
    except Exception:
        return None, None
    return sum(int(s["total_size"]) for s in segments), sum(int(s["active_size"]) for s in segments)


def _profiling_estimate(manager: Any, measured: int | None) -> int | None:
    """vLLM's estimate, recomputed from this capture's window: measured - samples + extrapolation."""
    samples, extrapolate = compat.profiling_deltas(manager), compat.full_graph_extrapolation()
    if measured is None or samples is None or extrapolate is None:
        return None
    try:
        plan = compat.capture_descs(manager)
        full = [k for k in plan if getattr(k, "name", "") == "FULL"]
        n_full = len(plan[full[0]]) if full else 0
        return max(int(measured - sum(samples) + extrapolate(samples, n_full)), 0)
    except Exception:
        return None


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


def _driver_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    try:
        from vllm.third_party import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None
