"""Seams into Model Runner V2's CUDA-graph manager (``vllm/v1/worker/gpu/cudagraph_utils.py``): what the
runner hands it, its capture plan and knobs, and the graph pool its platform hands it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..scoped import attributes


@contextlib.contextmanager
def graph_pool_stub(platform: Any, pool: Any) -> Iterator[None]:
    """For the block, ``platform.get_global_graph_pool()`` returns ``pool`` without CUDA (a manager built
    on CPU asks the platform its module bound, in ``__init__``). Private: the platform class's
    ``_global_graph_pool`` cache (0.18.0-0.33.0), which that getter returns when set."""
    with attributes(type(platform), {"_global_graph_pool": pool}):
        yield


def capture_plan(manager: Any) -> dict[Any, list[Any]]:
    """The manager's capture plan: CUDA-graph mode -> its batch descriptors, in the order vLLM captures
    them; reordering a list in place changes what ``capture()`` runs. Private:
    ``ModelCudaGraphManager._capture_descs`` (0.18.0-0.33.0), which the engine's structure check
    (``_engine/compat.check_manager``) requires too: a vLLM without it is refused before this is asked."""
    return manager._capture_descs  # type: ignore[no-any-return]


def manager_features(cudagraph_module: Any) -> dict[str, bool]:
    """Which descriptor knobs the release's graph manager has, read from its structure (not its version).
    Privates: ``ModelCudaGraphManager.__init__``'s parameters and the source text of
    ``CudaGraphManager._init_candidates`` and ``ModelCudaGraphManager.__init__`` (0.18.0-0.33.0); a knob
    renamed there reads as absent, and the search then runs at that knob's default only."""
    import inspect

    params = inspect.signature(cudagraph_module.ModelCudaGraphManager.__init__).parameters
    candidates = inspect.getsource(cudagraph_module.CudaGraphManager._init_candidates)
    init = inspect.getsource(cudagraph_module.ModelCudaGraphManager.__init__)
    return {
        "lora_capture_cases": "lora_capture_cases" in params,
        "varlen_decode": "varlen_decode" in params,
        "dbo": "ubatch_runner" in params and "_maybe_ubatch_twin" in candidates,
        "kda_recoverssm": "use_kda_recoverssm" in candidates,
        "dense_schedule": "uses_dynamic_speculative_decoding" in candidates,
        "intermediate_tensors": "intermediate_tensors" in init,
    }


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
    """Mirror ``GPUModelRunner`` (MRv2) ``load_model``/``initialize_kv_cache`` up to the manager's birth.

    Parts that need the loaded model or its attention backends are taken at their usual values and
    listed in ``notes``. Internals it calls as the runner does (0.32.0-0.33.0):
    ``CompilationConfig.resolve_cudagraph_mode_and_sizes``, ``VLLM_USE_BREAKABLE_CUDAGRAPH``,
    ``get_lora_capture_cases``, ``requires_aux_hidden_states`` and ``get_eagle3_aux_layers_from_config``;
    one renamed or re-signed raises (ImportError, TypeError), and the pre-flight reports it.
    """
    import vllm.envs as envs
    from vllm.config.compilation import CompilationMode
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import requires_aux_hidden_states

    notes: list[str] = []
    # decode_query_len = num_speculative_steps + model_state.num_new_sampled_tokens_per_step (1 for
    # every ModelState in 0.33.0 except the diffusion-Gemma one).
    decode_query_len = int(vllm_config.num_speculative_tokens) + 1
    compilation = vllm_config.compilation_config
    piecewise = bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH) or compilation.mode == CompilationMode.VLLM_COMPILE
    mode = compilation.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS,
        None,
        decode_query_len,
        use_v2_model_runner=True,
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
    if spec is not None and requires_aux_hidden_states(spec):
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


def _aux_layer_count(spec: Any) -> int:
    """How many auxiliary hidden states the runner stages: vLLM's own reading of the draft's config
    where this release has it (EAGLE3 ids, DFlash and DSpark target layers), else the EAGLE3 ids or 3."""
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
