"""Property tests: generated configurations of the real installed ``ModelCudaGraphManager`` on CPU.

For any configuration (mode, capture grid, max_num_seqs, decode_query_len, pipeline position, aux layers,
LoRA cases, varlen decode, DBO twins, a dense speculative schedule and KDA recover-SSM where this release
has them) and any permutation of its descriptors, the patched capture runs every descriptor and every
staging buffer holds the capacity rows. In vLLM's own order, wherever stock survives the patched buffers
are byte-identical to stock; wherever stock crashes (lab/stock_atlas.py maps where), patched boots.
"""

from __future__ import annotations

from typing import Any

import pytest
from release import SIZES_STAGING

pytest.importorskip("hypothesis")
pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

import torch
from atlas import probes
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from replays import replay_tensors

from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig, ReplayResult

pytestmark = pytest.mark.contract
FEATURES = probes.manager_features()
MODES = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
SHAPE_MISMATCH = "must match the existing size"
BOUNDED = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def configurations(draw: st.DrawFn, recoverssm: bool = False) -> ReplayConfig:
    """Any configuration; ``recoverssm``: KDA recover-SSM forced on (where stock can crash in its order)."""
    recoverssm = recoverssm and FEATURES["kda_recoverssm"]
    n = draw(st.integers(1 if recoverssm else 0, 4))  # speculative tokens: decode_query_len = 1 + n
    max_num_seqs = draw(st.integers(1, 48))
    schedule = None
    if FEATURES["dense_schedule"] and n >= 2 and max_num_seqs >= 2 and draw(st.booleans()):
        half = draw(st.integers(1, max_num_seqs - 1))
        schedule = ((1, half, n), (half + 1, max_num_seqs, draw(st.integers(0, n - 1))))
    if draw(st.booleans()):  # vLLM derives the grid itself, optionally under an operator-set maximum
        limit = draw(st.none() | st.integers(1, 160))
        sizes = tuple(probes.derived_capture_sizes(max_num_seqs, n, schedule, limit))
    else:  # operator-set cudagraph_capture_sizes
        sizes = tuple(draw(st.lists(st.integers(1, 160), min_size=1, max_size=10, unique=True)))
    positions = ["only", "last-of-2"] + (["first-of-2"] if FEATURES["intermediate_tensors"] else [])
    pp = "only" if recoverssm else draw(st.sampled_from(positions))
    last = pp != "first-of-2"
    return probes.KnobbedReplay(
        mode="FULL_AND_PIECEWISE" if recoverssm else draw(st.sampled_from(MODES)),
        sizes=sizes,
        max_num_seqs=max_num_seqs,
        decode_query_len=n + 1,
        hidden_size=draw(st.sampled_from([8, 24])),
        dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        aux_layers=draw(st.integers(0, 3)) if last else 0,
        last_pp_rank=last,
        first_pp_rank=pp != "last-of-2",
        pipeline_parallel_size=1 if pp == "only" else 2,
        lora_capture_cases=(
            draw(st.sampled_from([None, [0, 1], [0, 1, 2, 3]])) if FEATURES["lora_capture_cases"] else None
        ),
        use_kda_recoverssm=recoverssm
        or (FEATURES["kda_recoverssm"] and n > 0 and pp == "only" and draw(st.booleans())),
        varlen_decode=FEATURES["varlen_decode"] and n > 0 and draw(st.booleans()),
        dbo=FEATURES["dbo"] and draw(st.booleans()),
        dbo_decode_token_threshold=draw(st.sampled_from([2, 32])),
        speculative_schedule=schedule,
    )


def stock_descriptors(cfg: ReplayConfig) -> dict[str, list[Any]]:
    """vLLM's own descriptor lists for ``cfg`` (its ``_init_candidates``, capture order).

    A configuration this release's own config validation refuses (e.g. 0.24.0: "No valid cudagraph sizes
    after rounding") never reaches capture: it is not a staging case and is rejected from the search.
    """
    try:
        with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
            manager = cpu_replay.build_manager(cfg)
    except ValueError:
        assume(False)
    return {mode.name: list(descs) for mode, descs in manager._capture_descs.items()}


def expected_buffers(cfg: ReplayConfig) -> set[str]:
    names = (
        {"hidden_states"}
        if cfg.last_pp_rank
        else {f"intermediate_tensors[{k}]" for k in cfg.intermediate_keys}
    )
    return names | {f"aux_hidden_states[{i}]" for i in range(cfg.aux_layers)}


def captured(result: ReplayResult) -> list[int]:
    """``num_tokens`` per captured descriptor: each ran its warm-up and capture forward back to back."""
    assert result.forwards[::2] == result.forwards[1::2]
    return result.forwards[::2]


def as_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().view(torch.uint8).flatten().tolist())


@BOUNDED
@given(cfg=configurations(), data=st.data())
def test_any_permutation_patched_runs_every_descriptor_into_capacity_rows(
    cfg: ReplayConfig, data: st.DataObject
) -> None:
    descs = stock_descriptors(cfg)
    orders = {mode: data.draw(st.permutations(range(len(d))), label=mode) for mode, d in descs.items()}

    def permute(group: list[Any]) -> list[Any]:
        return [group[i] for i in orders[group[0].cg_mode.name]] if group else group

    result, tensors = replay_tensors(cfg, patched=True, reorder=permute)
    assert result.ok, result.error
    capacity = max((d.num_tokens for group in descs.values() for d in group), default=0)
    assert result.capacity == capacity
    expected_order = [d.num_tokens for mode in ("PIECEWISE", "FULL") for d in permute(descs.get(mode, []))]
    assert captured(result) == expected_order  # every descriptor, in exactly the permuted order
    if capacity:
        assert set(tensors) == expected_buffers(cfg)
        for tensor in tensors.values():
            assert tensor.shape == (capacity, cfg.hidden_size) and tensor.dtype == cfg.dtype


@BOUNDED
@given(cfg=st.one_of(configurations(), configurations(recoverssm=True)))
def test_vllms_own_order_patched_is_stock_where_stock_boots_and_boots_where_it_crashes(
    cfg: ReplayConfig,
) -> None:
    stock_descriptors(cfg)  # rejects configurations vLLM itself refuses
    stock, stock_tensors = replay_tensors(cfg, patched=False)
    patched, patched_tensors = replay_tensors(cfg, patched=True)
    assert patched.ok, patched.error
    assert patched.sequence == stock.sequence  # vLLM's order: nothing reordered
    event("stock boots in its own order" if stock.ok else "stock crashes in its own order")
    if stock.ok:
        assert patched.forwards == stock.forwards
        assert patched.buffers == stock.buffers
        assert patched_tensors.keys() == stock_tensors.keys()
        for name, tensor in stock_tensors.items():
            assert patched_tensors[name].shape == tensor.shape and patched_tensors[name].dtype == tensor.dtype
            assert as_bytes(patched_tensors[name]) == as_bytes(tensor), name
    else:
        assert SHAPE_MISMATCH in (stock.error or ""), stock.error  # the staging copy, nothing else
        assert {b["rows"] for b in patched.buffers.values()} == {patched.capacity}
        assert set(patched.buffers) == expected_buffers(cfg)


def test_the_generator_reaches_stock_crashes_in_vllms_own_order() -> None:
    """The own-order property is not vacuous: a generated-style configuration crashes stock (0.30+)."""
    if not FEATURES["kda_recoverssm"]:
        pytest.skip("this vLLM release has no KDA recover-SSM cap")
    cfg = probes.KnobbedReplay(
        mode="FULL_AND_PIECEWISE", sizes=(1, 2, 4, 8, 16), max_num_seqs=4, decode_query_len=3,
        hidden_size=8, use_kda_recoverssm=True,
    )  # fmt: skip
    stock, _ = replay_tensors(cfg, patched=False)
    patched, tensors = replay_tensors(cfg, patched=True)
    assert stock.sequence == {"PIECEWISE": [8, 4, 2, 1], "FULL": [9, 6, 3]}
    if SIZES_STAGING:  # vLLM 0.34.0: the same plan, sized by vLLM itself
        assert stock.ok and stock.buffers["hidden_states"]["rows"] == 9
    else:
        assert not stock.ok and "expanded size of the tensor (8) must match the existing size (9)" in (
            stock.error or ""
        )
    assert patched.ok and tensors["hidden_states"].shape[0] == 9
