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

Replays are deterministic functions of (descriptor lists, staging path), so each distinct pair is replayed
once (stock and patched) and the outcome is counted for every configuration that produced it;
``--no-memo`` replays every configuration instead.

  .venv/bin/python tools/stock_atlas.py                  # 0.18.0-0.33.0, writes docs/data/atlas/summary.json
  .venv/bin/python tools/stock_atlas.py --installed      # the installed vLLM only, full search
  .venv/bin/python tools/stock_atlas.py 0.30.0 0.33.0 --json /tmp/a.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "data" / "atlas" / "summary.json"
MODES = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
CUSTOM_GRIDS: dict[str, tuple[int, ...]] = {
    "cc=[1,2,4,8,16]": (1, 2, 4, 8, 16),
    "cc=[1..8]": tuple(range(1, 9)),
    "cc=[1,2,4,...,512]": tuple(2**i for i in range(10)),
    "cc=[8,24,40]": (8, 24, 40),
}
MAX_GRIDS = (16, 512)  # operator-set max_cudagraph_capture_size; vLLM derives the grid below it
LORA_CASES = [0, 1, 2, 3]  # get_lora_capture_cases for max_loras=2 with cudagraph_specialize_lora
DBO_THRESHOLD = 2  # the smallest dbo_decode_token_threshold vLLM accepts: twins at every eligible size
PP = {"only": (True, True), "first-of-2": (True, False), "last-of-2": (False, True)}  # (first, last)
HIDDEN = 8  # staging rows decide the crash; a small hidden size keeps the replay fast
RELEASES = [
    "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1",
    "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0",
    "0.31.0", "0.32.0", "0.33.0",
]  # fmt: skip
FAMILY = "recoverssm-piecewise-cap"


@dataclass(frozen=True)
class Search:
    max_num_seqs: tuple[int, ...]
    speculative_tokens: tuple[int, ...]
    pp: tuple[str, ...]


SEARCHES = {
    "full": Search((1, 2, 3, 4, 8, 32, 256), (0, 1, 2, 4), ("only", "first-of-2", "last-of-2")),
    "subset": Search((1, 4, 8, 256), (0, 2, 4), ("only", "first-of-2")),
}


def tapered(max_num_seqs: int, n: int) -> tuple[tuple[int, int, int], ...]:
    """A dense schedule: n draft tokens up to half the batch, 1 above (vLLM's (start, end, tokens))."""
    half = max_num_seqs // 2
    return ((1, half, n), (half + 1, max_num_seqs, 1))


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def predicted_crash(setting: dict[str, Any]) -> bool:
    """The family's condition in the settings' terms, computed without the manager.

    recover-SSM on, FULL_AND_PIECEWISE, no varlen decode, and some capture size rounded up to a multiple
    of a decode query length q stays within max_num_seqs x decode_query_len, the largest capture size
    and max_num_seqs requests, yet exceeds the largest capture size within max_num_seqs x decode_query_len.
    """
    if not (setting["kda"] and setting["mode"] == "FULL_AND_PIECEWISE" and not setting["varlen"]):
        return False
    sizes, ms, dql = setting["sizes"], setting["max_num_seqs"], setting["decode_query_len"]
    bound = ms * dql
    queries = {t[2] + 1 for t in setting["schedule"]} if setting["schedule"] else {dql}
    largest_piecewise = max((s for s in sizes if s <= bound), default=0)
    full = [
        round_up(s, q)
        for s in sizes
        for q in queries
        if round_up(s, q) <= min(bound, max(sizes)) and round_up(s, q) // q <= ms
    ]
    return max(full, default=0) > largest_piecewise


# ---------------------------------------------------------------- worker: runs inside one release


def settings(search: Search, feats: dict[str, bool], skipped: list[str]) -> Iterator[dict[str, Any]]:
    """Every searched setting except the pipeline position (which does not change the descriptors)."""
    from vllm_staging_plugin._offline import cpu_replay

    derived_ok = True
    for ms, n in itertools.product(search.max_num_seqs, search.speculative_tokens):
        schedules: list[Any] = [None]
        if feats["dense_schedule"] and n >= 2 and ms >= 2:
            schedules.append(tapered(ms, n))
        for schedule in schedules:
            grids: dict[str, tuple[int, ...]] = {}
            for name, limit in [("derived", None), *((f"max={m}", m) for m in MAX_GRIDS)]:
                try:
                    grids[name] = tuple(cpu_replay.derived_capture_sizes(ms, n, schedule, limit))
                except Exception as exc:
                    if derived_ok:
                        skipped.append(f"vLLM-derived grids: {type(exc).__name__}: {exc}"[:200])
                    derived_ok = False
            grids.update(CUSTOM_GRIDS)
            knobs = itertools.product(
                MODES,
                [False, True] if feats["varlen_decode"] and n else [False],
                [None, LORA_CASES] if feats["lora_capture_cases"] else [None],
                [False, True] if feats["dbo"] else [False],
                [False, True] if feats["kda_recoverssm"] and n else [False],
            )
            for (mode, varlen, lora, dbo, kda), (grid, sizes) in itertools.product(knobs, grids.items()):
                yield {
                    "mode": mode, "grid": grid, "sizes": sizes, "max_num_seqs": ms, "decode_query_len": n + 1,
                    "schedule": schedule, "varlen": varlen, "lora": lora, "dbo": dbo, "kda": kda,
                }  # fmt: skip


def replay_config(setting: dict[str, Any], pp: str) -> Any:
    from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

    first, last = PP[pp]
    return ReplayConfig(
        mode=setting["mode"], sizes=setting["sizes"], max_num_seqs=setting["max_num_seqs"],
        decode_query_len=setting["decode_query_len"], hidden_size=HIDDEN, lora_capture_cases=setting["lora"],
        use_kda_recoverssm=setting["kda"], varlen_decode=setting["varlen"], dbo=setting["dbo"],
        dbo_decode_token_threshold=DBO_THRESHOLD, speculative_schedule=setting["schedule"],
        first_pp_rank=first, last_pp_rank=last,
        pipeline_parallel_size=1 if pp == "only" else 2,
    )  # fmt: skip


def descriptors(cfg: Any) -> tuple[Any, ...]:
    """The real manager's descriptor lists for ``cfg``, stock, as a hashable value."""
    from vllm_staging_plugin._offline import cpu_replay

    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
    return tuple((mode.name, tuple(descs)) for mode, descs in manager._capture_descs.items())


def outcome(cfg: Any) -> dict[str, Any]:
    """Stock and patched replay of ``cfg`` in vLLM's own order."""
    from vllm_staging_plugin._offline.cpu_replay import replay

    stock, patched = replay(cfg, patched=False), replay(cfg, patched=True)
    rows = {b["rows"] for b in patched.buffers.values()}
    return {
        "stock_ok": stock.ok, "stock_error": stock.error, "sequence": stock.sequence,
        "plugin_ok": patched.ok and (not patched.capacity or rows == {patched.capacity}),
        "plugin_error": patched.error, "capacity": patched.capacity, "plugin_rows": sorted(rows),
    }  # fmt: skip


def family(result: dict[str, Any], setting: dict[str, Any]) -> str:
    """Name a stock crash by the vLLM rule behind it; anything else is reported as unexplained."""
    seq = result["sequence"]
    if setting["kda"] and seq.get("PIECEWISE") and max(seq.get("FULL", [0])) > max(seq["PIECEWISE"]):
        return FAMILY
    first = next(iter(seq))
    return f"unexplained: {setting['mode']}, first {first} {seq[first][0]}, capacity {result['capacity']}"


def example_key(item: tuple[dict[str, Any], str]) -> tuple[Any, ...]:
    s, pp = item
    return (s["max_num_seqs"], s["decode_query_len"], len(s["sizes"]), s["schedule"] is not None,
            s["varlen"], s["lora"] is not None, s["dbo"], pp != "only", s["grid"])  # fmt: skip


def worker(scope: str, memo: bool) -> dict[str, Any]:
    from vllm_staging_plugin._engine import compat
    from vllm_staging_plugin._offline import cpu_replay

    started = time.monotonic()
    feats = cpu_replay.features()
    search = SEARCHES[scope]
    skipped = [f"{name}: not in this release" for name, present in feats.items() if not present]
    positions = [p for p in search.pp if feats["intermediate_tensors"] or PP[p][1]]
    cache: dict[Any, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    families: dict[str, Counter[str]] = {}
    examples: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {}
    mismatches: list[str] = []
    constructions = 0
    for setting in settings(search, feats, skipped):
        constructions += 1
        descs = descriptors(replay_config(setting, "only"))
        for pp in positions:
            if setting["kda"] and pp != "only":
                continue  # vLLM: "RecoverSSM currently requires pipeline_parallel_size=1"
            key = (descs, pp)
            if not memo or key not in cache:
                cache[key] = outcome(replay_config(setting, pp))
            result = cache[key]
            counts["configurations"] += 1
            counts["stock_boots" if result["stock_ok"] else "stock_crashes"] += 1
            counts["plugin_boots" if result["plugin_ok"] else "plugin_failures"] += 1
            if not result["stock_ok"]:
                name = family(result, setting)
                tally = families.setdefault(name, Counter())
                tally["configurations"] += 1
                tally[f"grid {setting['grid']}"] += 1
                tally[f"mode {setting['mode']}"] += 1
                tally[f"pp {pp}"] += 1
                tally["plugin_boots" if result["plugin_ok"] else "plugin_failures"] += 1
                best = examples.get(name)
                if best is None or example_key((setting, pp)) < example_key(best[:2]):
                    examples[name] = (setting, pp, result)
            if predicted_crash(setting) == result["stock_ok"] and len(mismatches) < 5:
                mismatches.append(f"{setting} pp={pp}: stock_ok={result['stock_ok']}")
            counts["predicate_mismatches"] += predicted_crash(setting) == result["stock_ok"]
    return {
        "release": compat.installed_versions()["vllm"],
        "scope": scope,
        "features": feats,
        "skipped": skipped,
        "search": {
            "modes": list(MODES),
            "max_num_seqs": list(search.max_num_seqs),
            "num_speculative_tokens": list(search.speculative_tokens),
            "pp": positions,
            "grids": ["derived", *(f"max={m}" for m in MAX_GRIDS), *CUSTOM_GRIDS],
            "lora_capture_cases": [None, LORA_CASES] if feats["lora_capture_cases"] else [None],
        },
        "managers_built": constructions,
        "distinct_replays": len(cache) if memo else counts["configurations"],
        **{
            k: counts[k]
            for k in (
                "configurations",
                "stock_boots",
                "stock_crashes",
                "plugin_boots",
                "plugin_failures",
                "predicate_mismatches",
            )
        },
        "mismatch_examples": mismatches,
        "families": {
            name: {
                **dict(sorted(tally.items())),
                "example": {
                    **{k: v for k, v in examples[name][0].items()},
                    "pp": examples[name][1],
                    "sequence": examples[name][2]["sequence"],
                    "stock_error": (examples[name][2]["stock_error"] or "")[:160],
                    "plugin_rows": examples[name][2]["plugin_rows"],
                },
            }
            for name, tally in families.items()
        },
        "seconds": round(time.monotonic() - started, 1),
    }


# ---------------------------------------------------------------- driver: one subprocess per release


def run_release(version: str, installed: str, scope: str, memo: bool) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tools"))
    import compat_matrix

    command = [sys.executable, str(Path(__file__)), "--worker", scope, *([] if memo else ["--no-memo"])]
    env = None
    if version != installed:
        env, probe, _ = compat_matrix.release_env(version)
        if probe["verdict"] != "supported":
            return {"release": version, "error": f"plugin verdict {probe['verdict']}: {probe['why']}"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in done.stdout.splitlines() if x.startswith("ATLAS:")), None)
    if line is None:
        return {"release": version, "error": done.stderr[-600:]}
    return json.loads(line[6:])  # type: ignore[no-any-return]


def print_row(row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"{row['release']:<8} ERROR {row['error']}")
        return
    fams = ", ".join(f"{k} {v['configurations']}" for k, v in row["families"].items()) or "none"
    print(
        f"{row['release']:<8} {row['scope']:<6} configs={row['configurations']:<6} "
        f"stock crashes={row['stock_crashes']:<5} plugin boots={row['plugin_boots']}/{row['configurations']} "
        f"mismatches={row['predicate_mismatches']} families: {fams} ({row['seconds']}s)",
        flush=True,
    )


def write_summary(summary: dict[str, Any], path: Path) -> None:
    """Compact JSON (a few KB): the search per scope once, per release only what differs."""
    rows = summary["releases"]
    summary["searches"] = {r["scope"]: r["search"] for r in rows if "search" in r}
    summary["releases"] = [
        {k: v for k, v in r.items() if k not in ("search", "features") and v != []} for r in rows
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, separators=(",", ":"), default=list) + "\n")


def markdown(rows: list[dict[str, Any]]) -> str:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("releases", nargs="*", help=f"default: {RELEASES[0]}-{RELEASES[-1]}")
    parser.add_argument("--installed", action="store_true", help="only the installed vLLM, in-process")
    parser.add_argument("--full-everywhere", action="store_true", help="full search on every release")
    parser.add_argument("--no-memo", action="store_true", help="replay every configuration")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help=f"summary path (default {SUMMARY})")
    parser.add_argument("--table-from", type=Path, help="print the markdown table of a summary; no run")
    parser.add_argument("--worker", choices=sorted(SEARCHES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table_from:
        print(markdown(json.loads(args.table_from.read_text())["releases"]))
        return 0
    memo = not args.no_memo
    if args.worker:
        print("ATLAS:" + json.dumps(worker(args.worker, memo)))
        return 0
    from importlib.metadata import version

    installed = version("vllm")
    releases = [installed] if args.installed else (args.releases or RELEASES)

    def scope(release: str) -> str:
        return "full" if release == installed or args.full_everywhere else "subset"

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:  # the long full search starts first
        first = sorted(releases, key=lambda r: scope(r) != "full")
        submitted = {r: pool.submit(run_release, r, installed, scope(r), memo) for r in first}
        futures = [submitted[r] for r in releases]
        rows = []
        for future in futures:
            rows.append(future.result())
            print_row(rows[-1])
    summary = {
        "command": "tools/stock_atlas.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "installed_vllm": installed,
        "hidden_size": HIDDEN,
        "dbo_decode_token_threshold": DBO_THRESHOLD,
        "custom_grids": {k: list(v) for k, v in CUSTOM_GRIDS.items()},
        "seconds": round(time.monotonic() - started, 1),
        "releases": rows,
    }
    path = args.json or SUMMARY
    write_summary(summary, path)
    print(markdown(rows))
    print(f"summary: {path} ({path.stat().st_size} bytes, {summary['seconds']} s)")
    bad = any("error" in r or r["plugin_failures"] or r["predicate_mismatches"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
