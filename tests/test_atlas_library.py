"""The atlas library's summary (``_offline/atlas/summary.py``) and its per-configuration replay
(``_offline/atlas/replay.py``): the summary's layout and verdict as pure functions; the replay against the
installed vLLM's real manager on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_staging_plugin._offline.atlas import replay, summary
from vllm_staging_plugin._offline.atlas.condition import FAMILY
from vllm_staging_plugin._offline.atlas.space import GRIDS, SEARCHES, replay_config

CLEAN: dict[str, Any] = {"plugin_failures": 0, "predicate_mismatches": 0}


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
