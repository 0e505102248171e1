"""What the atlas prints: one line per release as it finishes, the per-release markdown table of
docs/stock-crashes.md, and the widths search's operator tables (tests/test_atlas_widths.py checks that
the doc carries them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from .driver import Row
from .ranges import from_ranges
from .space import SPOTLIGHT


def sweep_summary(sweep: dict[str, Any]) -> str:
    return (
        f"max_num_seqs {sweep['max_num_seqs'][0]}-{sweep['max_num_seqs'][1]}: "
        f"configs={sweep['configurations']} "
        f"crashes={sweep['crashes']} mismatches={sweep['mismatches']} ({sweep['seconds']}s)"
    )


def row_line(row: Row) -> str:
    """One release's progress line."""
    if "error" in row:
        return f"{row['release']:<8} ERROR {row['error']}"
    fams = ", ".join(f"{k} {v['configurations']}" for k, v in row["families"].items()) or "none"
    return (
        f"{row['release']:<8} {row['scope']:<6} configs={row['configurations']:<6} "
        f"stock crashes={row['stock_crashes']:<5} plugin boots={row['plugin_boots']}/{row['configurations']} "
        f"mismatches={row['predicate_mismatches']} families: {fams} ({row['seconds']}s)"
        + (f"; sweep {sweep_summary(row['sweep'])}" if row.get("sweep") else "")
    )


def markdown(rows: Sequence[Row]) -> str:
    """The per-release table of docs/stock-crashes.md."""
    lines = [
        "| release | search | configurations | managers built | distinct replays | stock crashes (own order) "
        "| families | plugin boots | condition mismatches | knobs absent |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['release']} | error: {r['error'][:80]} |")
            continue
        fams = ", ".join(f"`{k}` {v['configurations']}" for k, v in r["families"].items()) or "none"
        absent = ", ".join(s.split(":")[0] for s in r.get("skipped", [])) or "-"
        lines.append(
            f"| {r['release']} | {r['scope']} | {r['configurations']} | {r['managers_built']} "
            f"| {r['distinct_replays']} | {r['stock_crashes']} | {fams} "
            f"| {r['plugin_boots']}/{r['configurations']} | {r['predicate_mismatches']} | {absent} |"
        )
    total = Counter[str]()
    for r in rows:
        if "error" not in r:
            total.update({k: r[k] for k in ("configurations", "managers_built", "distinct_replays")})
            total.update({k: r[k] for k in ("stock_crashes", "plugin_boots", "predicate_mismatches")})
    lines.append(
        f"| **all** | | {total['configurations']} | {total['managers_built']} | {total['distinct_replays']} "
        f"| {total['stock_crashes']} | | {total['plugin_boots']}/{total['configurations']} "
        f"| {total['predicate_mismatches']} | |"
    )
    return "\n".join(lines)


def crash_ranges(crashing: Sequence[int], searched: Sequence[int]) -> str:
    """The crashing max_num_seqs among the searched ones, as runs of consecutive searched values:
    "-" none, "all", "<=48" (every searched value up to 48), ">=6", "6-48", or a list of those."""
    if not crashing:
        return "-"
    hit = set(crashing)
    runs: list[list[int]] = []
    for i, ms in enumerate(searched):
        if ms in hit:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    last = len(searched) - 1
    parts = []
    for run in runs:
        lo, hi = searched[run[0]], searched[run[-1]]
        if run[0] == 0 and run[-1] == last:
            parts.append("all")
        elif run[0] == 0:
            parts.append(f"<={hi}" if lo != hi else f"{lo}")
        elif run[-1] == last:
            parts.append(f">={lo}" if lo != hi else f"{lo}")
        else:
            parts.append(f"{lo}-{hi}" if lo != hi else f"{lo}")
    return ", ".join(parts)


def sweep_cell(ranges: str | None) -> str:
    """One operator-table cell: "-" (none crash), "1-56" (one run), or "49 in 1-56" (49 values, none
    above 56)."""
    if ranges is None:
        return "n/a"
    values = from_ranges(ranges)
    if not values:
        return "-"
    if "," not in ranges:
        return ranges
    return f"{len(values)} in {values[0]}-{values[-1]}"


def operator_tables(row: Row, search: dict[str, Any]) -> str:
    """The widths search's operator tables (FULL_AND_PIECEWISE, recover-SSM on): per grid (rows) and
    width (columns), the max_num_seqs 1-512 whose descriptors crash stock (the sweep), fixed width and
    dense schedule; the exact lists at the spotlight's width; the replayed search's crashing max_num_seqs."""
    widths = search["num_speculative_tokens"]
    header = " | ".join(f"n={n}" for n in widths)
    out = []
    sweep_row = row.get("sweep") or {"cells": {}}
    for kind in ("fixed", "dense"):
        lines = [f"| grid (sweep, {kind}) | {header} |", "|---|" + "---|" * len(widths)]
        for grid in search["grids"]:
            by_width = sweep_row["cells"].get(grid, {}).get(kind, {})
            cells = [sweep_cell(by_width.get(str(n), by_width.get(n))) for n in widths]
            lines.append(f"| `{grid}` | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    n = SPOTLIGHT["num_speculative_tokens"]
    lines = [f"| grid | n={n} fixed: crashing max_num_seqs | n={n} dense |", "|---|---|---|"]
    for grid in search["grids"]:
        by_kind = sweep_row["cells"].get(grid, {})
        exact = [by_kind.get(k, {}).get(str(n), by_kind.get(k, {}).get(n)) for k in ("fixed", "dense")]
        lines.append(
            f"| `{grid}` | "
            + " | ".join(("n/a" if e is None else e.replace(",", ", ") or "-") for e in exact)
            + " |"
        )
    out.append("\n".join(lines))
    for kind in ("fixed", "dense"):
        lines = [f"| grid (replayed, {kind}) | {header} |", "|---|" + "---|" * len(widths)]
        for grid in search["grids"]:
            by_width = row["cells"].get(grid, {}).get(kind, {})
            cells = []
            for n in widths:
                searched = [m for m in search["max_num_seqs"] if kind == "fixed" or (m >= 2 and n >= 2)]
                crashing = by_width.get(str(n), by_width.get(n))
                cells.append("n/a" if crashing is None else crash_ranges(from_ranges(crashing), searched))
            lines.append(f"| `{grid}` | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def run_tables(rows: Sequence[Row], searches: dict[str, Any], recorded: bool) -> str:
    """The markdown table, then each widths row's operator tables: as ``--table-from`` prints them
    (``recorded``, each headed by its release) or as a run prints them."""
    out = [markdown(rows)]
    for row in rows:
        if "cells" in row:
            head = f"\n{row['release']}\n\n" if recorded else "\n"
            out.append(head + operator_tables(row, searches[row["scope"]]))
    return "\n".join(out)
