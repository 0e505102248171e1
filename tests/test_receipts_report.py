"""Receipts (schema, atomic writes, many writers) and the report over the committed H200 study receipts."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from vllm_staging_plugin import receipts
from vllm_staging_plugin.report import report, summarize

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "docs" / "data" / "h200-2026-11-29" / "receipts"


def sample(**overrides: Any) -> dict[str, Any]:
    base = {field: None for field in receipts.REQUIRED_FIELDS}
    base.update(schema=receipts.SCHEMA, kind="capture", ok=True, rank=0, pid=1, created_unix=1.0)
    return base | overrides


def test_receipt_round_trip_and_schema(tmp_path: Path) -> None:
    path = receipts.write_receipt(tmp_path / "new", sample(policy="ascending"))
    assert path.name.startswith("receipt-capture-") and "rank0" in path.name
    (loaded,) = receipts.read_receipts(tmp_path)
    assert loaded["policy"] == "ascending" and set(receipts.REQUIRED_FIELDS) <= set(loaded)
    with pytest.raises(ValueError, match="receipt lacks fields: capacity"):
        receipts.write_receipt(tmp_path, {k: v for k, v in sample().items() if k != "capacity"})


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(receipts.json, "dump", explode)
    with pytest.raises(OSError, match="disk full"):
        receipts.write_receipt(tmp_path, sample())
    assert list(tmp_path.iterdir()) == []  # neither a receipt nor a temporary file


def _write_many(directory: str, worker: int, count: int) -> None:
    for i in range(count):
        receipts.write_receipt(Path(directory), sample(rank=worker, capacity=i))


def test_many_processes_share_one_directory(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 100 and not [n for n in names if n.startswith(".tmp-")]
    loaded = receipts.read_receipts(tmp_path)
    assert sorted((r["rank"], r["capacity"]) for r in loaded) == [(w, i) for w in range(4) for i in range(25)]


def test_report_on_h200_receipts_is_exact() -> None:
    assert report(H200) == (Path(__file__).parent / "report-h200.golden").read_text().rstrip("\n")


def test_report_cells_match_the_study() -> None:
    rows = {(r.config.split()[1], r.arm, r.policy): r for r in summarize(receipts.read_receipts(H200))}
    assert len(rows) == 16 and {r.n for r in rows.values()} == {3}  # 2 shapes x 4 orders x 2 arms, N = 3
    crashed = {key for key, r in rows.items() if r.ok == 0}
    assert crashed == {(h, "stock", p) for h in ("h=1024", "h=4096") for p in ("ascending", "shuffle:1")}
    assert all(r.ok == 3 for key, r in rows.items() if key not in crashed)
    stock_desc, plugin_asc = rows[("h=4096", "stock", "descending")], rows[("h=4096", "plugin", "ascending")]
    pool = "graph_pool_reserved_bytes"
    assert stock_desc.stats[pool].median == 74 * 2**20 and plugin_asc.stats[pool].median == 112 * 2**20
    assert plugin_asc.ratios[pool] == pytest.approx(112 / 74)


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "study.png"
    report(H200, target)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 10_000


def test_report_on_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "receipt-x.json").write_text(json.dumps({"schema": "other"}))
    assert report(tmp_path) == f"no capture receipts in {tmp_path}"
