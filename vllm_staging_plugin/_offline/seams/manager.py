"""Seams into Model Runner V2's CUDA-graph manager (``vllm/v1/worker/gpu/cudagraph_utils.py``): its module,
how the runner builds it and calls its capture, what the runner hands it, its capture plan and knobs, and
the graph pool its platform hands it."""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..._engine import compat
from ..internal import SeamChanged
from ..scoped import attributes


def cudagraph_module() -> types.ModuleType:
    """Model Runner V2's CUDA-graph module, the one the engine patches."""
    import vllm.v1.worker.gpu.cudagraph_utils as module

    return module  # type: ignore[no-any-return]


def new_manager(
    vllm_config: Any,
    cudagraph_mode: str,
    decode_query_len: int,
    *,
    lora_capture_cases: list[int] | None = None,
    varlen_decode: bool = False,
    ubatch_runner: Any = None,
) -> Any:
    """A ``ModelCudaGraphManager`` on CPU, built as Model Runner V2 builds it (inside
    :func:`cpu_capture_edges`). Private: the constructor's parameters, one of ``compat.SHAPES``; its knobs
    go only when set, and one the release lacks raises vLLM's TypeError."""
    import torch
    from vllm.config.compilation import CUDAGraphMode

    knobs: dict[str, Any] = {
        "lora_capture_cases": lora_capture_cases,
        "varlen_decode": varlen_decode or None,
        "ubatch_runner": ubatch_runner,
    }
    cls = cudagraph_module().ModelCudaGraphManager
    decode: Any = decode_query_len
    if "decode_query_lens" in compat.release_shape(cls).init_prefix:
        decode = vllm_config.get_decode_cudagraph_query_lens(decode_query_len)
    return cls(
        vllm_config,
        torch.device("cpu"),
        CUDAGraphMode[cudagraph_mode],
        decode,
        **{name: value for name, value in knobs.items() if value},
    )


def capture_on_cpu(
    manager: Any,
    model: Any,
    *,
    max_num_seqs: int,
    rows: int,
    upstream: dict[str, Any] | None = None,
    aux_hidden_states: bool = False,
    block_tables: Any = None,
) -> None:
    """Run the manager's own ``capture()`` (inside :func:`cpu_capture_edges`) with what Model Runner V2
    hands it, built on CPU (``upstream``: the intermediate tensors a rank after the first receives).
    Privates: ``capture``'s parameters (:func:`capture_arguments`), ``InputBuffers``, ``KVCacheConfig`` and
    ``IntermediateTensors``; one moved or re-signed raises, and the replay reports that error."""
    import torch
    from vllm.sequence import IntermediateTensors
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    available = {
        "model": model,
        "model_state": types.SimpleNamespace(prepare_dummy_inputs=lambda num_reqs, num_tokens: {}),
        "input_buffers": InputBuffers(max_num_seqs, rows, torch.device("cpu")),
        "intermediate_tensors": None if upstream is None else IntermediateTensors(upstream),
        "block_tables": block_tables,
        "attn_groups": [],
        "has_lora": False,
        "kv_cache_config": KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]),
        "use_aux_hidden_state_outputs": aux_hidden_states,
    }
    manager.capture(**capture_arguments(type(manager).capture, available))


def capture_arguments(capture: Any, available: dict[str, Any]) -> dict[str, Any]:
    """The arguments this release's ``capture`` takes, by name, from ``available``; a required one
    ``available`` lacks raises ``SeamChanged`` naming it."""
    params = list(inspect.signature(inspect.unwrap(capture)).parameters.values())[1:]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [p.name for p in named if p.default is p.empty and p.name not in available]
    if unknown:
        raise SeamChanged(
            f"ModelCudaGraphManager.capture requires {', '.join(unknown)}, unknown to the CPU replay"
        )
    return {p.name: available[p.name] for p in named if p.name in available}


@contextlib.contextmanager
def graph_pool_stub(platform: Any, pool: Any) -> Iterator[None]:
    """For the block, ``platform.get_global_graph_pool()`` returns ``pool`` without CUDA. Private: the
    platform class's ``_global_graph_pool`` cache; a getter that stops reading it asks CUDA, and the replay
    reports the failed build."""
    with attributes(type(platform), {"_global_graph_pool": pool}):
        yield


capture_plan = compat.capture_descs
"""The manager's capture plan, mode -> descriptors in capture order: the engine's door, whose check every
replayed manager passes."""


REPLAYED_PLAN = "_cpu_replay_plan"
"""The manager attribute where the CPU capture loop leaves the plan it walked (the order it captured)."""


def replayed_plan(manager: Any) -> dict[Any, list[Any]] | None:
    """The plan :func:`cpu_capture_edges`' loop walked on ``manager``, or None before a capture."""
    return vars(manager).get(REPLAYED_PLAN)  # type: ignore[no-any-return]


@contextlib.contextmanager
def cpu_capture_edges(first_pp_rank: bool, last_pp_rank: bool, dbo: bool) -> Iterator[types.ModuleType]:
    """For the block, ``cudagraph_utils`` runs on CPU: its CUDA edges are stubs, and
    ``CudaGraphManager.capture`` runs each descriptor's forwards eagerly in vLLM's order instead of recording
    graphs, leaving the plan it walked on the manager. Yields the module. Privates: the module-level names
    replaced below, ``CudaGraphManager.capture`` and ``_graphs_captured`` (the profiling limit:
    the engine's door); a renamed one leaves vLLM's own running, a replay-loop contract test catches."""
    from vllm.config.compilation import CUDAGraphMode

    cu = cudagraph_module()
    pp_group = types.SimpleNamespace(is_first_rank=first_pp_rank, is_last_rank=last_pp_rank)

    def stored_order_capture(
        self: Any, create_forward_fn: Any, progress_bar_desc: str = ""
    ) -> dict[Any, Any]:
        takes_warmup = "warmup" in inspect.signature(create_forward_fn).parameters

        def forward(desc: Any, warmup: bool) -> None:
            made = create_forward_fn(desc, warmup=warmup) if takes_warmup else create_forward_fn(desc)
            # some releases return (forward_fn, attention_state), others forward_fn
            (made[0] if isinstance(made, tuple) else made)(CUDAGraphMode.NONE)

        limit = compat.profiling_limit(self)  # the profiling pass's limit
        plan = vars(self)[REPLAYED_PLAN] = capture_plan(self)  # a patch may have swapped in its order
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            descs = plan.get(mode, [])
            if mode == CUDAGraphMode.FULL and limit is not None:
                descs = descs[:limit]
            for desc in descs:
                forward(desc, warmup=True)
                forward(desc, warmup=False)
        self._graphs_captured = True
        return {}

    replacements: list[tuple[Any, str, Any]] = [
        (cu, "get_pp_group", lambda: pp_group),
        (cu, "prepare_inputs_to_capture", lambda *a, **k: (None, {})),
        (cu, "set_forward_context", lambda *a, **k: contextlib.nullcontext()),
        (cu, "has_compiled_submodule", lambda model: True),
        (cu.CudaGraphManager, "capture", stored_order_capture),
    ]
    if dbo:  # the microbatched capture path prepares a dummy batch and DCP context (CUDA edges)
        replacements += [
            (cu, name, lambda *a, **k: None) for name in ("set_dcp_capture_context",) if hasattr(cu, name)
        ]
        replacements.append((cu, "InputBatch", types.SimpleNamespace(make_dummy=lambda *a, **k: None)))
    with contextlib.ExitStack() as stack:
        stack.enter_context(graph_pool_stub(cu.current_platform, ("cpu-replay-pool",)))
        for obj, name, value in replacements:
            stack.enter_context(attributes(obj, {name: value}))
        yield cu


@dataclass
class ManagerInputs:
    """What Model Runner V2 passes to ``ModelCudaGraphManager`` and what the staging copy writes."""

    cudagraph_mode: str
    decode_query_len: int
    lora_capture_cases: list[int]
    varlen_decode: bool
    hidden_size: int
    dtype: Any
    aux_layers: int
    dbo: bool = False
    notes: list[str] = field(default_factory=list)


def manager_inputs(vllm_config: Any) -> ManagerInputs:
    """What Model Runner V2 hands the manager at its birth, computed as the runner does; what needs the
    loaded model is taken at its usual value and listed in ``notes``. Internals:
    ``resolve_cudagraph_mode_and_sizes``, ``get_lora_capture_cases`` and the draft's auxiliary-state
    questions; one renamed raises and the pre-flight reports it, except the auxiliary layer count, which
    falls back to the draft's layer ids, else 3."""
    import vllm.envs as envs
    from vllm.config.compilation import CompilationMode
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    notes: list[str] = []
    # num_speculative_steps + num_new_sampled_tokens_per_step (1 but for diffusion-Gemma's ModelState)
    decode_query_len = int(vllm_config.num_speculative_tokens) + 1
    compilation = vllm_config.compilation_config
    piecewise = _breakable_cudagraph(compilation, envs) or compilation.mode == CompilationMode.VLLM_COMPILE
    resolve = compilation.resolve_cudagraph_mode_and_sizes
    v2: dict[str, Any] = (
        {"use_v2_model_runner": True}
        if "use_v2_model_runner" in inspect.signature(resolve).parameters
        else {}
    )
    mode = resolve(
        AttentionCGSupport.ALWAYS,
        None,
        decode_query_len,
        **v2,
        kv_cache_config=None,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
        is_profiling=False,
        piecewise_capture_available=piecewise,
    )
    notes.append(
        "attention backends assumed to support every CUDA-graph mode (vLLM downgrades the mode at "
        "boot when the loaded backends do not)"
    )
    lora_cases = [0]
    if vllm_config.lora_config:
        lora_cases = list(get_lora_capture_cases(vllm_config.lora_config, compilation))
    spec = vllm_config.speculative_config
    varlen = bool(spec is not None and getattr(spec, "enable_adaptive_verification", False))
    aux_layers = 0
    if spec is not None and _uses_aux_hidden_states(spec):
        aux_layers = _aux_layer_count(spec)
        notes.append(f"{aux_layers} auxiliary hidden-state buffers (the draft's layer ids, else vLLM's 3)")
    dbo = bool(getattr(vllm_config.parallel_config, "enable_dbo", False))
    model_config = vllm_config.model_config
    return ManagerInputs(
        dbo=dbo,
        cudagraph_mode=str(mode.name),
        decode_query_len=decode_query_len,
        lora_capture_cases=lora_cases,
        varlen_decode=varlen,
        hidden_size=int(model_config.get_hidden_size()),
        dtype=model_config.dtype,
        aux_layers=aux_layers,
        notes=notes,
    )


def _breakable_cudagraph(compilation: Any, envs: Any) -> bool:
    """Whether PIECEWISE graphs are captured without torch.compile: vLLM's answer, else its variable."""
    try:
        from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
    except ImportError:
        return bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH)
    if "compilation_config" in inspect.signature(is_breakable_cudagraph_enabled).parameters:
        return bool(is_breakable_cudagraph_enabled(compilation))
    return bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH)


def _uses_aux_hidden_states(spec: Any) -> bool:
    """Whether the runner stages auxiliary hidden states for this draft (EAGLE3, DFlash, DSpark)."""
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import requires_aux_hidden_states
    except ImportError:  # the speculative config answers
        return bool(spec.uses_aux_hidden_states)
    return bool(requires_aux_hidden_states(spec))


def _aux_layer_count(spec: Any) -> int:
    """How many auxiliary hidden states the runner stages: vLLM's reading, else the EAGLE3 ids, else 3."""
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
    except ImportError:
        pass
    else:
        ids = get_eagle3_aux_layers_from_config(spec)
        if ids:
            return len(ids)
    draft = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    for source in (draft, getattr(draft, "eagle_config", None)):
        ids = source.get("eagle_aux_hidden_state_layer_ids") if isinstance(source, dict) else None
        ids = ids or getattr(source, "eagle_aux_hidden_state_layer_ids", None)
        if ids:
            return len(ids)
    return 3
