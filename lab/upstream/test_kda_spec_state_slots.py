# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The shared Kimi-Linear KDA layer keeps one state slot per speculative token
under --use-replayssm: it has no RecoverSSM path, and its speculative kernel
reads one state index per query token of a decode."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

from vllm.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import (
    KimiGatedDeltaNetAttention,
)
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

pytestmark = pytest.mark.cpu_test

_PROMPT_LEN = 16
_PREFILL_LEN = 12


def _create_vllm_config(
    num_spec: int, use_replayssm: bool, mamba_cache_mode: str
) -> MagicMock:
    compilation_config = CompilationConfig(
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
        cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    )
    compilation_config.max_cudagraph_capture_size = 512
    cache_config = CacheConfig(mamba_cache_mode=mamba_cache_mode)
    cache_config.mamba_block_size = 16
    cache_config.use_replayssm = use_replayssm
    cache_config.use_kda_recoverssm = use_replayssm

    vllm_config = MagicMock(spec=VllmConfig)
    vllm_config.compilation_config = compilation_config
    vllm_config.scheduler_config = SchedulerConfig.default_factory(max_num_seqs=48)
    vllm_config.cache_config = cache_config
    vllm_config.parallel_config = ParallelConfig()
    vllm_config.speculative_config = SimpleNamespace(
        num_speculative_tokens=num_spec,
        parallel_drafting=False,
        use_eagle_block_drop=lambda: False,
        enable_adaptive_verification=False,
        max_num_new_slots_for_drafting=0,
    )
    vllm_config.num_speculative_tokens = num_spec
    vllm_config.num_hash_lookahead_tokens = 0
    vllm_config.use_v2_model_runner = True
    vllm_config.additional_config = {}
    return vllm_config


def _kv_cache_spec(vllm_config):
    """The layer's own get_kv_cache_spec; only its state shape is stubbed."""
    layer = KimiGatedDeltaNetAttention.__new__(KimiGatedDeltaNetAttention)
    torch.nn.Module.__init__(layer)
    layer.get_state_shape = lambda: ((384, 3 + vllm_config.num_speculative_tokens),)
    layer.get_state_dtype = lambda: (torch.bfloat16,)
    with set_current_vllm_config(vllm_config):
        return layer.get_kv_cache_spec(vllm_config)


def _build(vllm_config, spec, num_spec: int, with_prefill: bool):
    """Metadata for one speculative decode (1 + num_spec tokens), beside one
    prefill or alone."""
    query_len = 1 + num_spec
    lens = [query_len, _PREFILL_LEN] if with_prefill else [query_len]
    num_reqs = len(lens)
    starts = torch.tensor(
        [0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32
    )
    seq_lens = torch.tensor([_PROMPT_LEN + query_len, _PREFILL_LEN][:num_reqs])
    # "none": one block per state slot; "align": the request's blocks, of
    # which vLLM takes the last 1 + num_speculative_blocks.
    width = 1 + spec.num_speculative_blocks
    if spec.mamba_cache_mode == "align":
        width += 4
    common = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts.clone(),
        seq_lens=seq_lens,
        num_reqs=num_reqs,
        num_actual_tokens=int(starts[-1]),
        max_query_len=max(lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.arange(
            1, 1 + num_reqs * width, dtype=torch.int32
        ).view(num_reqs, width),
        slot_mapping=torch.zeros(int(starts[-1]), dtype=torch.int64),
        is_prefilling=torch.tensor([False, True][:num_reqs]),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )
    with set_current_vllm_config(vllm_config):
        builder = GDNAttentionMetadataBuilder(
            spec, ["layers.0.self_attn"], vllm_config, torch.device("cpu")
        )
        return builder.build(
            0,
            common,
            num_accepted_tokens=torch.ones(num_reqs, dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor(
                [num_spec, -1][:num_reqs], dtype=torch.int32
            ),
        )


@pytest.fixture(autouse=True)
def _host_copies_on_cpu(monkeypatch):
    # async_tensor_h2d stages copies in pinned memory on CUDA platforms.
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.attention.backends.utils as backend_utils

    monkeypatch.setattr(torch_utils, "is_pin_memory_available", lambda: False)
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    monkeypatch.setattr(backend_utils, "PIN_MEMORY", False)


@pytest.mark.parametrize("mamba_cache_mode", ["none", "align"])
@pytest.mark.parametrize("num_spec", [2, 8])
def test_replayssm_keeps_a_state_slot_per_speculative_token(
    num_spec: int, mamba_cache_mode: str
):
    vllm_config = _create_vllm_config(num_spec, True, mamba_cache_mode)
    spec = _kv_cache_spec(vllm_config)
    assert spec.num_speculative_blocks == num_spec


@pytest.mark.parametrize("mamba_cache_mode", ["none", "align"])
@pytest.mark.parametrize("num_spec", [2, 8])
def test_mixed_step_state_indices_cover_the_decode_query(
    num_spec: int, mamba_cache_mode: str
):
    """fused_recurrent_kda reads state_indices[i * stride(0) + t] for every
    query token t of a speculative decode: the index needs 1 + num_spec
    columns. With one state slot per request a decode beside a prefill gets a
    (1, 1) index and the kernel reads num_spec words past it."""
    vllm_config = _create_vllm_config(num_spec, True, mamba_cache_mode)
    metadata = _build(vllm_config, _kv_cache_spec(vllm_config), num_spec, True)
    assert metadata.num_spec_decodes == 1 and metadata.num_prefills == 1
    index = metadata.spec_state_indices_tensor
    assert tuple(index.shape) == (1, 1 + num_spec), (
        f"state index {tuple(index.shape)} for a {1 + num_spec}-token decode"
    )


@pytest.mark.parametrize("use_replayssm", [False, True])
def test_pure_speculative_step_uses_the_staged_columns(use_replayssm: bool):
    vllm_config = _create_vllm_config(8, use_replayssm, "none")
    metadata = _build(vllm_config, _kv_cache_spec(vllm_config), 8, False)
    assert metadata.num_spec_decodes == 1 and metadata.num_prefills == 0
    assert tuple(metadata.spec_state_indices_tensor.shape) == (1, 9)


@pytest.mark.parametrize("mamba_cache_mode", ["none", "align"])
def test_without_replayssm_nothing_changes(mamba_cache_mode: str):
    vllm_config = _create_vllm_config(8, False, mamba_cache_mode)
    spec = _kv_cache_spec(vllm_config)
    assert spec.num_speculative_blocks == 8
    metadata = _build(vllm_config, spec, 8, True)
    assert tuple(metadata.spec_state_indices_tensor.shape) == (1, 9)
