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
from ..._engine.settings import DEFAULT_ORDER, Settings
from ..._engine.sizing import capture_sequence, mode_rank, staging_capacity
from ..._engine.staging import staging_buffer_bytes
from ..._engine.staging_fix import StagingFix
from .. import seams
from .config import ReplayConfig, make_vllm_config
from .stand_ins import BlockTables, Model, UbatchRunner


def arm_settings(order: str = DEFAULT_ORDER, stock: bool = False, kda_fix: str = "on") -> Settings:
    """The settings of a replayed arm: ``order`` through the plugin's own policy path, strict (a plugin that
    would refuse this vLLM raises instead of leaving it stock), no receipts. ``stock``: presize
    ``off-allow-crash``, so vLLM's lazy staging runs in that order as it would unpatched."""
    return Settings(order=order, presize="off-allow-crash" if stock else "on", strict=True, kda_fix=kda_fix)


PATCHED = arm_settings()
"""The patched arm in vLLM's own order, unless a tool passes other settings."""


@dataclass
class ReplayResult:
    """One replayed capture (stock or patched): what it captured, its buffers, and vLLM's own plan."""

    ok: bool
    error: str | None
    sequence: dict[str, list[int]]
    """``num_tokens`` per list in the order walked (a policy's order, or vLLM's own), every descriptor."""
    capacity: int
    buffers: dict[str, dict[str, Any]] = field(default_factory=dict)
    forwards: list[int] = field(default_factory=list)
    """``num_tokens`` of every forward the capture ran, in order (warm-up and capture pass)."""
    conclusive: bool = True
    """The capture ended as a deployment's would: it completed, failed at vLLM's staging copy, or the
    plugin refused; False when the replay itself broke (another error), so it answers nothing."""
    plan: dict[str, list[int]] = field(default_factory=dict)
    """vLLM's own capture plan, before any policy."""
    captured: dict[str, list[int]] = field(default_factory=dict)
    """The descriptors whose forwards ran, in order: up to the one that failed."""
    allocated_by: str | None = None  # the descriptor whose output vLLM's lazy staging sized from
    failed_at: str | None = None  # the descriptor whose forward raised

    @property
    def crashed(self) -> bool:
        """The capture failed as a deployment's would (vLLM's staging copy, or the plugin refusing), not
        because the replay itself broke."""
        return not self.ok and self.conclusive

    def holds(self, rows: int) -> bool:
        """The capture completed and every staging buffer it left holds ``rows``."""
        return self.ok and all(b["rows"] >= rows for b in self.buffers.values())


STAGING_COPY_ERROR = "must match the existing size"  # torch's words when the staging copy does not fit


def conclusive(exc: BaseException) -> bool:
    """vLLM's staging copy not fitting, or the plugin's own engine refusing: what a GPU capture would do."""
    return (isinstance(exc, RuntimeError) and STAGING_COPY_ERROR in str(exc)) or type(
        exc
    ).__module__.startswith("vllm_staging_plugin._engine")


@contextlib.contextmanager
def cpu_stubs(cfg: ReplayConfig) -> Iterator[types.ModuleType]:
    """Stub the CUDA-only edges of ``cudagraph_utils`` for the duration of the block."""
    with seams.cpu_capture_edges(cfg.first_pp_rank, cfg.last_pp_rank, cfg.dbo) as module:
        yield module


def build_manager(cfg: ReplayConfig, vllm_config: Any = None) -> Any:
    """The real ``ModelCudaGraphManager`` for ``cfg`` (call inside :func:`cpu_stubs`), from ``vllm_config``
    (a deployment's, in the pre-flight) or else the one built for ``cfg``."""
    return seams.new_manager(
        make_vllm_config(cfg) if vllm_config is None else vllm_config,
        cfg.mode,
        cfg.decode_query_len,
        lora_capture_cases=cfg.lora_capture_cases,
        varlen_decode=cfg.varlen_decode,
        ubatch_runner=UbatchRunner() if cfg.dbo else None,
    )


def run_capture(manager: Any, cfg: ReplayConfig) -> ReplayResult:
    """Run the manager's real ``capture()`` (call inside :func:`cpu_stubs`); errors become results."""
    plan = seams.capture_plan(manager)
    rows = max(staging_capacity(plan), 1)
    vllms = capture_sequence(plan)  # vLLM's own order, before a policy reorders the lists
    upstream = None
    if not cfg.first_pp_rank:
        upstream = {k: torch.zeros(rows, cfg.hidden_size, dtype=cfg.dtype) for k in cfg.intermediate_keys}
    error, settled = None, True
    model = Model(cfg)
    block_tables = BlockTables() if cfg.dbo else None  # the microbatched capture asks them for dummies
    try:
        seams.capture_on_cpu(
            manager,
            model,
            max_num_seqs=cfg.max_num_seqs,
            rows=rows,
            upstream=upstream,
            aux_hidden_states=cfg.aux_layers > 0,
            block_tables=block_tables,
        )
    except Exception as exc:
        error, settled = f"{type(exc).__name__}: {exc}", conclusive(exc)
    walked = seams.replayed_plan(manager)  # the order captured, a patch's too
    walked = plan if walked is None else walked
    ran = _ran(model.forwards, walked)
    lists: dict[Any, list[Any]] = {}
    for key, _, desc in ran:
        lists.setdefault(key, []).append(desc)
    return ReplayResult(
        ok=error is None,
        error=error,
        sequence=capture_sequence(walked),
        capacity=staging_capacity(plan),
        buffers=staging_buffer_bytes(manager),
        forwards=model.forwards,
        conclusive=settled,
        plan=vllms,
        captured=capture_sequence(lists),
        allocated_by=_describe(*ran[0][1:]) if ran else None,  # vLLM's lazy staging sizes from it
        failed_at=_describe(*ran[-1][1:]) if ran and error is not None else None,
    )


def _ran(forwards: list[int], walked: dict[Any, list[Any]]) -> list[tuple[Any, Any, Any]]:
    """(list key, mode, descriptor) of each descriptor the capture ran, in order: the loop walks the lists
    PIECEWISE first, each descriptor in its own mode, two forwards each (warm-up, capture)."""
    flat = [
        (key, getattr(d, "cg_mode", key), d) for key in sorted(walked, key=mode_rank) for d in walked[key]
    ]
    return flat[: len(forwards[::2])]


def _describe(mode: Any, desc: Any) -> str:
    parts = [f"{getattr(mode, 'name', mode)} num_tokens={desc.num_tokens}"]
    if getattr(desc, "uniform_token_count", None):
        parts.append(f"uniform decode {desc.num_reqs} x {desc.uniform_token_count}")
    if getattr(desc, "num_active_loras", 0):
        parts.append(f"{desc.num_active_loras} LoRAs")
    if getattr(desc, "num_ubatches", 1) > 1:
        parts.append(f"{desc.num_ubatches} micro-batches")
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


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


def replay(
    cfg: ReplayConfig, patched: bool, settings: Settings = PATCHED, vllm_config: Any = None
) -> ReplayResult:
    """The one replay: build the real manager (:func:`build_manager`) and run its capture staging on CPU,
    stock or patched with ``settings``."""
    with cpu_stubs(cfg), stock_or_patched(patched, settings):
        return run_capture(build_manager(cfg, vllm_config), cfg)


def vllm_sizes_staging() -> bool:
    """Whether the installed vLLM sizes its staging buffers to the largest descriptor itself (by behaviour).

    Stock replay of a small FULL grid captured ascending: vLLM's lazy staging crashes at the second
    size; a vLLM that pre-sizes captures it with every buffer at the largest descriptor's rows.
    """
    cfg = ReplayConfig(mode="FULL", sizes=(1, 2, 4), max_num_seqs=4, hidden_size=8)
    result = replay(cfg, patched=True, settings=arm_settings("ascending", stock=True))
    rows = {buffer["rows"] for buffer in result.buffers.values()}
    return result.ok and rows == {result.capacity}
