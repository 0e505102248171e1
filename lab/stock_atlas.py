"""The stock-crash atlas: which configurations crash stock vLLM's staging in vLLM's OWN capture order?

For every searched configuration, the REAL ``ModelCudaGraphManager`` of a release builds its capture
descriptors (``_init_candidates``, through ``vllm_staging_plugin._offline.cpu_replay`` on CPU); then its real
capture staging code runs in vLLM's own order, stock and patched. Stock crashes are grouped into
families by their condition, and each family's condition, written as arithmetic over the user-facing
settings, is checked against every outcome (``predicate_mismatches`` must be 0).

Dimensions: cudagraph mode; capture grid (vLLM's derived grid from max_num_seqs and the speculative
settings, run through ``VllmConfig._set_cudagraph_sizes``; an operator-set ``max_cudagraph_capture_size``;
operator-set ``cudagraph_capture_sizes`` lists); max_num_seqs; num_speculative_tokens (decode_query_len =
1 + it); a dense dynamic-speculation schedule; varlen decode; LoRA capture cases; DBO microbatch twins;
KDA recover-SSM; pipeline rank position. A knob a release lacks (read from its structure) is searched
at its default only. Combinations vLLM itself cannot produce are not searched: recover-SSM, varlen decode
and a schedule without speculative tokens, recover-SSM with pipeline parallelism (vLLM rejects it).

The "widths" search (``--search widths``) widens the speculative widths, max_num_seqs and grids where the
family lives (FULL_AND_PIECEWISE, recover-SSM off and on, varlen decode off and on, the only pipeline rank,
no LoRA cases, no DBO) and records, per grid and width, the max_num_seqs that crash stock: the operator
table of docs/stock-crashes.md, "Atlas at real widths" (summary docs/data/atlas/widths.json).

Replays are deterministic functions of (descriptor lists, staging path), so each distinct pair is replayed
once (stock and patched) and the outcome is counted for every configuration that produced it;
``--no-memo`` replays every configuration instead.

  .venv/bin/python lab/stock_atlas.py                  # 0.18.0-0.33.0, writes docs/data/atlas/summary.json
  .venv/bin/python lab/stock_atlas.py --installed      # the installed vLLM only, full search
  .venv/bin/python lab/stock_atlas.py 0.30.0 0.33.0 --json /tmp/a.json
  .venv/bin/python lab/stock_atlas.py --installed --search widths  # writes docs/data/atlas/widths.json
  .venv/bin/python lab/stock_atlas.py 0.30.0 0.31.0 0.32.0 --search widths --no-sweep \
      --json docs/data/atlas/widths-0.30-0.32.json  # the replayed part on older releases
  .venv/bin/python lab/stock_atlas.py --table-from docs/data/atlas/widths.json  # + the operator tables
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from atlas import driver, overlay, search, summary, tables
from atlas.releases import SUPPORTED
from atlas.space import SEARCHES

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "compat"  # shared with lab/compat_matrix.py
PACKAGES = ROOT / "lab" / "compat-packages.txt"
SUMMARY = ROOT / "docs" / "data" / "atlas" / "summary.json"
WIDTHS_SUMMARY = ROOT / "docs" / "data" / "atlas" / "widths.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("releases", nargs="*", help=f"default: {SUPPORTED[0]}-{SUPPORTED[-1]}")
    parser.add_argument("--installed", action="store_true", help="only the installed vLLM, in-process")
    parser.add_argument("--full-everywhere", action="store_true", help="full search on every release")
    parser.add_argument(
        "--search", choices=["widths"], help=f"this search on every release (default path {WIDTHS_SUMMARY})"
    )
    parser.add_argument("--no-memo", action="store_true", help="replay every configuration")
    parser.add_argument("--no-sweep", action="store_true", help="widths: the replayed part only, no sweep")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help=f"summary path (default {SUMMARY})")
    parser.add_argument("--table-from", type=Path, help="print the markdown table of a summary; no run")
    parser.add_argument("--worker", choices=sorted(SEARCHES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table_from:
        recorded = json.loads(args.table_from.read_text())
        print(tables.run_tables(recorded["releases"], recorded["searches"], recorded=True))
        return 0
    memo = not args.no_memo
    if args.worker:
        print(driver.worker_line(search.run_search(args.worker, memo, not args.no_sweep)))
        return 0
    from importlib.metadata import version

    installed = version("vllm")
    releases = [installed] if args.installed else (args.releases or list(SUPPORTED))

    def scope(release: str) -> str:
        if args.search:
            return str(args.search)
        return "full" if release == installed or args.full_everywhere else "subset"

    worker = [sys.executable, str(Path(__file__)), "--worker"]
    release_env = functools.partial(overlay.release_env, cache=CACHE, packages=PACKAGES, cwd=ROOT)
    run = functools.partial(
        driver.run_release, installed=installed, memo=memo, with_sweep=not args.no_sweep, worker=worker,
        release_env=release_env, cwd=ROOT,
    )  # fmt: skip
    started = time.monotonic()
    rows = []
    for row in driver.run_releases(releases, scope, args.jobs, run):
        rows.append(row)
        print(tables.row_line(row), flush=True)
    command = "lab/stock_atlas.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = summary.build(command, installed, releases, scope, rows, time.monotonic() - started)
    path = args.json or (WIDTHS_SUMMARY if args.search == "widths" else SUMMARY)
    summary.write(result, path)
    print(tables.run_tables(rows, result["searches"], recorded=False))
    print(f"summary: {path} ({path.stat().st_size} bytes, {result['seconds']} s)")
    return 1 if summary.failed(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
