"""What the atlas and the tests ask of vLLM besides the plugin's own replay, kept out of the wheel: the grid
vLLM derives itself, a data-centre Blackwell platform for the block, and which descriptor knobs a release's
manager has, and the replay configuration with the knobs of later releases that only the atlas and the
property tests set. Each names the vLLM private it reads; tests/test_seams.py pins each on every release
CI runs.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_staging_plugin._offline.cpu_replay import ReplayConfig, make_vllm_config
from vllm_staging_plugin._offline.cpu_replay.config import SPLIT_SIZE_FIELDS, speculative_config
from vllm_staging_plugin._offline.scoped import attributes
from vllm_staging_plugin._offline.seams import cudagraph_module


def derive_capture_sizes(vllm_config: Any) -> list[int]:
    """The capture grid vLLM derives for ``vllm_config`` (no explicit sizes), set on it and returned.
    Private: ``VllmConfig._set_cudagraph_sizes``; gone, AttributeError names it."""
    vllm_config._set_cudagraph_sizes()
    return list(vllm_config.compilation_config.cudagraph_capture_sizes)


@contextlib.contextmanager
def capability_family(family: int) -> Iterator[None]:
    """For the block, the platform answers ``is_device_capability_family(family)`` with yes (100:
    data-centre Blackwell, whose derived-grid ceiling is 1024, not 512). Private: that classmethod; renamed,
    the ceiling stays 512, which tests/test_seams.py's per-release pin catches."""
    from vllm.platforms import current_platform

    answer = classmethod(lambda _, capability, device_id=0: capability // 10 == family // 10)
    with attributes(type(current_platform), {"is_device_capability_family": answer}):
        yield


def manager_features() -> dict[str, bool]:
    """Which descriptor knobs the release's graph manager has, read from its structure. Privates: the
    constructor's parameters and the source of ``_init_candidates`` and ``__init__``; a renamed knob reads
    as absent."""
    cu = cudagraph_module()
    params = inspect.signature(cu.ModelCudaGraphManager.__init__).parameters
    candidates = inspect.getsource(cu.CudaGraphManager._init_candidates)
    init = inspect.getsource(cu.ModelCudaGraphManager.__init__)
    return {
        "lora_capture_cases": "lora_capture_cases" in params,
        "varlen_decode": "varlen_decode" in params,
        "dbo": "ubatch_runner" in params and "_maybe_ubatch_twin" in candidates,
        "kda_recoverssm": "use_kda_recoverssm" in candidates,
        "dense_schedule": "uses_dynamic_speculative_decoding" in candidates or "decode_query_lens" in params,
        "intermediate_tensors": "intermediate_tensors" in init,
    }


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
    for split in SPLIT_SIZE_FIELDS:  # derived too, not the split make_vllm_config made
        if hasattr(compilation, split):
            setattr(compilation, split, None)
    vllm_config.model_config = types.SimpleNamespace(enforce_eager=False)
    return derive_capture_sizes(vllm_config)


@dataclass
class KnobbedReplay(ReplayConfig):
    """A replay with the descriptor knobs of later releases, off by default."""

    use_kda_recoverssm: bool = False  # cache_config.use_kda_recoverssm: PIECEWISE capped at decode
    dbo_decode_token_threshold: int = 32  # parallel_config.dbo_decode_token_threshold (vLLM's default)
    speculative_schedule: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative decoding's (first batch size, last, draft tokens) tiers: the dense decode
    schedule; ``decode_query_len - 1`` is the configured number of speculative tokens."""

    def adjust(self, vllm_config: Any) -> None:
        if self.use_kda_recoverssm:
            vllm_config.cache_config.use_kda_recoverssm = True
        if self.speculative_schedule is not None:
            vllm_config.speculative_config = speculative_config(
                self.decode_query_len - 1, self.speculative_schedule
            )
        if self.dbo:
            vllm_config.parallel_config.dbo_decode_token_threshold = self.dbo_decode_token_threshold
