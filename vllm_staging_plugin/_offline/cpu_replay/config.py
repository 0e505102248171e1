"""The CPU replay's configurations: what is replayed (``ReplayConfig``) and the real ``VllmConfig`` built
for it, including the capture grid vLLM derives itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import seams


def default_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's default capture grid: 1, 2, 4, multiples of 8 below 256, then multiples of 16."""
    grid = (1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16))
    return tuple(n for n in grid if n <= max_size)


DEFAULT_SIZES = default_sizes(512)
# The compilation fields that split the capture sizes into prefill tokens and decode requests.
SPLIT_SIZE_FIELDS = (
    "prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
    "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests",
)  # fmt: skip


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
    varlen_decode: bool = False  # adaptive verification's varlen FULL decode graphs
    dbo: bool = False  # dual-batch overlap: a ubatch runner, so FULL descriptors get microbatch twins

    def adjust(self, vllm_config: Any) -> None:
        """Set more of the real config before vLLM splits its grid: nothing here (the pre-flight hands
        the replay vLLM's own config); the atlas's configurations set their knobs."""


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
    if cfg.dbo:
        parallel.enable_dbo = True
    cfg.adjust(vllm_config)
    if hasattr(vllm_config, "get_decode_cudagraph_query_lens"):  # decode graphs by request count
        if cfg.decode_query_len > 1 and vllm_config.speculative_config is None:  # its decode query length
            vllm_config.speculative_config = speculative_config(cfg.decode_query_len - 1)
        seams.split_capture_sizes(vllm_config, cfg.decode_query_len)
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
