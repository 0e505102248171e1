"""The atlas at real widths (docs/stock-crashes.md, "Atlas at real widths"): the recorded summary
docs/data/atlas/widths.json agrees with the family's condition wherever the grid is known without vLLM,
the doc's operator tables are the summary's, and the Kimi-K3 row replays as recorded on the installed vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from atlas import condition, probes, ranges, space
from atlas import tables as atlas_tables
from release import SIZES_STAGING

pytestmark = pytest.mark.extended  # the lab's own code: `pytest -m extended` (CI) runs it

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = json.loads((ROOT / "docs" / "data" / "atlas" / "widths.json").read_text())
ROW: dict[str, Any] = SUMMARY["releases"][0]
SEARCH: dict[str, Any] = SUMMARY["searches"]["widths"]


def operator_grid(name: str) -> tuple[int, ...] | None:
    """The sizes of a grid that does not depend on max_num_seqs or the width; None for vLLM-derived."""
    if name.startswith("max="):  # vLLM's steps below an operator-set max (no decode sizes appended)
        top = int(name[4:])
        grid = (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16))
        return tuple(s for s in grid if s <= top)
    return space.GRIDS.get(name)


def dense_crash(sizes: tuple[int, ...], ms: int, n: int) -> bool:
    setting = {
        "kda": True, "mode": "FULL_AND_PIECEWISE", "varlen": False, "sizes": sizes, "max_num_seqs": ms,
        "decode_query_len": n + 1, "schedule": space.tapered(ms, n),
    }  # fmt: skip
    return condition.predicted_crash(setting)


def test_the_recorded_run_is_clean() -> None:
    assert ROW["release"] == "0.33.0" and ROW["scope"] == "widths"
    assert ROW["plugin_boots"] == ROW["configurations"]
    for key in ("predicate_mismatches", "descriptor_rule_mismatches", "message_mismatches"):
        assert ROW[key] == 0, key
    assert ROW["sweep"]["mismatches"] == 0
    assert set(ROW["families"]) == {condition.FAMILY}


def test_the_sweep_is_the_condition_on_every_operator_grid() -> None:
    """Pure arithmetic: every recorded sweep cell of a grid known without vLLM is the condition's set (at
    a fixed width its reduced form, which the recorded run compared with the condition everywhere)."""
    checked = 0
    for grid in SEARCH["grids"]:
        sizes = operator_grid(grid)
        if sizes is None:
            continue
        cells = ROW["sweep"]["cells"][grid]
        for n in SEARCH["num_speculative_tokens"]:
            fixed = [ms for ms in range(1, 513) if condition.fixed_width_rule(sizes, ms, n + 1)]
            assert ranges.from_ranges(cells["fixed"][str(n)]) == fixed
            checked += 1
            if n < 2:
                assert str(n) not in cells.get("dense", {})
                continue
            dense = [ms for ms in range(2, 513) if dense_crash(sizes, ms, n)]
            assert ranges.from_ranges(cells["dense"][str(n)]) == dense
            checked += 1
    assert checked == 10 * 10 + 10 * 9  # ten operator grids, widths 1-10 fixed and 2-10 dense


def test_the_doc_carries_the_recorded_tables() -> None:
    doc = (ROOT / "docs" / "stock-crashes.md").read_text()
    tables = atlas_tables.operator_tables(ROW, SEARCH).split("\n\n")
    assert len(tables) == 5
    for table in tables[:3]:  # the sweep (fixed, dense) and the spotlight width's exact lists
        assert table in doc


def test_crash_ranges_names_runs_of_searched_values() -> None:
    searched = [1, 2, 4, 6, 8, 16, 32, 48, 64]
    assert atlas_tables.crash_ranges([], searched) == "-"
    assert atlas_tables.crash_ranges(searched, searched) == "all"
    assert atlas_tables.crash_ranges([1, 2, 4, 6], searched) == "<=6"
    assert atlas_tables.crash_ranges([1, 2, 6], searched) == "<=2, 6"
    assert atlas_tables.crash_ranges([32, 48, 64], searched) == ">=32"
    assert atlas_tables.crash_ranges([4, 6, 8], searched) == "4-8"  # consecutive searched values, not 5 or 7
    assert ranges.as_ranges([1, 2, 3, 5, 9, 10]) == "1-3,5,9-10"
    assert ranges.from_ranges("1-3,5,9-10") == [1, 2, 3, 5, 9, 10]
    assert atlas_tables.sweep_cell("1-56") == "1-56" and atlas_tables.sweep_cell("1-7,9-15") == "14 in 1-15"


@pytest.mark.contract
def test_the_kimi_k3_row_replays_as_recorded() -> None:
    """8 speculative tokens, max_num_seqs 48, powers of two to 512, recover-SSM: stock crashes at the
    first FULL descriptor, (256) against (261); the plugin boots with 261-row buffers."""
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    from vllm_staging_plugin._offline import cpu_replay

    recorded = ROW["spotlight"]["grids"][space.SPOTLIGHT["grid"]]
    assert recorded["sequence"] == {
        "PIECEWISE": [256, 128, 64, 32, 16, 8, 4, 2, 1],
        "FULL": [261, 135, 72, 36, 18, 9],
    }
    cfg = probes.KnobbedReplay(
        mode="FULL_AND_PIECEWISE", sizes=space.GRIDS[space.SPOTLIGHT["grid"]], max_num_seqs=48,
        decode_query_len=9, hidden_size=space.HIDDEN, use_kda_recoverssm=True,
    )  # fmt: skip
    stock, patched = cpu_replay.replay(cfg, patched=False), cpu_replay.replay(cfg, patched=True)
    assert stock.sequence == recorded["sequence"]  # the same plan on 0.34.0 (decode graphs by requests)
    if SIZES_STAGING:  # vLLM 0.34.0 sizes the buffers by the largest descriptor itself: stock boots
        assert stock.ok and {b["rows"] for b in stock.buffers.values()} == {261}
    else:
        assert not stock.ok
        assert "The expanded size of the tensor (256) must match the existing size (261)" in (
            stock.error or ""
        )
    assert patched.ok and {b["rows"] for b in patched.buffers.values()} == {261}
