"""The replay itself: the real manager built for a ``ReplayConfig`` and its real ``capture()`` run on CPU,
stock or through a patch of the tool's own; the result, and the behaviour probe built on it."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ... import suspended
from ..._engine.settings import Settings
from ..._engine.staging import staging_buffer_bytes
from ..._engine.staging_fix import StagingFix
from .. import seams
from .config import ReplayConfig, make_vllm_config
from .stand_ins import BlockTables, Model, UbatchRunner

PATCHED = Settings(strict=True)
"""The patched arm's settings unless a tool passes its own: vLLM's order, pre-sizing on, strict (a plugin
that would refuse this vLLM raises instead of leaving it stock), no receipts."""


def stock_in_order(order: str) -> Settings:
    """The patch's settings for stock vLLM captured in ``order``: the plugin's own policy reorders vLLM's
    lists, and presize ``off-allow-crash`` leaves vLLM's lazy staging alone (strict, no receipts)."""
    return Settings(order=order, presize="off-allow-crash", strict=True)


@dataclass
class ReplayResult:
    ok: bool
    error: str | None
    sequence: dict[str, list[int]]
    """``num_tokens`` per mode in the order captured (a patch's order, or vLLM's own)."""
    capacity: int
    buffers: dict[str, dict[str, Any]] = field(default_factory=dict)
    forwards: list[int] = field(default_factory=list)
    """``num_tokens`` of every forward the capture ran, in order (warm-up and capture pass)."""
    conclusive: bool = True
    """The capture ended as a deployment's would: it completed, failed at vLLM's staging copy, or the
    plugin refused; False when the replay itself broke (another error), so it answers nothing."""


def buffers_hold(buffers: dict[str, dict[str, Any]], rows: int) -> bool:
    """Every staging buffer of a replay (``ReplayResult.buffers``, the pre-flight's arms) holds ``rows``."""
    return all(b["rows"] >= rows for b in buffers.values())


STAGING_COPY_ERROR = "must match the existing size"  # torch's words when the staging copy does not fit


def conclusive(exc: BaseException) -> bool:
    """vLLM's staging copy not fitting, or the plugin's own engine refusing: what a GPU capture would do."""
    return (isinstance(exc, RuntimeError) and STAGING_COPY_ERROR in str(exc)) or type(
        exc
    ).__module__.startswith("vllm_staging_plugin._engine")


def features() -> dict[str, bool]:
    """Which descriptor knobs the installed release has, read from its structure (not its version)."""
    return seams.manager_features(seams.cudagraph_module())


@contextlib.contextmanager
def cpu_stubs(cfg: ReplayConfig) -> Iterator[types.ModuleType]:
    """Stub the CUDA-only edges of ``cudagraph_utils`` for the duration of the block."""
    with seams.cpu_capture_edges(cfg.first_pp_rank, cfg.last_pp_rank, cfg.dbo) as module:
        yield module


def build_manager(cfg: ReplayConfig) -> Any:
    """The real ``ModelCudaGraphManager`` for ``cfg`` (call inside :func:`cpu_stubs`)."""
    return seams.new_manager(
        make_vllm_config(cfg), cfg.mode, cfg.decode_query_len, lora_capture_cases=cfg.lora_capture_cases,
        varlen_decode=cfg.varlen_decode, ubatch_runner=UbatchRunner() if cfg.dbo else None,
    )  # fmt: skip


def run_capture(manager: Any, cfg: ReplayConfig) -> ReplayResult:
    """Run the manager's real ``capture()`` (call inside :func:`cpu_stubs`); errors become results."""
    from ..._engine.sizing import capture_sequence, staging_capacity

    plan = seams.capture_plan(manager)
    rows = max(staging_capacity(plan), 1)
    upstream = None
    if not cfg.first_pp_rank:
        upstream = {k: torch.zeros(rows, cfg.hidden_size, dtype=cfg.dtype) for k in cfg.intermediate_keys}
    error, settled = None, True
    model = Model(cfg)
    block_tables = BlockTables() if cfg.dbo else None  # the microbatched capture asks them for dummies
    try:
        seams.capture_on_cpu(manager, model, max_num_seqs=cfg.max_num_seqs, rows=rows, upstream=upstream,
                             aux_hidden_states=cfg.aux_layers > 0, block_tables=block_tables)  # fmt: skip
    except Exception as exc:
        error, settled = f"{type(exc).__name__}: {exc}", conclusive(exc)
    walked = seams.replayed_plan(manager)  # the order captured, a patch's too
    walked = plan if walked is None else walked
    return ReplayResult(
        ok=error is None,
        error=error,
        sequence=capture_sequence(walked),
        capacity=staging_capacity(plan),
        buffers=staging_buffer_bytes(manager),
        forwards=model.forwards,
        conclusive=settled,
    )


@contextlib.contextmanager
def stock_or_patched(patched: bool, settings: Settings = PATCHED) -> Iterator[StagingFix | None]:
    """Run a block with vLLM's manager class wrapped by a staging fix of this tool's own (``settings``), or
    stock. A fix the process registered is suspended for the block: one plugin layer at a time."""
    with suspended():
        if not patched:
            yield None
            return
        fix = StagingFix(settings)
        fix.apply(seams.cudagraph_module().ModelCudaGraphManager)
        try:
            yield fix
        finally:
            fix.uninstall()


def replay(cfg: ReplayConfig, patched: bool, settings: Settings = PATCHED) -> ReplayResult:
    """Build the real manager and run its capture staging, stock or patched (with ``settings``)."""
    with cpu_stubs(cfg), stock_or_patched(patched, settings):
        return run_capture(build_manager(cfg), cfg)


def vllm_sizes_staging() -> bool:
    """Whether the installed vLLM sizes its staging buffers to the largest descriptor itself (by behaviour).

    Stock replay of a small FULL grid captured ascending: vLLM's lazy staging crashes at the second
    size; a vLLM that pre-sizes captures it with every buffer at the largest descriptor's rows.
    """
    cfg = ReplayConfig(mode="FULL", sizes=(1, 2, 4), max_num_seqs=4, hidden_size=8)
    result = replay(cfg, patched=True, settings=stock_in_order("ascending"))
    rows = {buffer["rows"] for buffer in result.buffers.values()}
    return result.ok and rows == {result.capacity}
