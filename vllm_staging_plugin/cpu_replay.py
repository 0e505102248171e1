"""Drive the real installed ``ModelCudaGraphManager.capture`` staging code on a machine without a GPU.

Only the CUDA-specific edges are stubbed (the PP group, the graph pool, attention-input preparation,
the forward context and the base class's ``torch.cuda.graph`` loop, replaced by a loop that runs each
descriptor's warm-up and capture forwards in the stored order). ``store_capture_output`` -- the code
that crashes -- is vLLM's own. Used by the CLI's main job and by the contract tests.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import patch as staging_patch


def default_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's default capture grid: 1, 2, 4, multiples of 8 below 256, then multiples of 16."""
    grid = (1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16))
    return tuple(n for n in grid if n <= max_size)


DEFAULT_SIZES = default_sizes(512)
Reorder = Callable[[list[Any]], list[Any]]


@dataclass
class ReplayConfig:
    mode: str = "FULL_AND_PIECEWISE"
    sizes: Sequence[int] = DEFAULT_SIZES
    max_num_seqs: int = 128
    decode_query_len: int = 1
    hidden_size: int = 4096  # Qwen3-8B shape
    dtype: torch.dtype = torch.bfloat16
    aux_layers: int = 0  # > 0: EAGLE3-style aux hidden-state outputs
    last_pp_rank: bool = True  # False: non-last pipeline rank, IntermediateTensors staging
    first_pp_rank: bool = True  # False: the rank receives IntermediateTensors from the previous one
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    intermediate_keys: tuple[str, ...] = ("hidden_states", "residual")
    lora_capture_cases: list[int] | None = None


@dataclass
class ReplayResult:
    ok: bool
    error: str | None
    sequence: dict[str, list[int]]
    capacity: int
    buffers: dict[str, dict[str, Any]] = field(default_factory=dict)
    forwards: list[int] = field(default_factory=list)
    """``num_tokens`` of every forward the capture ran, in order (warm-up and capture pass)."""


def cudagraph_module() -> types.ModuleType:
    import vllm.v1.worker.gpu.cudagraph_utils as module

    return module  # type: ignore[no-any-return]


def make_vllm_config(cfg: ReplayConfig) -> Any:
    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    vllm_config = VllmConfig(compilation_config=CompilationConfig(), device_config=DeviceConfig(device="cpu"))
    vllm_config.scheduler_config.max_num_seqs = cfg.max_num_seqs
    parallel = vllm_config.parallel_config
    parallel.tensor_parallel_size = cfg.tensor_parallel_size
    parallel.pipeline_parallel_size = cfg.pipeline_parallel_size
    parallel.data_parallel_size = cfg.data_parallel_size
    # On CPU, VllmConfig's post-init forces mode NONE and clears the sizes: set them afterwards.
    compilation = vllm_config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode[cfg.mode]
    compilation.cudagraph_capture_sizes = sorted(cfg.sizes)
    compilation.max_cudagraph_capture_size = max(cfg.sizes) if cfg.sizes else 0
    compilation.post_init_cudagraph_sizes()
    return vllm_config


class _FakeModel(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, cfg: ReplayConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.forwards: list[int] = []

    def forward(self, input_ids: Any = None, positions: torch.Tensor | None = None, **_: Any) -> Any:
        from vllm.sequence import IntermediateTensors

        assert positions is not None
        n, cfg = positions.shape[0], self.cfg
        self.forwards.append(n)
        hidden = torch.zeros(n, cfg.hidden_size, dtype=cfg.dtype)
        if not cfg.last_pp_rank:
            return IntermediateTensors({k: hidden.clone() for k in cfg.intermediate_keys})
        if cfg.aux_layers:
            return hidden, [hidden.clone() for _ in range(cfg.aux_layers)]
        return hidden


@contextlib.contextmanager
def cpu_stubs(cfg: ReplayConfig) -> Iterator[types.ModuleType]:
    """Stub the CUDA-only edges of ``cudagraph_utils`` for the duration of the block."""
    from vllm.config.compilation import CUDAGraphMode

    cu = cudagraph_module()
    pp_group = types.SimpleNamespace(is_first_rank=cfg.first_pp_rank, is_last_rank=cfg.last_pp_rank)

    def stored_order_capture(
        self: Any, create_forward_fn: Any, progress_bar_desc: str = ""
    ) -> dict[Any, Any]:
        takes_warmup = "warmup" in inspect.signature(create_forward_fn).parameters  # 0.19+

        def forward(desc: Any, warmup: bool) -> None:
            made = create_forward_fn(desc, warmup=warmup) if takes_warmup else create_forward_fn(desc)
            # 0.24-0.27 return (forward_fn, attention_state); others return forward_fn
            (made[0] if isinstance(made, tuple) else made)(CUDAGraphMode.NONE)

        limit = getattr(self, "_max_full_descs_to_capture", None)  # profiling hook, 0.29+
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            descs = self._capture_descs.get(mode, [])
            if mode == CUDAGraphMode.FULL and limit is not None:
                descs = descs[:limit]
            for desc in descs:
                forward(desc, warmup=True)
                forward(desc, warmup=False)
        self._graphs_captured = True
        return {}

    platform_cls = type(cu.current_platform)
    replacements: list[tuple[Any, str, Any]] = [
        (cu, "get_pp_group", lambda: pp_group),
        (cu, "prepare_inputs_to_capture", lambda *a, **k: (None, {})),
        (cu, "set_forward_context", lambda *a, **k: contextlib.nullcontext()),
        (cu, "has_compiled_submodule", lambda model: True),
        (cu.CudaGraphManager, "capture", stored_order_capture),
        (platform_cls, "_global_graph_pool", ("cpu-replay-pool",)),
    ]
    saved = [(obj, name, obj.__dict__.get(name, _MISSING)) for obj, name, _ in replacements]
    try:
        for obj, name, value in replacements:
            setattr(obj, name, value)
        yield cu
    finally:
        for obj, name, old in saved:
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


def build_manager(cfg: ReplayConfig) -> Any:
    """The real ``ModelCudaGraphManager`` for ``cfg`` (call inside :func:`cpu_stubs`)."""
    from vllm.config.compilation import CUDAGraphMode

    cu = cudagraph_module()
    kwargs = {"lora_capture_cases": cfg.lora_capture_cases} if cfg.lora_capture_cases else {}
    return cu.ModelCudaGraphManager(
        make_vllm_config(cfg), torch.device("cpu"), CUDAGraphMode[cfg.mode], cfg.decode_query_len,
        **kwargs,
    )  # fmt: skip


def run_capture(manager: Any, cfg: ReplayConfig, reorder: Reorder | None = None) -> ReplayResult:
    """Run the manager's real ``capture()`` (call inside :func:`cpu_stubs`); errors become results."""
    from vllm.sequence import IntermediateTensors
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    from .capture_session import staging_buffer_bytes
    from .sizing import capture_sequence, staging_capacity

    if reorder is not None:  # simulate another capture order on stock and patched alike
        for mode, descs in manager._capture_descs.items():
            manager._capture_descs[mode] = reorder(list(descs))
    rows = max(staging_capacity(manager._capture_descs), 1)
    inputs = InputBuffers(cfg.max_num_seqs, rows, torch.device("cpu"))
    upstream = None
    if not cfg.first_pp_rank:
        upstream = IntermediateTensors(
            {k: torch.zeros(rows, cfg.hidden_size, dtype=cfg.dtype) for k in cfg.intermediate_keys}
        )
    model_state = types.SimpleNamespace(prepare_dummy_inputs=lambda num_reqs, num_tokens: {})
    kv_cache_config = KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])
    error = None
    model = _FakeModel(cfg)
    available = {
        "model": model, "model_state": model_state, "input_buffers": inputs, "intermediate_tensors": upstream,
        "block_tables": None, "attn_groups": [], "attn_metadata_builders": [], "has_lora": False,
        "kv_cache_config": kv_cache_config, "use_aux_hidden_state_outputs": cfg.aux_layers > 0,
    }  # fmt: skip
    try:
        manager.capture(**_arguments_for(type(manager).capture, available))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return ReplayResult(
        ok=error is None,
        error=error,
        sequence=capture_sequence(manager._capture_descs),
        capacity=staging_capacity(manager._capture_descs),
        buffers=staging_buffer_bytes(manager),
        forwards=model.forwards,
    )


def _arguments_for(method: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``capture`` takes in this release, by name (its signature changed across releases)."""
    params = list(inspect.signature(inspect.unwrap(method)).parameters.values())[1:]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return {p.name: available.get(p.name) for p in named if p.name in available or p.default is p.empty}


@contextlib.contextmanager
def stock_or_patched(patched: bool) -> Iterator[None]:
    """Run a block with the manager class patched, or guaranteed stock, restoring it after."""
    cls = cudagraph_module().ModelCudaGraphManager
    was_patched = staging_patch.is_patched(cls)
    if patched:
        staging_patch.patch(cls)
    else:
        staging_patch.unpatch(cls)
    try:
        yield
    finally:
        (staging_patch.patch if was_patched else staging_patch.unpatch)(cls)


def replay(cfg: ReplayConfig, patched: bool, reorder: Reorder | None = None) -> ReplayResult:
    """Build the real manager and run its capture staging, stock or patched."""
    with cpu_stubs(cfg), stock_or_patched(patched):
        return run_capture(build_manager(cfg), cfg, reorder)


def ascending(descs: list[Any]) -> list[Any]:
    return sorted(descs, key=lambda d: d.num_tokens)
