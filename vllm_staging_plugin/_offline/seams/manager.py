"""Seams into Model Runner V2's CUDA-graph manager (``vllm/v1/worker/gpu/cudagraph_utils.py``) and the graph
pool its platform hands it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
