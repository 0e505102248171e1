"""The replay itself: the real manager built for a ``ReplayConfig`` and its real ``capture()`` run on CPU,
stock or through a patch of the tool's own; the result, and the behaviour probe built on it."""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._engine.patch import ManagerPatch
from ..._engine.settings import Settings
from ..._engine.staging import staging_buffer_bytes, staging_tensors
from ..._engine.wrapping import ClassWrap
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


Reorder = Callable[[list[Any]], list[Any]]
"""A test harness's order (a permutation no policy expresses, a descriptor added); tools apply an order
through ``Settings`` and the plugin's policies, as an engine does."""


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


def cudagraph_module() -> types.ModuleType:
    import vllm.v1.worker.gpu.cudagraph_utils as module

    return module  # type: ignore[no-any-return]


def features() -> dict[str, bool]:
    """Which descriptor knobs the installed release has, read from its structure (not its version)."""
    return seams.manager_features(cudagraph_module())


@contextlib.contextmanager
def cpu_stubs(cfg: ReplayConfig) -> Iterator[types.ModuleType]:
    """Stub the CUDA-only edges of ``cudagraph_utils`` for the duration of the block."""
    with seams.cpu_capture_edges(cfg.first_pp_rank, cfg.last_pp_rank, cfg.dbo) as module:
        yield module


def build_manager(cfg: ReplayConfig) -> Any:
    """The real ``ModelCudaGraphManager`` for ``cfg`` (call inside :func:`cpu_stubs`)."""
    from vllm.config.compilation import CUDAGraphMode

    cu = cudagraph_module()
    kwargs: dict[str, Any] = {"lora_capture_cases": cfg.lora_capture_cases} if cfg.lora_capture_cases else {}
    if cfg.varlen_decode:
        kwargs["varlen_decode"] = True
    if cfg.dbo:
        kwargs["ubatch_runner"] = UbatchRunner()
    return cu.ModelCudaGraphManager(
        make_vllm_config(cfg), torch.device("cpu"), CUDAGraphMode[cfg.mode], cfg.decode_query_len,
        **kwargs,
    )  # fmt: skip


def run_capture(manager: Any, cfg: ReplayConfig, reorder: Reorder | None = None) -> ReplayResult:
    """Run the manager's real ``capture()`` (call inside :func:`cpu_stubs`); errors become results."""
    from vllm.sequence import IntermediateTensors
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    from ..._engine.sizing import capture_sequence, staging_capacity

    plan = seams.capture_plan(manager)
    if reorder is not None:  # simulate another capture order on stock and patched alike
        for mode, descs in plan.items():
            plan[mode] = reorder(list(descs))
    rows = max(staging_capacity(plan), 1)
    inputs = InputBuffers(cfg.max_num_seqs, rows, torch.device("cpu"))
    upstream = None
    if not cfg.first_pp_rank:
        upstream = IntermediateTensors(
            {k: torch.zeros(rows, cfg.hidden_size, dtype=cfg.dtype) for k in cfg.intermediate_keys}
        )
    model_state = types.SimpleNamespace(prepare_dummy_inputs=lambda num_reqs, num_tokens: {})
    kv_cache_config = KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])
    error = None
    model = Model(cfg)
    available = {
        "model": model, "model_state": model_state, "input_buffers": inputs, "intermediate_tensors": upstream,
        "block_tables": None, "attn_groups": [], "attn_metadata_builders": [], "has_lora": False,
        "kv_cache_config": kv_cache_config, "use_aux_hidden_state_outputs": cfg.aux_layers > 0,
    }  # fmt: skip
    if cfg.dbo:  # the microbatched capture asks the block tables for dummy tables and slot mappings
        available["block_tables"] = BlockTables()
    try:
        manager.capture(**_arguments_for(type(manager).capture, available))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    walked = vars(manager).get(seams.manager.REPLAYED_PLAN, plan)  # the order captured, a patch's too
    return ReplayResult(
        ok=error is None,
        error=error,
        sequence=capture_sequence(walked),
        capacity=staging_capacity(plan),
        buffers=staging_buffer_bytes(manager),
        forwards=model.forwards,
    )


def _arguments_for(method: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``capture`` takes in this release, by name (its signature changed across releases)."""
    params = list(inspect.signature(inspect.unwrap(method)).parameters.values())[1:]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return {p.name: available.get(p.name) for p in named if p.name in available or p.default is p.empty}


@contextlib.contextmanager
def stock_or_patched(patched: bool, settings: Settings = PATCHED) -> Iterator[ManagerPatch | None]:
    """Run a block with the manager class wrapped by a patch of this tool's own (``settings``), or
    guaranteed stock (vLLM's own functions, also when the process's installer patched the class).

    The class gets back exactly what it held, and the process's installer is never touched.
    """
    cls = cudagraph_module().ModelCudaGraphManager
    if patched:
        with ManagerPatch(settings).applied_to(cls) as patch:
            yield patch
        return
    wrap = ClassWrap(cls, ("__init__", "capture"))
    wrap.apply(wrap.stock)
    try:
        yield None
    finally:
        wrap.restore()


def replay(
    cfg: ReplayConfig, patched: bool, reorder: Reorder | None = None, settings: Settings = PATCHED
) -> ReplayResult:
    """Build the real manager and run its capture staging, stock or patched (with ``settings``)."""
    with cpu_stubs(cfg), stock_or_patched(patched, settings):
        return run_capture(build_manager(cfg), cfg, reorder)


def replay_tensors(
    cfg: ReplayConfig, patched: bool, reorder: Reorder | None = None, settings: Settings = PATCHED
) -> tuple[ReplayResult, dict[str, torch.Tensor]]:
    """:func:`replay`, plus the staging tensors themselves (by display name) for byte comparisons."""
    with cpu_stubs(cfg), stock_or_patched(patched, settings):
        manager = build_manager(cfg)
        result = run_capture(manager, cfg, reorder)
    return result, dict(staging_tensors(manager))


def ascending(descs: list[Any]) -> list[Any]:
    return sorted(descs, key=lambda d: d.num_tokens)


def vllm_presizes() -> bool:
    """Whether the installed vLLM sizes its staging buffers to the largest descriptor itself (by behaviour).

    Stock replay of a small FULL grid captured ascending: vLLM's lazy staging crashes at the second
    size; a vLLM that pre-sizes captures it with every buffer at the largest descriptor's rows.
    """
    cfg = ReplayConfig(mode="FULL", sizes=(1, 2, 4), max_num_seqs=4, hidden_size=8)
    result = replay(cfg, patched=True, settings=stock_in_order("ascending"))
    rows = {buffer["rows"] for buffer in result.buffers.values()}
    return result.ok and rows == {result.capacity}
