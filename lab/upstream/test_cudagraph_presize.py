# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""ModelCudaGraphManager sizes its capture output buffers for the largest
descriptor of any mode, whichever descriptor reaches them first."""

from contextlib import nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

from vllm.config import (
    CompilationConfig,
    CUDAGraphMode,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.device_communicators import pynccl_allocator
from vllm.sequence import IntermediateTensors
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu import cudagraph_utils as gpu_cudagraph_utils
from vllm.v1.worker.gpu.input_batch import InputBuffers

pytestmark = pytest.mark.cpu_test

_HIDDEN_SIZE = 16
_DTYPE = torch.bfloat16
_DEFAULT_CAPTURE_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
_POWERS_OF_TWO = [2**i for i in range(10)]  # 1, 2, 4, ..., 512


@pytest.fixture(autouse=True)
def _reset_graph_pool_id():
    pynccl_allocator._graph_pool_id = None
    yield
    pynccl_allocator._graph_pool_id = None


def _create_vllm_config(
    capture_sizes: list[int], max_num_seqs: int, use_kda_recoverssm: bool
) -> MagicMock:
    compilation_config = CompilationConfig(
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
        cudagraph_capture_sizes=capture_sizes,
    )
    compilation_config.max_cudagraph_capture_size = max(capture_sizes)
    compilation_config.post_init_cudagraph_sizes()

    vllm_config = MagicMock(spec=VllmConfig)
    vllm_config.compilation_config = compilation_config
    vllm_config.scheduler_config = SchedulerConfig.default_factory(
        max_num_seqs=max_num_seqs
    )
    vllm_config.parallel_config = ParallelConfig()
    vllm_config.cache_config = SimpleNamespace(use_kda_recoverssm=use_kda_recoverssm)
    vllm_config.speculative_config = None
    vllm_config.num_speculative_tokens = 0
    vllm_config.use_cumem_cudagraph_pool = False
    return vllm_config


class _FakeModel(torch.nn.Module):
    """Returns what a model returns at this PP rank, one row per token."""

    def __init__(self, num_aux: int, is_last_rank: bool):
        super().__init__()
        self.num_aux = num_aux
        self.is_last_rank = is_last_rank
        self.outputs: list = []

    def forward(self, input_ids, positions, intermediate_tensors=None, **kwargs):
        def hidden() -> torch.Tensor:
            return torch.ones(positions.shape[0], _HIDDEN_SIZE, dtype=_DTYPE)

        if not self.is_last_rank:
            output = IntermediateTensors(
                {"hidden_states": hidden(), "residual": hidden()}
            )
        elif self.num_aux:
            output = hidden(), [hidden() for _ in range(self.num_aux)]
        else:
            output = hidden()
        self.outputs.append(output)
        return output


def _capture(
    monkeypatch,
    capture_sizes: list[int],
    max_num_seqs: int,
    decode_query_len: int = 1,
    use_kda_recoverssm: bool = False,
    ascending: bool = False,
    num_aux: int = 0,
    is_last_rank: bool = True,
) -> tuple[gpu_cudagraph_utils.ModelCudaGraphManager, _FakeModel]:
    """Run ModelCudaGraphManager.capture() through vLLM's own capture loop
    (PIECEWISE, then FULL; each mode's descriptors in stored order) with the
    CUDA-only calls replaced: on CPU, graph capture records nothing."""
    monkeypatch.setattr(
        gpu_cudagraph_utils,
        "get_pp_group",
        lambda: SimpleNamespace(is_first_rank=True, is_last_rank=is_last_rank),
    )
    monkeypatch.setattr(
        gpu_cudagraph_utils.current_platform,
        "get_global_graph_pool",
        lambda: object(),
    )
    monkeypatch.setattr(
        gpu_cudagraph_utils, "graph_capture", lambda device: nullcontext()
    )
    monkeypatch.setattr(
        gpu_cudagraph_utils, "set_forward_context", lambda *a, **k: nullcontext()
    )
    monkeypatch.setattr(gpu_cudagraph_utils, "current_stream", lambda: None)
    monkeypatch.setattr(gpu_cudagraph_utils, "has_compiled_submodule", lambda m: True)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", MagicMock)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: nullcontext())

    manager = gpu_cudagraph_utils.ModelCudaGraphManager(
        vllm_config=_create_vllm_config(
            capture_sizes, max_num_seqs, use_kda_recoverssm
        ),
        device=torch.device("cpu"),
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
        decode_query_len=decode_query_len,
    )
    if ascending:
        for mode, descs in manager._capture_descs.items():
            manager._capture_descs[mode] = descs[::-1]

    block_tables = MagicMock()
    block_tables.cp_size = 1
    block_tables.get_dummy_block_tables.return_value = ()
    block_tables.get_dummy_slot_mappings.return_value = torch.empty(0, 0)
    model_state = MagicMock()
    model_state.prepare_dummy_inputs.return_value = {}
    model = _FakeModel(num_aux, is_last_rank)
    manager.capture(
        model,
        model_state,
        InputBuffers(max_num_seqs, max(capture_sizes), torch.device("cpu")),
        None,
        block_tables,
        [],
        KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]),
        use_aux_hidden_state_outputs=num_aux > 0,
    )
    return manager, model


def _num_tokens(manager, mode: CUDAGraphMode) -> list[int]:
    return [desc.num_tokens for desc in manager._capture_descs[mode]]


def _staging_buffers(manager) -> list[torch.Tensor]:
    if manager.intermediate_tensors is not None:
        return list(manager.intermediate_tensors.tensors.values())
    return [manager.hidden_states, *manager.aux_hidden_states]


def test_recoverssm_full_decode_descriptor_above_piecewise_cap(monkeypatch):
    """Kimi-K3 with 8 speculative tokens, max_num_seqs 48 and a power-of-two
    grid: recoverSSM caps PIECEWISE at 48 * 9 = 432 tokens, so PIECEWISE stops
    at 256, while FULL decode rounds 256 up to 261. PIECEWISE is captured first,
    so its 256-token warmup is the first output to reach the buffers."""
    manager, _ = _capture(
        monkeypatch,
        _POWERS_OF_TWO,
        max_num_seqs=48,
        decode_query_len=9,
        use_kda_recoverssm=True,
    )

    assert _num_tokens(manager, CUDAGraphMode.PIECEWISE) == _POWERS_OF_TWO[8::-1]
    assert _num_tokens(manager, CUDAGraphMode.FULL) == [261, 135, 72, 36, 18, 9]
    assert manager.hidden_states.shape == (261, _HIDDEN_SIZE)
    assert manager.hidden_states.dtype == _DTYPE
    largest_full = manager._capture_descs[CUDAGraphMode.FULL][0]
    assert manager.run_fullgraph(largest_full).shape == (261, _HIDDEN_SIZE)


def test_ascending_capture_order_fits_largest_descriptor(monkeypatch):
    manager, _ = _capture(
        monkeypatch, _DEFAULT_CAPTURE_SIZES, max_num_seqs=128, ascending=True
    )

    assert _num_tokens(manager, CUDAGraphMode.PIECEWISE)[0] == 1
    assert manager.hidden_states.shape == (512, _HIDDEN_SIZE)


@pytest.mark.parametrize(
    "num_aux,is_last_rank",
    [(3, True), (0, False)],
    ids=["eagle3_aux_hidden_states", "pp_intermediate_tensors"],
)
def test_every_staging_buffer_fits_largest_descriptor(
    monkeypatch, num_aux, is_last_rank
):
    manager, _ = _capture(
        monkeypatch,
        _DEFAULT_CAPTURE_SIZES,
        max_num_seqs=128,
        ascending=True,
        num_aux=num_aux,
        is_last_rank=is_last_rank,
    )

    buffers = _staging_buffers(manager)
    assert len(buffers) == (num_aux + 1 if is_last_rank else 2)
    for buffer in buffers:
        assert buffer.shape == (512, _HIDDEN_SIZE)
        assert buffer.dtype == _DTYPE


@pytest.mark.parametrize(
    "capture_sizes,max_num_seqs,decode_query_len,use_kda_recoverssm",
    [
        (_DEFAULT_CAPTURE_SIZES, 128, 1, False),
        (_DEFAULT_CAPTURE_SIZES, 256, 3, False),
        # max_num_seqs 57: the recoverSSM cap (57 * 9 = 513) is above every size
        (_POWERS_OF_TWO, 57, 9, True),
    ],
    ids=["default", "spec_decode", "recoverssm_uncapped"],
)
@pytest.mark.parametrize(
    "num_aux,is_last_rank",
    [(0, True), (3, True), (0, False)],
    ids=["hidden_states", "eagle3_aux_hidden_states", "pp_intermediate_tensors"],
)
def test_default_order_allocation_is_unchanged(
    monkeypatch,
    capture_sizes,
    max_num_seqs,
    decode_query_len,
    use_kda_recoverssm,
    num_aux,
    is_last_rank,
):
    """In the default order the first output already has the most rows, so
    the buffers are exactly what torch.empty_like of that output allocates."""
    manager, model = _capture(
        monkeypatch,
        capture_sizes,
        max_num_seqs=max_num_seqs,
        decode_query_len=decode_query_len,
        use_kda_recoverssm=use_kda_recoverssm,
        num_aux=num_aux,
        is_last_rank=is_last_rank,
    )

    first_output = model.outputs[0]
    if not is_last_rank:
        expected = list(first_output.tensors.values())
    elif num_aux:
        expected = [first_output[0], *first_output[1]]
    else:
        expected = [first_output]
    buffers = _staging_buffers(manager)
    for buffer, output in zip(buffers, expected, strict=True):
        reference = torch.empty_like(output)
        assert buffer.shape == reference.shape == (max(capture_sizes), _HIDDEN_SIZE)
        assert buffer.dtype == reference.dtype
        assert buffer.device == reference.device
        assert buffer.stride() == reference.stride()
        assert buffer.untyped_storage().nbytes() == (
            reference.untyped_storage().nbytes()
        )
