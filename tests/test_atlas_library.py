"""The atlas library (``lab/atlas/``): the summary's layout and verdict as pure functions; the
per-configuration replay against the installed vLLM's real manager on CPU; the widths search's cells; the
driver's worker protocol and ordering; the overlay's pinned-package list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from atlas import probes, replay, summary
from atlas.condition import FAMILY
from atlas.space import GRIDS, SEARCHES, replay_config
from release import SIZES_STAGING

pytestmark = pytest.mark.extended  # the lab's own code: `pytest -m extended` (CI) runs it

CLEAN: dict[str, Any] = {"plugin_failures": 0, "predicate_mismatches": 0}

# The atlas maps where vLLM's lazy staging crashes (0.18.0-0.33.0). A vLLM that sizes its staging itself
# (0.34.0) has no such crash to map: tests/test_atlas_widths.py and tests/test_properties.py pin that.
lazy_staging = pytest.mark.skipif(SIZES_STAGING, reason="this vLLM sizes its staging buffers itself")


def setting(**changes: Any) -> dict[str, Any]:
    """A FULL_AND_PIECEWISE configuration at the small recover-SSM settings (n-gram 2, 4 sequences)."""
    return {
        "mode": "FULL_AND_PIECEWISE", "sizes": (1, 2, 4, 8, 16), "max_num_seqs": 4, "decode_query_len": 3,
        "lora": None, "kda": True, "varlen": False, "dbo": False, "schedule": None,
    } | changes  # fmt: skip


def test_the_summary_names_its_grids_once_and_compacts_searches_per_scope(tmp_path: Path) -> None:
    rows = [
        {"release": "0.32.0", "scope": "subset", "search": {"s": 1}, "features": {"f": True}, "skipped": [],
         **CLEAN},
        {"release": "0.33.0", "scope": "full", "search": {"s": 2}, "features": {}, "skipped": ["x"], **CLEAN},
    ]  # fmt: skip
    built = summary.build("cmd", "0.33.0", ["0.32.0", "0.33.0"], lambda r: "widths", rows, 12.345)
    assert built["seconds"] == 12.3 and built["custom_grids"] == {k: list(v) for k, v in GRIDS.items()}
    assert set(built["custom_grids"]) == set(SEARCHES["widths"].grids)
    path = tmp_path / "deep" / "summary.json"
    summary.write(built, path)
    written = json.loads(path.read_text())
    assert written["searches"] == {"subset": {"s": 1}, "full": {"s": 2}}
    assert written["releases"] == [
        {"release": "0.32.0", "scope": "subset", **CLEAN},  # empty lists and the per-scope data dropped
        {"release": "0.33.0", "scope": "full", "skipped": ["x"], **CLEAN},
    ]
    assert path.read_text().count("\n") == 1  # compact: one line


@pytest.mark.parametrize(
    "bad",
    [{"error": "boom"}, {"plugin_failures": 1}, {"predicate_mismatches": 2},
     {"descriptor_rule_mismatches": 1}, {"message_mismatches": 1}, {"sweep": {"mismatches": 3}}],
)  # fmt: skip
def test_any_failure_or_mismatch_fails_the_run(bad: dict[str, Any]) -> None:
    assert not summary.failed([dict(CLEAN), {**CLEAN, "sweep": {"mismatches": 0}}])
    assert summary.failed([dict(CLEAN), {**CLEAN, **bad}])


def test_a_crash_is_named_by_vllms_rule_or_reported_unexplained() -> None:
    capped = {"sequence": {"PIECEWISE": [8, 4, 2, 1], "FULL": [9, 6, 3]}, "capacity": 9}
    assert replay.family(capped, setting()) == FAMILY
    assert replay.family(capped, setting(kda=False)) == (
        "unexplained: FULL_AND_PIECEWISE, first PIECEWISE 8, capacity 9"
    )
    full_only = {"sequence": {"FULL": [4, 2, 1]}, "capacity": 4}
    assert replay.family(full_only, setting()).startswith("unexplained: FULL_AND_PIECEWISE, first FULL 4")


@lazy_staging
@pytest.mark.contract
def test_the_replay_of_one_configuration_is_vllms_own() -> None:
    """The small recover-SSM configuration through vLLM 0.33.0's real manager on CPU: PIECEWISE capped at
    12, FULL decode sizes rounded to 3, stock crashes (8) vs (9), the plugin holds 9 rows."""
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    cfg = replay_config(setting(), "only")
    assert dict((mode, [d.num_tokens for d in descs]) for mode, descs in replay.descriptors(cfg)) == {
        "PIECEWISE": [8, 4, 2, 1], "FULL": [9, 6, 3],
    }  # fmt: skip
    result = replay.outcome(cfg)
    assert not result["stock_ok"] and "(8) must match the existing size (9)" in str(result["stock_error"])
    assert result["plugin_ok"] and result["capacity"] == 9 and result["plugin_rows"] == [9]
    assert replay.family(result, setting()) == FAMILY


def test_a_releases_pins_are_the_lines_whose_span_holds_it_and_a_bad_line_is_named(tmp_path: Path) -> None:
    from atlas import overlay

    sha = "0" * 64
    listed = tmp_path / "pins.txt"
    lines = [
        "# why",
        f"0.14.0-0.17.1 gguf==0.17.1 --hash=sha256:{sha}",
        "",
        f"0.16.0 tiktoken==0.9.0 --hash=sha256:{sha}",
    ]
    listed.write_text("\n".join(lines) + "\n")
    assert overlay.pins("0.18.0", listed) == []
    assert overlay.pins("0.16.0", listed) == [
        f"gguf==0.17.1 --hash=sha256:{sha}",
        f"tiktoken==0.9.0 --hash=sha256:{sha}",
    ]
    listed.write_text("0.16.0 gguf>=0.17\n")
    with pytest.raises(ValueError, match=r"pins.txt:1: not 'RELEASES name==version --hash=sha256:HEX'"):
        overlay.pins("0.16.0", listed)


def test_the_driver_parses_a_workers_row_and_reports_a_worker_that_printed_none(tmp_path: Path) -> None:
    import sys

    from atlas import driver

    def release_env(version: str) -> tuple[dict[str, str], dict[str, object], str]:
        verdict = "refused" if version == "0.17.1" else "supported"
        return {"PATH": "/usr/bin:/bin"}, {"verdict": verdict, "why": "no class"}, "torch==2.10.0"

    row = {"release": "0.32.0", "configurations": 3}
    speaks = [sys.executable, "-c", f"print({driver.worker_line(row)!r})"]
    common = {"memo": True, "with_sweep": False, "release_env": release_env, "cwd": tmp_path}
    assert driver.run_release("0.33.0", "full", installed="0.33.0", worker=speaks, **common) == row
    assert driver.run_release("0.32.0", "subset", installed="0.33.0", worker=speaks, **common) == row
    refused = driver.run_release("0.17.1", "subset", installed="0.33.0", worker=speaks, **common)
    assert refused == {"release": "0.17.1", "error": "plugin verdict refused: no class"}
    silent = [sys.executable, "-c", "import sys; sys.stderr.write('boom')"]
    assert driver.run_release("0.33.0", "full", installed="0.33.0", worker=silent, **common) == {
        "release": "0.33.0",
        "error": "boom",
    }


def test_the_driver_starts_full_searches_first_and_returns_rows_in_release_order() -> None:
    import threading

    from atlas import driver

    started: list[str] = []
    lock = threading.Lock()

    def run(release: str, scope: str) -> dict[str, Any]:
        with lock:
            started.append(release)
        return {"release": release, "scope": scope}

    releases = ["0.30.0", "0.31.0", "0.33.0"]
    rows = list(driver.run_releases(releases, lambda r: "full" if r == "0.33.0" else "subset", 1, run))
    assert [r["release"] for r in rows] == releases and started[0] == "0.33.0"
    assert [r["scope"] for r in rows] == ["subset", "subset", "full"]


def test_a_widths_cell_records_each_crashing_max_num_seqs_and_the_spotlight_keeps_its_plan() -> None:
    from atlas import search
    from atlas.space import SPOTLIGHT

    cells: dict[str, Any] = {}
    spotlight: dict[str, Any] = {}
    n = SPOTLIGHT["num_speculative_tokens"]
    k3 = {
        **setting(max_num_seqs=SPOTLIGHT["max_num_seqs"], decode_query_len=1 + n),
        "grid": SPOTLIGHT["grid"],
    }
    crashed = {"stock_ok": False, "stock_error": "RuntimeError: (256) vs (261)", "plugin_ok": True,
               "plugin_rows": 261, "sequence": {"PIECEWISE": [256, 1], "FULL": [261, 9]}}  # fmt: skip
    search.record_cell(cells, spotlight, k3, crashed)
    search.record_cell(cells, spotlight, {**k3, "max_num_seqs": 3}, {**crashed, "stock_ok": True})
    assert cells == {SPOTLIGHT["grid"]: {"fixed": {n: [SPOTLIGHT["max_num_seqs"]]}}}
    entry = spotlight["grids"][SPOTLIGHT["grid"]]
    assert (entry["piecewise_top"], entry["full_top"], entry["plugin_rows"]) == (256, 261, 261)
    assert entry["sequence"] == crashed["sequence"] and not entry["stock_ok"]


@lazy_staging
def test_a_search_on_the_installed_vllm_counts_every_configuration_and_names_the_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tiny search (recover-SSM on and off at n-gram 2, 4 sequences, the derived grid and max 16) through
    ``run_search``: every configuration counted once, each stock crash in the family the condition names,
    the plugin booting them all, and the recorded example the smallest crash."""
    from atlas import search, space

    tiny = space.Search((4,), (2,), ("only",), modes=("FULL_AND_PIECEWISE",), max_grids=(16,), grids=(),
                        lora_and_dbo=False)  # fmt: skip
    monkeypatch.setitem(space.SEARCHES, "tiny", tiny)
    row = search.run_search("tiny", memo=True, with_sweep=False)
    assert row["configurations"] == row["stock_boots"] + row["stock_crashes"] == row["plugin_boots"] > 0
    assert row["plugin_failures"] == row["predicate_mismatches"] == 0
    assert row["distinct_replays"] <= row["configurations"]
    assert (
        set(row["families"]) == {FAMILY} and row["families"][FAMILY]["configurations"] == row["stock_crashes"]
    )
    example = row["families"][FAMILY]["example"]
    assert (example["max_num_seqs"], example["decode_query_len"], example["kda"]) == (4, 3, True)
    assert "(8) must match the existing size (9)" in example["stock_error"] and example["plugin_rows"] == [9]


@lazy_staging
def test_the_sweep_reads_the_real_managers_descriptors_and_counts_what_disagrees_with_the_condition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The widths sweep on the installed vLLM over max_num_seqs 1-12 at n-gram 1 and 2 on one operator grid:
    every family setting counted once, its cells the condition's sets (fixed widths: the reduced rule too),
    no mismatch; a condition that answers wrong is counted and shown, at most five examples."""
    from atlas import condition, ranges, search, space

    grid = "cc=[1,2,4,8,16]"
    tiny = space.Search((1,), (1, 2), ("only",), modes=("FULL_AND_PIECEWISE",), max_grids=(), grids=(grid,),
                        derived_ceilings=(), lora_and_dbo=False)  # fmt: skip
    monkeypatch.setattr(search, "SWEEP_MAX_NUM_SEQS", tuple(range(1, 13)))
    feats = probes.manager_features()
    row = search.sweep(tiny, feats)
    sizes = GRIDS[grid]
    fixed = {n: [ms for ms in range(1, 13) if condition.fixed_width_rule(sizes, ms, n + 1)] for n in (1, 2)}
    assert fixed == {1: [], 2: [1, 2, 3, 4, 5]}  # the grid's 2, 4 and 8 are no multiple of 3
    tapered = [setting(sizes=sizes, max_num_seqs=ms, decode_query_len=3, schedule=space.tapered(ms, 2))
               for ms in range(2, 13)]  # fmt: skip
    dense = [s["max_num_seqs"] for s in tapered if condition.predicted_crash(s)]
    assert row["max_num_seqs"] == [1, 12] and row["mismatches"] == 0 and row["mismatch_examples"] == []
    assert row["configurations"] == 12 * 2 + 11 * feats["dense_schedule"]
    assert row["crashes"] == len(fixed[1]) + len(fixed[2]) + len(dense) * feats["dense_schedule"]
    cells = row["cells"][grid]
    assert {n: ranges.from_ranges(cells["fixed"][n]) for n in (1, 2)} == fixed
    if feats["dense_schedule"]:
        assert ranges.from_ranges(cells["dense"][2]) == dense == [2, 3, 4, 5]

    monkeypatch.setattr(search, "predicted_crash", lambda s: not condition.predicted_crash(s))
    wrong = search.sweep(tiny, feats)
    assert wrong["mismatches"] == wrong["configurations"] and len(wrong["mismatch_examples"]) == 5


def test_the_overlay_probe_gives_the_plugins_verdict_on_the_installed_vllm() -> None:
    from atlas import probe

    from vllm_staging_plugin._engine import compat

    assert probe.verdict() == {
        "version": compat.installed_versions()["vllm"], "verdict": "supported", "why": "structure present",
    }  # fmt: skip
