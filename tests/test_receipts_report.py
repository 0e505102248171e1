"""Receipts (schema, atomic writes, many writers) and the report over the committed H200 study receipts."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from stable import assert_says

from vllm_staging_plugin._engine import receipts
from vllm_staging_plugin._offline import cli, receipt_reader
from vllm_staging_plugin._offline.report import ReportError, report, summarize

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "docs" / "data" / "h200-2026-11-29" / "receipts"


def sample(**overrides: Any) -> dict[str, Any]:
    base = {field: None for field in receipts.REQUIRED_FIELDS}
    base.update(
        schema=receipts.SCHEMA, kind="capture", ok=True, rank=0, pid=1, created_unix=1.0, presize="on"
    )
    return base | overrides


def test_receipt_round_trip_and_schema(tmp_path: Path) -> None:
    path = receipts.write_receipt(tmp_path / "new", sample(policy="ascending"))
    assert path.name.startswith("receipt-capture-") and "rank0" in path.name
    (loaded,) = receipt_reader.read_receipts(tmp_path)
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
    loaded = receipt_reader.read_receipts(tmp_path)
    assert sorted((r["rank"], r["capacity"]) for r in loaded) == [(w, i) for w in range(4) for i in range(25)]


def test_report_on_h200_receipts_is_exact() -> None:
    assert report(H200) == (Path(__file__).parent / "report-h200.golden").read_text().rstrip("\n")


def test_report_cells_match_the_study() -> None:
    rows = {(r.config.split()[1], r.arm, r.policy): r for r in summarize(receipt_reader.read_receipts(H200))}
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


# ---- bad input to `report`: partial copies, foreign files, missing or empty directories ---------------


def _skipped(directory: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    loaded = receipt_reader.read_receipts(directory, lambda path, why: seen.append((path.name, why)))
    return loaded, seen


def test_unreadable_and_foreign_receipts_are_skipped_one_warning_each(tmp_path: Path) -> None:
    good = receipts.write_receipt(tmp_path / "host-a", sample(policy="descending", pid=7))
    bad = {
        "receipt-torn.json": '{"schema": "vllm-staging-plugin/receipt/v1", "kind": "cap',  # partial copy
        "receipt-notjson.json": "{not json",
        "receipt-other.json": json.dumps({"schema": "someone-else/v3", "kind": "capture"}),
        "receipt-list.json": "[1, 2]",
        "receipt-number.json": "7",
        "receipt-short.json": json.dumps({"schema": receipts.SCHEMA, "kind": "capture"}),
        "receipt-binary.json": b"\xff\xfe\x00",
    }
    for name, content in bad.items():
        target = tmp_path / "host-b" / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "host-b" / "r1.json").write_text("{corrupt")  # not named like a receipt: still read
    (tmp_path / "host-b" / "notes.txt").write_text("not JSON by name: not read")
    (tmp_path / "host-a" / ".tmp-abc.json").write_text('{"half')  # a receipt being written: ignored
    loaded, seen = _skipped(tmp_path)
    assert [r["pid"] for r in loaded] == [7] and good.exists()
    assert sorted(name for name, _ in seen) == sorted([*bad, "r1.json"])  # each once, named
    why = dict(seen)
    assert why["receipt-notjson.json"].startswith("not JSON") and why["receipt-torn.json"].startswith(
        "not JSON"
    )
    assert (
        "schema: 'someone-else/v3'" in why["receipt-other.json"]
        and "(a JSON list, not an object)" in why["receipt-list.json"]
        and "(a JSON number, not an object)" in why["receipt-number.json"]
    )
    assert why["receipt-short.json"].startswith("incomplete receipt, lacks fields: ")
    assert why["receipt-binary.json"].startswith("unreadable (UnicodeDecodeError")


def test_skipped_files_warn_through_the_plugin_logger_by_default(tmp_path: Path, plugin_log: Any) -> None:
    (tmp_path / "receipt-x.json").write_text("{not json")
    assert receipt_reader.read_receipts(tmp_path) == []
    assert (
        len(plugin_log.warnings) == 1
        and f"skipped {tmp_path / 'receipt-x.json'}: not JSON" in (plugin_log.warnings[0])
    )


def test_report_goes_on_past_a_bad_receipt(tmp_path: Path, capsys: Any) -> None:
    receipts.write_receipt(tmp_path, sample(policy="descending", graph_pool_reserved_bytes=2 * 2**20))
    (tmp_path / "receipt-bad.json").write_text("{not json")
    table = report(tmp_path)
    assert "plugin  descending  1/1   2.00 [2.00-2.00]" in table
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"vllm-staging-plugin report: skipped {tmp_path / 'receipt-bad.json'}"
    )


def test_cli_report_on_a_directory_of_only_bad_receipts_fails(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "receipt-a.json").write_text("{not json")
    (tmp_path / "receipt-b.json").write_text(json.dumps({"schema": "other"}))
    assert cli.main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3  # one warning per file, then the one line saying why nothing is reported
    assert_says(
        err[-1], f"vllm-staging-plugin report: no capture receipts in {tmp_path}", "2 file(s) skipped"
    )


@pytest.mark.parametrize("case", ["missing", "empty", "a file", "profiling only"])
def test_cli_report_without_capture_receipts_exits_non_zero(case: str, tmp_path: Path, capsys: Any) -> None:
    target = {"missing": tmp_path / "nonexistent", "a file": tmp_path / "receipt.json"}.get(case, tmp_path)
    if case == "a file":
        target.write_text("{}")
    if case == "profiling only":
        receipts.write_receipt(tmp_path, sample(kind="profiling"))
    expected = {
        "missing": f"no such directory: {target}",
        "a file": f"not a directory: {target}",
    }.get(case, f"no capture receipts in {target}")
    with pytest.raises(ReportError, match=expected):  # library callers get the exception ...
        report(target)
    code = 2 if case in ("missing", "a file") else 1  # no such folder: a bad argument, as the help says
    assert cli.main(["report", str(target)]) == code  # ... the command one line on stderr and its status
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    assert_says(line, f"vllm-staging-plugin report: {expected}")
    if case in ("empty", "profiling only"):  # says how receipts are made
        assert line.endswith(f"says whether it patches this vLLM) and STAGING_PLUGIN_RECEIPTS_DIR={target}")


def test_cli_report_names_the_folder_as_it_was_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "./nope"]) == 2
    assert capsys.readouterr().err == "vllm-staging-plugin report: no such directory: ./nope\n"


# ---- several ranks: one row per rank, each against its own rank's baseline --------------------------


def _ranked(rank: int, policy: str, pool_mib: int, **extra: Any) -> dict[str, Any]:
    return sample(
        rank=rank, policy=policy, graph_pool_reserved_bytes=pool_mib * 2**20, architecture="Qwen3",
        capture_sizes=[1, 2], **extra,
    )  # fmt: skip


def test_report_groups_receipts_per_rank(tmp_path: Path) -> None:
    for rank, (desc, asc) in enumerate([(10, 15), (4, 4)]):  # PP: rank 0 stages more than rank 1
        for _ in range(2):
            receipts.write_receipt(tmp_path, _ranked(rank, "descending", desc))
            receipts.write_receipt(tmp_path, _ranked(rank, "ascending", asc))
    rows = {(r.policy, r.rank): r for r in summarize(receipt_reader.read_receipts(tmp_path))}
    assert set(rows) == {(p, r) for p in ("descending", "ascending") for r in (0, 1)}
    assert {r.n for r in rows.values()} == {2}  # not 4: ranks are not pooled
    pool = "graph_pool_reserved_bytes"
    assert rows[("ascending", 0)].ratios[pool] == 1.5 and rows[("ascending", 1)].ratios[pool] == 1.0
    table = report(tmp_path).splitlines()
    assert table[1].split()[:4] == ["arm", "policy", "rank", "ok/N"]
    assert [line.split()[:4] for line in table[2:6]] == [
        ["plugin", "descending", "0", "2/2"],
        ["plugin", "descending", "1", "2/2"],
        ["plugin", "ascending", "0", "2/2"],
        ["plugin", "ascending", "1", "2/2"],
    ]
    assert "each rank is compared with its own rank's descending run" in table[-1]


def test_single_rank_report_has_no_rank_column(tmp_path: Path) -> None:
    receipts.write_receipt(tmp_path, _ranked(3, "descending", 10))
    table = report(tmp_path)
    assert "rank" not in table.splitlines()[1] and "own rank" not in table


GPU_2026_12_01 = ROOT / "docs" / "data" / "h200-2026-12-01"


def _real_captures(stage: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The recorded real-capture receipts of one stage, by (policy, presize)."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in receipt_reader.read_receipts(GPU_2026_12_01 / stage / "receipts"):
        if r["kind"] == "capture":
            cells.setdefault((r["policy"], r["presize"]), []).append(r)
    return cells


def test_recorded_eagle3_receipts_back_the_results() -> None:
    """docs/data/h200-2026-12-01/README.md, EAGLE3: stock 1-row aux buffers and the crash, plugin 512 rows,
    N = 3."""
    cells = _real_captures("eagle3")
    aux = {"hidden_states", "aux_hidden_states[0]", "aux_hidden_states[1]", "aux_hidden_states[2]"}
    assert {k: len(v) for k, v in cells.items()} == {
        ("ascending", "off-allow-crash"): 3, ("ascending", "on"): 3, ("descending", "on"): 3,
    }  # fmt: skip
    for (_policy, presize), items in cells.items():
        for r in items:
            full, piecewise = r["captured_sequence"]["FULL"], r["captured_sequence"]["PIECEWISE"]
            assert (len(full), max(full), len(piecewise), max(piecewise)) == (56, 504, 60, 512)
            assert all(n % 3 == 0 for n in full) and r["capacity"] == 512
            rows = {name: b["rows"] for name, b in r["staging_bytes"].items()}
            crashed = presize == "off-allow-crash"
            assert rows == dict.fromkeys(aux, 1 if crashed else 512)
            assert r["ok"] is not crashed
            assert crashed == ("must match the existing size (2)" in (r["error"] or ""))


def test_recorded_ray_receipts_carry_the_chosen_order() -> None:
    """docs/data/h200-2026-12-01/README.md, Ray: every Ray process that captured did so in the order set on
    the driver."""
    cells = _real_captures("ray")
    counts = {k: len(v) for k, v in cells.items()}
    assert counts == {("ascending", "off-allow-crash"): 1, ("ascending", "on"): 2}
    boots = {p.stem: json.loads(p.read_text()) for p in (GPU_2026_12_01 / "ray" / "boots").glob("*.json")}
    workers = [w for b in boots.values() for w in b.get("workers") or []]
    assert len(workers) == 2
    assert all(w["ray_actor_id"] and w["staging_plugin_order"] == "ascending" for w in workers)
    assert sorted(w["pid"] for w in workers) == sorted(r["pid"] for r in cells[("ascending", "on")])
    cluster = (GPU_2026_12_01 / "ray" / "ray-cluster.txt").read_text()
    assert cluster.rstrip().endswith("(none)")  # the raylet's environment held no plugin variable


@pytest.mark.parametrize(
    ("field", "value"),
    [("capture_sizes", 5), ("capture_sizes", [1, "2"]), ("graph_pool_reserved_bytes", "2 MiB"),
     ("capture_seconds", [0.5]), ("created_unix", None), ("pid", True)],
)  # fmt: skip
def test_a_receipt_with_a_field_of_the_wrong_type_is_skipped_not_a_crash(
    field: str, value: Any, tmp_path: Path, capsys: Any
) -> None:
    receipts.write_receipt(tmp_path, sample(policy="descending", graph_pool_reserved_bytes=2 * 2**20))
    (tmp_path / "receipt-odd.json").write_text(json.dumps(sample(policy="ascending", **{field: value})))
    assert cli.main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr()
    assert "plugin  descending  1/1   2.00 [2.00-2.00]" in text.out and "ascending" not in text.out
    assert text.err == (
        f"vllm-staging-plugin report: skipped {tmp_path / 'receipt-odd.json'}: "
        f"fields of the wrong type: {field}\n"
    )


@pytest.mark.parametrize("target", ["missing-folder/study.png", "study.nosuchformat"])
def test_a_plot_that_cannot_be_written_is_one_line_and_exit_2(
    target: str, tmp_path: Path, capsys: Any
) -> None:
    pytest.importorskip("matplotlib")
    receipts.write_receipt(tmp_path, sample(policy="descending", graph_pool_reserved_bytes=2 * 2**20))
    assert cli.main(["report", str(tmp_path), "--plot", str(tmp_path / target)]) == 2
    text = capsys.readouterr()
    (line,) = text.err.splitlines()
    assert_says(line, f"vllm-staging-plugin report: --plot {tmp_path / target}: ")
    assert text.out == "" and not (tmp_path / target).exists()


def test_a_plot_named_without_an_extension_is_a_png_and_says_so(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    receipts.write_receipt(tmp_path, sample(policy="descending", graph_pool_reserved_bytes=2 * 2**20))
    assert cli.main(["report", str(tmp_path), "--plot", str(tmp_path / "study")]) == 0
    written = tmp_path / "study.png"
    assert capsys.readouterr().out.endswith(f"plot written to {written}\n")
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "study").exists()
