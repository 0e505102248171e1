"""Drive the real installed ``ModelCudaGraphManager.capture`` staging code on a machine without a GPU.

Only the CUDA-specific edges are stubbed (the PP group, the graph pool, attention-input preparation,
the forward context and the base class's ``torch.cuda.graph`` loop, replaced by a loop that runs each
descriptor's warm-up and capture forwards in the stored order; ``tests/test_contract_replay_loop.py`` pins
that loop to vLLM's own on every supported release). ``store_capture_output`` -- the code that crashes --
is vLLM's own. Used by the CLI's main job, the pre-flight, the atlas and the contract tests.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._engine.patch import ManagerPatch
from .._engine.settings import Settings
from .._engine.staging import staging_buffer_bytes, staging_tensors
from .._engine.wrapping import ClassWrap
from . import seams

PATCHED = Settings(strict=True)
"""The patched arm's settings unless a tool passes its own: vLLM's order, pre-sizing on, strict (a plugin
that would refuse this vLLM raises instead of leaving it stock), no receipts."""


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
    # Descriptor knobs of later releases (atlas, property tests); off by default.
    use_kda_recoverssm: bool = False  # cache_config.use_kda_recoverssm (0.30+): PIECEWISE capped at decode
    varlen_decode: bool = False  # adaptive verification's varlen FULL decode graphs (0.28+)
    dbo: bool = False  # dual-batch overlap: a ubatch runner, so FULL descriptors get microbatch twins (0.30+)
    dbo_decode_token_threshold: int = 32  # parallel_config.dbo_decode_token_threshold (vLLM's default)
    speculative_schedule: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative decoding's (first batch size, last, draft tokens) tiers: the dense decode
    schedule (0.26+); ``decode_query_len - 1`` is the configured number of speculative tokens."""
    output: str = "zeros"  # "pattern": rows depend on (num_tokens, row, column), so contents can be compared


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
    if cfg.use_kda_recoverssm:
        vllm_config.cache_config.use_kda_recoverssm = True
    if cfg.speculative_schedule is not None:
        vllm_config.speculative_config = speculative_config(
            cfg.decode_query_len - 1, cfg.speculative_schedule
        )
    if cfg.dbo:
        parallel.enable_dbo = True
        parallel.dbo_decode_token_threshold = cfg.dbo_decode_token_threshold
    return vllm_config


def speculative_config(
    num_speculative_tokens: int, schedule: Sequence[tuple[int, int, int]] | None = None
) -> Any:
    """A real n-gram ``SpeculativeConfig`` (needs no draft model), with a dynamic schedule if given."""
    from vllm.config import SpeculativeConfig

    extra = {"num_speculative_tokens_per_batch_size": [tuple(t) for t in schedule]} if schedule else {}
    return SpeculativeConfig(
        method="ngram", num_speculative_tokens=num_speculative_tokens, prompt_lookup_max=2, **extra
    )


def derived_capture_sizes(
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    schedule: Sequence[tuple[int, int, int]] | None = None,
    max_cudagraph_capture_size: int | None = None,
    max_num_batched_tokens: int = 8192,
) -> list[int]:
    """The capture grid vLLM derives itself (``VllmConfig._set_cudagraph_sizes``, no explicit sizes).

    Runs vLLM's own code on a real ``VllmConfig``; only the model config is a stand-in (the grid reads
    nothing from it but ``enforce_eager``). The platform is CPU, so the default ceiling is 512 (as on
    Hopper; data-centre Blackwell uses 1024).
    """
    from vllm.config.compilation import CUDAGraphMode

    vllm_config = make_vllm_config(ReplayConfig(sizes=(1,)))
    if num_speculative_tokens:
        vllm_config.speculative_config = speculative_config(num_speculative_tokens, schedule)
    vllm_config.scheduler_config.max_num_seqs = max_num_seqs
    vllm_config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    compilation = vllm_config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    compilation.cudagraph_capture_sizes = None
    compilation.max_cudagraph_capture_size = max_cudagraph_capture_size
    vllm_config.model_config = types.SimpleNamespace(enforce_eager=False)
    return seams.derive_capture_sizes(vllm_config)


def features() -> dict[str, bool]:
    """Which descriptor knobs the installed release has, read from its structure (not its version)."""
    return seams.manager_features(cudagraph_module())


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
        if cfg.output == "pattern":
            if not cfg.last_pp_rank:
                return IntermediateTensors(
                    {k: _pattern(n, cfg, i) for i, k in enumerate(cfg.intermediate_keys)}
                )
            if cfg.aux_layers:
                return _pattern(n, cfg, 0), [_pattern(n, cfg, i + 1) for i in range(cfg.aux_layers)]
            return _pattern(n, cfg, 0)
        hidden = torch.zeros(n, cfg.hidden_size, dtype=cfg.dtype)
        if not cfg.last_pp_rank:
            return IntermediateTensors({k: hidden.clone() for k in cfg.intermediate_keys})
        if cfg.aux_layers:
            return hidden, [hidden.clone() for _ in range(cfg.aux_layers)]
        return hidden


def _pattern(n: int, cfg: ReplayConfig, salt: int) -> torch.Tensor:
    """Small integers (exact in every float dtype) that differ per forward size, row, column and output."""
    values = torch.arange(n * cfg.hidden_size).reshape(n, cfg.hidden_size) + 7 * n + 31 * salt
    return (values % 97).to(cfg.dtype)


@contextlib.contextmanager
def cpu_stubs(cfg: ReplayConfig) -> Iterator[types.ModuleType]:
    """Stub the CUDA-only edges of ``cudagraph_utils`` for the duration of the block."""
    with seams.cpu_capture_edges(cfg.first_pp_rank, cfg.last_pp_rank, cfg.dbo) as module:
        yield module


class _FakeUbatchRunner:
    """DBO's runner without threads or streams: the microbatched forward runs the model once."""

    capture_stream = None

    def prepare(self, *args: Any, **kwargs: Any) -> None:
        return None

    def begin_capturable_run(
        self, model: Any, model_inputs: dict[str, Any], state: Any, **kwargs: Any
    ) -> Callable[[], Any]:
        return lambda: model(**model_inputs)

    def abort_pending_run(self) -> None:
        return None


class _FakeBlockTables:
    def get_dummy_block_tables(self, num_reqs: int) -> None:
        return None

    def get_dummy_slot_mappings(self, num_tokens: int) -> None:
        return None


def build_manager(cfg: ReplayConfig) -> Any:
    """The real ``ModelCudaGraphManager`` for ``cfg`` (call inside :func:`cpu_stubs`)."""
    from vllm.config.compilation import CUDAGraphMode

    cu = cudagraph_module()
    kwargs: dict[str, Any] = {"lora_capture_cases": cfg.lora_capture_cases} if cfg.lora_capture_cases else {}
    if cfg.varlen_decode:
        kwargs["varlen_decode"] = True
    if cfg.dbo:
        kwargs["ubatch_runner"] = _FakeUbatchRunner()
    return cu.ModelCudaGraphManager(
        make_vllm_config(cfg), torch.device("cpu"), CUDAGraphMode[cfg.mode], cfg.decode_query_len,
        **kwargs,
    )  # fmt: skip


def run_capture(manager: Any, cfg: ReplayConfig, reorder: Reorder | None = None) -> ReplayResult:
    """Run the manager's real ``capture()`` (call inside :func:`cpu_stubs`); errors become results."""
    from vllm.sequence import IntermediateTensors
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    from .._engine.sizing import capture_sequence, staging_capacity

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
    model = _FakeModel(cfg)
    available = {
        "model": model, "model_state": model_state, "input_buffers": inputs, "intermediate_tensors": upstream,
        "block_tables": None, "attn_groups": [], "attn_metadata_builders": [], "has_lora": False,
        "kv_cache_config": kv_cache_config, "use_aux_hidden_state_outputs": cfg.aux_layers > 0,
    }  # fmt: skip
    if cfg.dbo:  # the microbatched capture asks the block tables for dummy tables and slot mappings
        available["block_tables"] = _FakeBlockTables()
    try:
        manager.capture(**_arguments_for(type(manager).capture, available))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return ReplayResult(
        ok=error is None,
        error=error,
        sequence=capture_sequence(plan),
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
    result = replay(cfg, patched=False, reorder=ascending)
    rows = {buffer["rows"] for buffer in result.buffers.values()}
    return result.ok and rows == {result.capacity}
