"""The pre-flight's way out without the plugin, and parallel layouts on a machine without a GPU.

The grid change is found by growing the operator's grid and verified by replaying stock vLLM on the
rewritten ``vllm serve`` arguments (vLLM 0.33.0's parser, config and real manager). The property test
drives the same search with the manager-level replay over the widths Kimi deployments use; the end-to-end
tests run the published Kimi-K3 structure at tensor-parallel size 8 and pass the answer back to ``check``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from configs import K3, NO_WEIGHTS, QWEN3_0_6B, model_folder
from release import SIZES_STAGING

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

from atlas import probes
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._offline.cli import main
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig
from vllm_staging_plugin._offline.preflight import workaround

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache")]
FEATURES = probes.manager_features()
POWERS_TO_512 = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
K3_WIDTHS = [  # 8 speculative tokens (decode_query_len 9), 48 sequences, a power-of-two grid: (256) vs (261)
    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}',
    "--use-replayssm", "--max-num-seqs", "48", "-cc", json.dumps({"cudagraph_capture_sizes": POWERS_TO_512}),
]  # fmt: skip

# The workaround exists where stock vLLM crashes at the staging copy: vLLM 0.18.0-0.33.0. On a vLLM that sizes
# its staging itself (0.34.0) there is none to find (tests/test_preflight.py pins that it is absent).
lazy_staging = pytest.mark.skipif(SIZES_STAGING, reason="this vLLM sizes its staging buffers itself")


def check_json(capsys: Any, *words: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "--json", *words])
    return code, json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------ rewriting the arguments


def test_the_grid_replaces_every_grid_option_and_keeps_the_rest() -> None:
    grid = [1, 2, 9]
    cc = json.dumps({"mode": 3, "cudagraph_capture_sizes": [1, 2], "max_cudagraph_capture_size": 2})
    assert workaround.with_grid(["m", "-cc", cc, "--max-num-seqs", "4"], grid) == [
        "m", "-cc", json.dumps({"mode": 3, "cudagraph_capture_sizes": grid}), "--max-num-seqs", "4",
    ]  # fmt: skip
    assert workaround.with_grid(["m", f"--compilation-config={cc}"], grid) == [
        "m", f"--compilation-config={json.dumps({'mode': 3, 'cudagraph_capture_sizes': grid})}",
    ]  # fmt: skip
    expected = ["m", "--enforce-eager", "-cc", json.dumps({"cudagraph_capture_sizes": grid})]
    for words in (
        ["m", "--cudagraph-capture-sizes", "1", "2", "4", "--enforce-eager"],
        ["m", "--max-cudagraph-capture-size", "512", "--enforce-eager"],
        ["m", "--max-cudagraph-capture-size=512", "--enforce-eager"],
        ["m", "-cc.cudagraph_capture_sizes=[1,2]", "--enforce-eager"],
        ["m", "-cc.max_cudagraph_capture_size", "16", "--enforce-eager"],
        ["m", "--enforce-eager"],
    ):
        assert workaround.with_grid(words, grid) == expected, words


def test_the_width_changes_only_in_a_json_speculative_config() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 8}
    assert workaround.with_speculative_tokens(["m", "--speculative-config", json.dumps(spec)], 7) == [
        "m", "--speculative-config", json.dumps(spec | {"num_speculative_tokens": 7}),
    ]  # fmt: skip
    tiers = spec | {"num_speculative_tokens_per_batch_size": [[1, 4, 8]]}
    assert workaround.with_speculative_tokens(["m", "--speculative-config", json.dumps(tiers)], 7) is None
    assert workaround.with_speculative_tokens(["m", "--max-num-seqs", "4"], 7) is None


# ------------------------------------------------------------ the search on the atlas's crash families


def _grid_of(words: Sequence[str]) -> list[int]:
    return list(json.loads(words[words.index("-cc") + 1])["cudagraph_capture_sizes"])


@st.composite
def crashing(draw: st.DrawFn) -> ReplayConfig:
    """Recover-SSM configurations at the widths Kimi deployments use (1-10 speculative tokens, up to 512
    sequences, the atlas's grid families); only those where stock crashes in vLLM's own order are kept."""
    n = draw(st.integers(1, 10))
    seqs = draw(st.sampled_from([1, 2, 4, 6, 8, 16, 32, 48, 64, 128, 256, 512]))
    schedule = None
    if FEATURES["dense_schedule"] and n >= 2 and seqs >= 2 and draw(st.booleans()):
        half = draw(st.integers(1, seqs - 1))
        schedule = ((1, half, n), (half + 1, seqs, draw(st.integers(0, n - 1))))
    family = draw(st.sampled_from(["pow2-512", "pow2-1024", "step8", "derived", "top", "random"]))
    if family.startswith("pow2"):
        sizes = [2**i for i in range(11 if family == "pow2-1024" else 10)]
    elif family == "step8":
        sizes = list(range(8, 513, 8))
    elif family == "random":
        sizes = draw(st.lists(st.integers(1, 600), min_size=1, max_size=12, unique=True))
    else:
        limit = draw(st.sampled_from([256, 512, 1024])) if family == "top" else None
        sizes = probes.derived_capture_sizes(seqs, n, schedule, limit)
    cfg = probes.KnobbedReplay(
        sizes=tuple(sizes), max_num_seqs=seqs, decode_query_len=n + 1, hidden_size=8,
        use_kda_recoverssm=True, speculative_schedule=schedule,
    )  # fmt: skip
    return cfg


@lazy_staging
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])  # fmt: skip
@given(cfg=crashing())
def test_for_every_stock_crash_the_grid_found_boots_stock(cfg: ReplayConfig) -> None:
    if not FEATURES["kda_recoverssm"]:
        pytest.skip("this vLLM release has no KDA recover-SSM cap")
    try:
        stock = cpu_replay.replay(cfg, patched=False)
    except ValueError:  # vLLM's own validation refuses it: never reaches capture
        assume(False)
    assume(not stock.ok)

    def stock_check(words: Sequence[str]) -> tuple[bool, dict[str, list[int]], list[int]]:
        grid = _grid_of(words)
        again = cpu_replay.replay(dataclasses.replace(cfg, sizes=tuple(grid)), patched=False)
        return again.ok, again.sequence, sorted(grid)

    tiers = [1 + tokens for *_, tokens in cfg.speculative_schedule or ()]
    lengths = [cfg.decode_query_len, *tiers]
    fix = workaround.find(
        ["model"], sorted(cfg.sizes), stock.sequence, stock_check, cfg.decode_query_len - 1, lengths
    )
    assert fix.verified, fix.note
    assert set(cfg.sizes) < set(fix.cudagraph_capture_sizes)  # every size the operator asked for is kept
    assert fix.extra_graphs >= 1
    added = set(fix.cudagraph_capture_sizes) - set(cfg.sizes)
    assert max(added) >= stock.capacity  # a PIECEWISE size at least as wide as the widest FULL descriptor
    rerun = cpu_replay.replay(dataclasses.replace(cfg, sizes=tuple(fix.cudagraph_capture_sizes)), False)
    assert rerun.ok and rerun.capacity >= stock.capacity


# ------------------------------------------------------------- end to end through vLLM 0.33.0's parser


@lazy_staging
@pytest.mark.usefixtures("offline")
def test_kimi_k3_at_tp8_gets_a_verified_workaround_that_boots_stock_when_passed_back(
    tmp_path: Path, capsys: Any
) -> None:
    """The published Kimi-K3 structure (4 layers, MXFP4 compressed-tensors quantization kept) at the K3
    deployment widths and tensor-parallel size 8, on a machine without a GPU."""
    model = model_folder(tmp_path / "kimi-k3", K3)
    argv = [model, *NO_WEIGHTS, *K3_WIDTHS, "--tensor-parallel-size", "8"]
    code, out = check_json(capsys, "--", *argv)
    assert code == 0, out
    assert out["architecture"] == "KimiK3ForConditionalGeneration" and out["use_kda_recoverssm"]
    assert out["platform"]["emulated"] and out["platform"]["gpus"] == 8
    assert out["parallel"]["tensor_parallel_size"] == 8 and out["parallel"]["world_size"] == 8
    assert out["sequence"] == {
        "PIECEWISE": [256, 128, 64, 32, 16, 8, 4, 2, 1],
        "FULL": [261, 135, 72, 36, 18, 9],
    }
    assert "The expanded size of the tensor (256) must match the existing size (261)" in out["stock"]["error"]
    assert out["plugin"]["ok"] and out["plugin"]["buffers"]["hidden_states"]["rows"] == 261
    fix = out["stock_workaround"]
    assert fix["verified"] and fix["extra_graphs"] == 1 and fix["nearby_widths"] == [7]
    assert fix["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 261, 512]
    assert (
        fix["argument"] == f"-cc '{json.dumps({'cudagraph_capture_sizes': fix['cudagraph_capture_sizes']})}'"
    )

    code, again = check_json(capsys, "--", *fix["serve_arguments"])
    assert code == 0 and again["stock"]["ok"] and again["stock_workaround"] is None
    assert again["capture_sizes"] == fix["cudagraph_capture_sizes"]
    assert again["sequence"]["PIECEWISE"][0] == 261 and again["identical_to_stock"] is True


@lazy_staging
@pytest.mark.usefixtures("offline")
def test_the_text_report_prints_the_ready_argument(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "kimi-k3", K3)
    assert main(["check", "--", model, *NO_WEIGHTS, *K3_WIDTHS]) == 0
    out = capsys.readouterr().out
    assert "without the plugin: give vLLM this grid instead of yours (1 more CUDA graph; stock vLLM " in out
    assert "  -cc '{\"cudagraph_capture_sizes\": [1, 2, 4, 8, 16, 32, 64, 128, 256, 261, 512]}'" in out
    assert "or keep your grid with 7 speculative tokens: stock vLLM boots that too" in out


@pytest.mark.usefixtures("offline")
def test_stock_safe_configurations_get_no_workaround(tmp_path: Path, capsys: Any) -> None:
    code, out = check_json(capsys, "--", model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    assert code == 0 and out["stock"]["ok"] and out["stock_workaround"] is None


# ------------------------------------------------------------------------- parallel layouts on CPU


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize(
    ("layout", "gpus", "stages"),
    [
        (["--tensor-parallel-size", "8"], 8, [(0, "hidden_states")]),
        (["--pipeline-parallel-size", "2"], 2, [(0, "intermediate_tensors"), (1, "hidden_states")]),
        (["--pipeline-parallel-size", "4", "--tensor-parallel-size", "2"], 8,
         [(0, "intermediate_tensors"), (1, "intermediate_tensors"), (3, "hidden_states")]),
        (["--data-parallel-size", "2", "--tensor-parallel-size", "4"], 8, [(0, "hidden_states")]),
        (["--tensor-parallel-size", "16", "--nnodes", "2"], 8, [(0, "hidden_states")]),
    ],
)  # fmt: skip
def test_parallel_layouts_are_inspected_without_a_gpu(
    layout: list[str], gpus: int, stages: list[tuple[int, str]], tmp_path: Path, capsys: Any
) -> None:
    code, out = check_json(capsys, "--", model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS, *layout)
    assert code == 0, out
    assert out["platform"]["gpus"] == gpus
    assert [(s["stage"], s["staged"]) for s in out["pipeline_stages"]] == stages
    for stage in out["pipeline_stages"]:
        assert stage["stock_ok"] and stage["plugin_ok"]
        names = set(stage["buffers"])
        if stage["staged"] == "hidden_states":
            assert names == {"hidden_states"}
        else:  # every rank before the last stages the tensors it sends on
            assert names and all(name.startswith("intermediate_tensors[") for name in names)
    assert out["ranks_replayed"].startswith("replayed ")


@pytest.mark.usefixtures("offline")
def test_a_layout_larger_than_the_declared_node_is_vllms_refusal(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    code, out = check_json(capsys, "--gpus", "4", "--", model, *NO_WEIGHTS, "--tensor-parallel-size", "8")
    assert code == 2 and out["error"] == "bad arguments"
    assert out["message"].startswith(
        "ParallelConfig: World size (8) is larger than the number of available GPUs (4) in this node."
    )
    assert "\n" not in out["message"]
