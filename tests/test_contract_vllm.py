"""Contract tests: the real installed vLLM ModelCudaGraphManager, its real capture() staging code, on CPU."""

from __future__ import annotations

import inspect
import json
import random
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import installed, policy_order
from release import SIZES_STAGING  # 0.34.0: any order boots stock code; the plugin leaves the buffers
from replays import Reorder, ascending, replay
from wrappers import is_patched

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, staging
from vllm_staging_plugin._offline import cpu_replay, seams
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

pytestmark = pytest.mark.contract
_CU = seams.cudagraph_module()
_INIT_SOURCE = inspect.getsource(_CU.ModelCudaGraphManager.__init__)
HAS_LORA_CASES = "lora_capture_cases" in inspect.signature(_CU.ModelCudaGraphManager.__init__).parameters
HAS_INTERMEDIATE = "intermediate_tensors" in _INIT_SOURCE  # staging for non-last PP ranks, 0.19+
HAS_PROFILING_HOOK = "_max_full_descs_to_capture" in inspect.getsource(_CU.CudaGraphManager.__init__)  # 0.29+


def needs(present: bool, what: str) -> Any:
    return pytest.mark.skipif(not present, reason=f"this vLLM release has no {what}")


SHAPE_MISMATCH = "must match the existing size"
QWEN3_8B = ReplayConfig()  # FULL_AND_PIECEWISE, 51 sizes up to 512, hidden 4096, bf16


def shuffled(seed: int) -> Reorder:
    def reorder(descs: list[Any]) -> list[Any]:
        out = list(descs)
        random.Random(seed).shuffle(out)
        return out

    return reorder


def max_first(descs: list[Any]) -> list[Any]:
    top = max(descs, key=lambda d: d.num_tokens)
    return [top, *(d for d in ascending(descs) if d is not top)]


def rows(result: cpu_replay.ReplayResult) -> dict[str, int]:
    return {name: b["rows"] for name, b in result.buffers.items()}


def assert_stock_in_another_order(stock: cpu_replay.ReplayResult, capacity: int) -> None:
    """vLLM's own staging under an order whose first descriptor is not the largest: it crashes at the
    staging copy where vLLM stages lazily (0.18.0-0.33.0), and holds ``capacity`` rows in every buffer
    where vLLM sizes the buffers itself (0.34.0)."""
    if SIZES_STAGING:
        assert stock.ok, stock.error
        assert set(rows(stock).values()) == {capacity}
    else:
        assert not stock.ok and SHAPE_MISMATCH in (stock.error or "")


def test_real_class_has_the_structure_the_patch_relies_on() -> None:
    assert compat.manager_class(seams.cudagraph_module()) is seams.cudagraph_module().ModelCudaGraphManager


@pytest.mark.parametrize(
    "reorder",
    [ascending, shuffled(1), shuffled(2), shuffled(3)],
    ids=["ascending", "shuffle1", "shuffle2", "shuffle3"],
)
def test_stock_crashes_and_patched_holds_capacity(reorder: Reorder) -> None:
    stock = replay(QWEN3_8B, patched=False, reorder=reorder)
    patched = replay(QWEN3_8B, patched=True, reorder=reorder)
    first = stock.sequence["PIECEWISE"][0]
    assert first != 512  # these orders do not start with the largest descriptor...
    assert_stock_in_another_order(stock, 512)  # ...so vLLM's own code crashes (0.34.0: sizes itself)
    assert patched.ok, patched.error
    assert patched.capacity == 512 and rows(patched) == {"hidden_states": 512}
    # every descriptor ran (warm-up + capture pass), in exactly the order under test
    assert (
        patched.forwards[::2]
        == patched.forwards[1::2]
        == [n for seq in patched.sequence.values() for n in seq]
    )


def test_max_first_boots_unpatched_so_only_the_first_descriptor_matters() -> None:
    stock = replay(QWEN3_8B, patched=False, reorder=max_first)
    assert stock.ok and rows(stock) == {"hidden_states": 512}


def test_default_order_is_byte_identical_and_keeps_the_stock_tensor(mocker: Any) -> None:
    stock = replay(QWEN3_8B, patched=False)
    spy = mocker.spy(staging, "presized")
    intercepted = mocker.spy(staging._StagingSlot, "__set__")
    patched = replay(QWEN3_8B, patched=True)
    assert stock.ok and patched.ok
    assert (
        stock.buffers
        == patched.buffers
        == {
            "hidden_states": {"rows": 512, "shape": [512, 4096], "dtype": "bfloat16", "bytes": 512 * 4096 * 2}
        }
    )
    assert stock.forwards == patched.forwards  # same descriptors, same order
    if SIZES_STAGING:  # no capture view at all: vLLM's staging runs as it is
        assert intercepted.call_count == 0
    else:  # the slot saw vLLM's lazy allocation and stored vLLM's own tensor: nothing allocated instead
        assert any(isinstance(c.args[2], torch.Tensor) for c in intercepted.call_args_list)
    assert spy.call_count == 0


@pytest.mark.parametrize(
    "cfg",
    [
        ReplayConfig(aux_layers=3, hidden_size=1024),
        pytest.param(
            ReplayConfig(last_pp_rank=False, hidden_size=1024),
            marks=needs(HAS_INTERMEDIATE, "intermediate_tensors"),
        ),
        ReplayConfig(mode="FULL", max_num_seqs=256),
        ReplayConfig(mode="PIECEWISE"),
        pytest.param(
            ReplayConfig(lora_capture_cases=[0, 1], hidden_size=256),
            marks=needs(HAS_LORA_CASES, "lora_capture_cases"),
        ),
    ],
    ids=["eagle3-aux", "pp-non-last-rank", "full-only", "piecewise-only", "lora-cases"],
)
def test_every_staging_path(cfg: ReplayConfig) -> None:
    stock = replay(cfg, patched=False, reorder=ascending)
    patched = replay(cfg, patched=True, reorder=ascending)
    assert_stock_in_another_order(stock, patched.capacity)
    assert patched.ok, patched.error
    expected = (
        {"hidden_states"}
        if cfg.last_pp_rank
        else {f"intermediate_tensors[{k}]" for k in cfg.intermediate_keys}
    )
    expected |= {f"aux_hidden_states[{i}]" for i in range(cfg.aux_layers)}
    assert set(rows(patched)) == expected
    assert set(rows(patched).values()) == {patched.capacity}
    assert all(
        b["dtype"] == "bfloat16" and b["shape"][1:] == [cfg.hidden_size] for b in patched.buffers.values()
    )
    stock_default, patched_default = replay(cfg, patched=False), replay(cfg, patched=True)
    assert stock_default.ok and stock_default.buffers == patched_default.buffers


EAGLE3_GPU_RECEIPTS = (
    Path(__file__).resolve().parents[1] / "docs" / "data" / "h200-2026-12-01" / "eagle3" / "receipts"
)


def test_eagle3_grid_recorded_on_the_h200(mocker: Any) -> None:
    """The H200's EAGLE3 boots (2 speculative tokens, FULL largest 504 < PIECEWISE largest 512) replayed on
    the real manager: stock crashes under ascending, the plugin sizes all four buffers to capacity, and under
    vLLM's order the plugin keeps vLLM's own tensors (docs/data/h200-2026-12-01/README.md, EAGLE3)."""
    recorded = json.loads(
        next(
            EAGLE3_GPU_RECEIPTS.glob("r1-qwen3-0.6b-eagle3-descending-plugin/receipt-capture-*.json")
        ).read_text()
    )
    cfg = ReplayConfig(sizes=recorded["capture_sizes"], max_num_seqs=256, decode_query_len=3, aux_layers=3,
                       hidden_size=1024)  # fmt: skip
    stock = replay(cfg, patched=False, reorder=ascending)
    patched = replay(cfg, patched=True, reorder=ascending)
    assert_stock_in_another_order(stock, patched.capacity)
    assert patched.ok and rows(patched) == dict.fromkeys(recorded["staging_bytes"], patched.capacity)
    intercepted = mocker.spy(staging._StagingSlot, "__set__")
    stock_default, patched_default = replay(cfg, patched=False), replay(cfg, patched=True)
    assert stock_default.ok and stock_default.buffers == patched_default.buffers
    kept = any(isinstance(c.args[2], torch.Tensor) for c in intercepted.call_args_list)  # vLLM's tensor kept
    assert kept is not SIZES_STAGING  # 0.34.0: no capture view at all
    if version("vllm") == recorded["vllm_version"]:  # the H200's plan, descriptor by descriptor
        # (older releases build other grids from the same sizes, e.g. 0.24.0 rounds to capacity 504)
        assert patched_default.sequence == recorded["captured_sequence"]
        assert patched.capacity == recorded["capacity"] == 512


def _drive(cfg: ReplayConfig, **manager_attrs: Any) -> cpu_replay.ReplayResult:
    """Build through the real route: register() patches the imported module, then capture."""
    return _drive_manager(cfg, **manager_attrs)[0]


def _drive_manager(cfg: ReplayConfig, **manager_attrs: Any) -> tuple[cpu_replay.ReplayResult, Any]:
    vllm_staging_plugin.register()
    cls = seams.cudagraph_module().ModelCudaGraphManager
    assert is_patched(cls)
    with cpu_replay.cpu_stubs(cfg):
        manager = cpu_replay.build_manager(cfg)
        assert staging.state_of(manager).capacity == (None if SIZES_STAGING else 512)
        for key, value in manager_attrs.items():
            setattr(manager, key, value)
        return cpu_replay.run_capture(manager, cfg), manager


def test_register_patches_real_class_and_logs_capacity(plugin_log: Any) -> None:
    result = _drive(QWEN3_8B)
    assert result.ok and rows(result) == {"hidden_states": 512}
    (line,) = [m for m in plugin_log.at(20) if "staging buffers" in m]
    if SIZES_STAGING:  # one true line: vLLM sizes them, the plugin stands down
        assert (
            "vLLM sizes ModelCudaGraphManager's staging buffers (hidden_states, aux_hidden_states, " in line
        )
        assert (
            "to the largest of its 70 capture descriptors (512 rows) itself; the plugin leaves them" in line
        )
        assert "lazy" not in line
    else:
        assert "sized to 512 rows, the largest of 70 capture descriptors" in line


def test_order_policy_reorders_the_real_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the order register() read: a later change of the environment is not read again."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "fastest")
    result, manager = _drive_manager(QWEN3_8B)  # its register() is a no-op
    assert result.ok and rows(result) == {"hidden_states": 512}
    captured = result.forwards[::2]  # warm-up and capture pass per descriptor
    assert captured[:51] == sorted(QWEN3_8B.sizes)  # PIECEWISE, ascending
    assert captured[51:] == sorted(captured[51:]) and captured[51:][-1] == 128  # FULL, ascending
    assert result.sequence["PIECEWISE"] == captured[:51]  # the replay reports the order captured
    own = {mode.name: [d.num_tokens for d in descs] for mode, descs in seams.capture_plan(manager).items()}
    assert own["PIECEWISE"][:2] == [512, 496]  # vLLM's own lists are restored afterwards


ACROSS_MODES = {  # the capture each order across the modes runs on the real descriptor lists
    "full-first": lambda p, f: [*f, *p],
    "size-descending": lambda p, f: sorted([*p, *f], key=lambda step: -step[1]),
    "interleaved": lambda p, f: (
        [s for pair in zip(p, f, strict=False) for s in pair] + p[len(f) :] + f[len(p) :]
    ),
}


@pytest.mark.parametrize("order", list(ACROSS_MODES))
def test_an_order_across_the_modes_captures_each_graph_in_its_own_mode(
    order: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """One list under one key reaches vLLM's loop (tests/test_contract_replay_loop.py pins that vLLM's own
    loop captures each descriptor in its own mode from it); the receipt names each step's mode."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    result, manager = _drive_manager(QWEN3_8B)
    own = seams.capture_plan(manager)  # vLLM's own lists, given back after the capture
    steps = {m.name: [(m.name, d.num_tokens) for d in descs] for m, descs in own.items()}
    expected = ACROSS_MODES[order](steps["PIECEWISE"], steps["FULL"])
    assert result.ok and rows(result) == {"hidden_states": 512}
    assert result.forwards[::2] == [tokens for _, tokens in expected]
    assert all(len(lst) > 1 and lst == sorted(lst, key=lambda d: -d.num_tokens) for lst in own.values())
    (receipt,) = [json.loads(p.read_text()) for p in tmp_path.glob("receipt-capture-*.json")]
    assert receipt["policy"] == order and receipt["captured_modes"] == [mode for mode, _ in expected]
    (key,) = receipt["captured_sequence"]
    assert key == "+".join(dict.fromkeys(mode for mode, _ in expected))  # its modes, first seen first
    assert receipt["captured_sequence"][key] == [tokens for _, tokens in expected]


@needs(HAS_PROFILING_HOOK, "CUDA-graph memory profiling pass")
def test_profiling_pass_keeps_vllms_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    result = _drive(QWEN3_8B, _max_full_descs_to_capture=2)
    assert result.ok
    assert result.forwards[::2][:51] == sorted(QWEN3_8B.sizes, reverse=True)  # not reordered
    assert result.forwards[::2][51:] == [128, 120]  # the two largest FULL graphs, as vLLM samples
    (receipt,) = [json.loads(p.read_text()) for p in tmp_path.glob("receipt-*.json")]
    assert receipt["kind"] == "profiling" and receipt["policy"] == "descending"
    assert receipt["requested_policy"] == "ascending"
    assert receipt["captured_sequence"]["FULL"] == [128, 120]
    assert receipt["captured_modes"] == ["PIECEWISE"] * 51 + ["FULL"] * 2  # the sample, as captured


@needs(HAS_PROFILING_HOOK, "CUDA-graph memory profiling pass")
def test_the_profiling_receipt_reads_vllms_own_deltas_and_extrapolation() -> None:
    """The two reads behind a profiling receipt's estimate, on the real manager and module: the deltas
    vLLM's profiling function has the manager collect, and vLLM's own extrapolation of them."""
    module = seams.cudagraph_module()
    with cpu_replay.cpu_stubs(QWEN3_8B):
        manager = cpu_replay.build_manager(QWEN3_8B)
    assert compat.PROFILING_DELTAS in vars(manager) and compat.profiling_deltas(manager) is None
    profiling = inspect.getsource(getattr(module, compat.PROFILING_ENTRY))
    assert f"manager.{compat.PROFILING_DELTAS} = " in profiling  # vLLM hands the manager its list
    setattr(manager, compat.PROFILING_DELTAS, [3 * 2**20, 2**20])
    assert compat.profiling_deltas(manager) == [3 * 2**20, 2**20]
    extrapolate = compat.full_graph_extrapolation()
    assert extrapolate is getattr(module, compat.PROFILING_EXTRAPOLATION)
    assert extrapolate([3 * 2**20, 2**20], 5) == 3 * 2**20 + 4 * 2**20  # first + (n - 1) * second


def test_receipt_of_a_real_capture(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "shuffle:1")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    assert _drive(QWEN3_8B).ok
    (path,) = tmp_path.glob("receipt-capture-*.json")
    receipt = json.loads(path.read_text())
    assert receipt["ok"] and receipt["policy"] == "shuffle:1" and receipt["presize"] == "on"
    assert receipt["capacity"] == 512 and receipt["vllm_version"] == version("vllm")
    assert receipt["cudagraph_mode"] == "FULL_AND_PIECEWISE" and len(receipt["capture_sizes"]) == 51
    assert sorted(receipt["captured_sequence"]["PIECEWISE"]) == sorted(QWEN3_8B.sizes)
    assert receipt["captured_sequence"]["PIECEWISE"] != sorted(QWEN3_8B.sizes, reverse=True)
    assert receipt["staging_bytes"]["hidden_states"]["bytes"] == 512 * 4096 * 2
    assert receipt["capture_seconds"] > 0


def test_stock_staging_reproduces_the_crash_on_purpose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", "off-allow-crash")
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(QWEN3_8B):
        manager = cpu_replay.build_manager(QWEN3_8B)
        assert staging.state_of(manager).capacity is None  # vLLM's own staging: no capacity to hold
        result = cpu_replay.run_capture(manager, QWEN3_8B)
    assert_stock_in_another_order(result, 512)
    (receipt,) = [json.loads(p.read_text()) for p in tmp_path.glob("receipt-*.json")]
    assert receipt["presize"] == "off-allow-crash" and receipt["vllm_sizes_staging"] is SIZES_STAGING
    if not SIZES_STAGING:
        assert receipt["ok"] is False and SHAPE_MISMATCH in receipt["error"]


def test_bad_order_fails_register_and_leaves_vllm_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_staging_plugin._engine.settings import ConfigError

    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "fastest")
    with pytest.raises(ConfigError, match=r"STAGING_PLUGIN_ORDER='fastest'.*allowed values"):
        vllm_staging_plugin.register()  # at plugin loading, before vLLM loads any model
    assert installed() is None and not is_patched(seams.cudagraph_module().ModelCudaGraphManager)


def test_builtin_policies_on_the_real_descriptor_lists() -> None:
    with cpu_replay.cpu_stubs(QWEN3_8B), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(QWEN3_8B)
    for mode, descs in manager._capture_descs.items():
        tokens = [d.num_tokens for d in descs]

        def ordered(order: str, descs: list[Any] = descs, mode: Any = mode) -> list[int]:
            result = policy_order(order, mode.name, descs)
            assert sorted(map(id, result)) == sorted(map(id, descs))  # the same objects, permuted
            return [d.num_tokens for d in result]

        assert ordered("descending") == tokens == sorted(tokens, reverse=True)  # vLLM's own, untouched
        assert ordered("ascending") == sorted(tokens)
        assert ordered("max-first") == [max(tokens), *sorted(tokens)[:-1]]
        for across in ACROSS_MODES:  # within one mode, an order across the modes keeps vLLM's
            assert ordered(across) == tokens
        assert ordered("shuffle:1") == ordered("shuffle:1") != tokens and sorted(
            ordered("shuffle:1")
        ) == sorted(tokens)


# ---- what the agreement check reads of vLLM: descriptor fields, rank layout, independent DP engines -----


def test_the_plan_digest_covers_every_descriptor_field() -> None:
    """The digest reads named fields, not repr: a field vLLM adds must be added to the list."""
    import dataclasses

    from vllm_staging_plugin._engine import agreement

    with cpu_replay.cpu_stubs(QWEN3_8B):
        manager = cpu_replay.build_manager(QWEN3_8B)
    desc = next(d for descs in manager._capture_descs.values() for d in descs)
    assert dataclasses.is_dataclass(desc)
    assert {f.name for f in dataclasses.fields(desc)} <= set(agreement.DESCRIPTOR_FIELDS)


def test_vllm_lays_one_engines_ranks_out_contiguously() -> None:
    """``coupled_ranks`` relies on vLLM's layout: global rank = dp_rank x engine world + local rank, and
    groups cut from ``arange(world).reshape(-1, dp, pp, [pcp,] tp)``."""
    import re

    from vllm.distributed import parallel_state

    groups = inspect.getsource(parallel_state.initialize_model_parallel)
    assert re.search(
        r"reshape\(\s*-1,\s*data_parallel_size,\s*pipeline_model_parallel_size,"
        r"(\s*prefill_context_model_parallel_size,)?\s*tensor_model_parallel_size",
        groups,
    )
    init = inspect.getsource(parallel_state.init_distributed_environment)
    assert "rank = parallel_config.data_parallel_rank * world_size + rank" in init


def test_vllm_runs_dense_data_parallel_engines_independently() -> None:
    """Why dense DP engines are never compared: vLLM's engine-core launcher keeps ``data_parallel_size > 1``
    in the workers' config only for MoE models (``DPEngineCoreProc``) and gives every other engine
    ``data_parallel_size = 1`` (0.33.0: ``reconfigure_for_independent_dp_rank``; older releases inline)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm.v1.engine.core")  # read, not imported: it needs serving extras
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    launcher = source[source.index("def run_engine_core(") :].split("\n    def ", 1)[0]
    assert "is_moe" in launcher and "DPEngineCoreProc(" in launcher
    independent = "reconfigure_for_independent_dp_rank" in launcher or "data_parallel_size = 1" in launcher
    assert independent
