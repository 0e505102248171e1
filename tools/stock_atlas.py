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

  .venv/bin/python tools/stock_atlas.py                  # 0.18.0-0.33.0, writes docs/data/atlas/summary.json
  .venv/bin/python tools/stock_atlas.py --installed      # the installed vLLM only, full search
  .venv/bin/python tools/stock_atlas.py 0.30.0 0.33.0 --json /tmp/a.json
  .venv/bin/python tools/stock_atlas.py --installed --search widths  # writes docs/data/atlas/widths.json
  .venv/bin/python tools/stock_atlas.py 0.30.0 0.31.0 0.32.0 --search widths --no-sweep \
      --json docs/data/atlas/widths-0.30-0.32.json  # the replayed part on older releases
  .venv/bin/python tools/stock_atlas.py --table-from docs/data/atlas/widths.json  # + the operator tables
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
WIDTHS_SUMMARY = ROOT / "docs" / "data" / "atlas" / "widths.json"
MODES = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
CUSTOM_GRIDS: dict[str, tuple[int, ...]] = {
    "cc=[1,2,4,8,16]": (1, 2, 4, 8, 16),
    "cc=[1..8]": tuple(range(1, 9)),
    "cc=[1,2,4,...,512]": tuple(2**i for i in range(10)),
    "cc=[8,24,40]": (8, 24, 40),
}
WIDE_GRIDS: dict[str, tuple[int, ...]] = {  # the widths search adds these
    "cc=[1,2,4,...,1024]": tuple(2**i for i in range(11)),
    "cc=[8,16,...,512]": tuple(range(8, 513, 8)),
}
GRIDS = {**CUSTOM_GRIDS, **WIDE_GRIDS}
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
    modes: tuple[str, ...] = MODES
    max_grids: tuple[int, ...] = MAX_GRIDS
    grids: tuple[str, ...] = tuple(CUSTOM_GRIDS)  # operator-set cudagraph_capture_sizes, names in GRIDS
    derived_ceilings: tuple[int, ...] = (512,)  # vLLM's default ceiling: 512, 1024 on data-centre Blackwell
    lora_and_dbo: bool = True  # False: LoRA capture cases and DBO at their defaults only (none, off)


SEARCHES = {
    "full": Search((1, 2, 3, 4, 8, 32, 256), (0, 1, 2, 4), ("only", "first-of-2", "last-of-2")),
    "subset": Search((1, 4, 8, 256), (0, 2, 4), ("only", "first-of-2")),
    "widths": Search(
        (1, 2, 4, 6, 8, 16, 32, 48, 64, 128, 256, 512),
        tuple(range(1, 11)),
        ("only",),
        modes=("FULL_AND_PIECEWISE",),
        max_grids=(16, 256, 512, 1024),
        grids=tuple(GRIDS),
        derived_ceilings=(512, 1024),
        lora_and_dbo=False,
    ),
}
SWEEP_MAX_NUM_SEQS = tuple(range(1, 513))  # widths: the family's settings at every max_num_seqs, unreplayed
SPOTLIGHT: dict[str, Any] = {
    "name": "Kimi-K3",
    "max_num_seqs": 48,
    "num_speculative_tokens": 8,
    "grid": "cc=[1,2,4,...,512]",
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


def fixed_width_rule(sizes: Sequence[int], max_num_seqs: int, decode_query_len: int) -> bool:
    """The condition for a fixed width (no schedule), reduced: P, the largest capture size within
    max_num_seqs x decode_query_len, is neither the grid's largest size nor a multiple of decode_query_len
    (stock then allocates P rows and the first FULL descriptor, round_up(P, decode_query_len), crashes)."""
    p = max((s for s in sizes if s <= max_num_seqs * decode_query_len), default=0)
    return p != max(sizes) and p % decode_query_len != 0


def descriptor_crash(descs: tuple[Any, ...]) -> bool:
    """FULL_AND_PIECEWISE staging in vLLM's order, read off the descriptors: PIECEWISE is captured first and
    its largest size allocates the buffers; a larger FULL descriptor then crashes."""
    tops = {mode: max((d.num_tokens for d in ds), default=0) for mode, ds in descs}
    return tops.get("PIECEWISE", 0) > 0 and tops.get("FULL", 0) > tops["PIECEWISE"]


def as_ranges(values: Sequence[int]) -> str:
    """Sorted integers as "1-7,9-15,20"."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def from_ranges(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


# ---------------------------------------------------------------- worker: runs inside one release


def grid_names(search: Search) -> list[str]:
    derived = [f"derived-{c}" if c != 512 else "derived" for c in search.derived_ceilings]
    return [*derived, *(f"max={m}" for m in search.max_grids), *search.grids]


@contextlib.contextmanager
def platform_ceiling(ceiling: int) -> Iterator[None]:
    """vLLM's derived-grid ceiling is 1024 on data-centre Blackwell (capability family 100), else 512:
    answer that question as such a GPU would, only for the block (vLLM's ``_set_cudagraph_sizes`` asks it)."""
    if ceiling == 512:
        yield
        return
    from vllm.platforms import current_platform

    cls = type(current_platform)
    saved = cls.__dict__.get("is_device_capability_family", _MISSING)
    cls.is_device_capability_family = classmethod(lambda _, capability, device_id=0: capability // 10 == 10)
    try:
        yield
    finally:
        if saved is _MISSING:
            delattr(cls, "is_device_capability_family")
        else:
            cls.is_device_capability_family = saved


_MISSING = object()


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
            derived = [(f"derived-{c}" if c != 512 else "derived", None, c) for c in search.derived_ceilings]
            for name, limit, ceiling in [*derived, *((f"max={m}", m, 512) for m in search.max_grids)]:
                try:
                    with platform_ceiling(ceiling):
                        grids[name] = tuple(cpu_replay.derived_capture_sizes(ms, n, schedule, limit))
                except Exception as exc:
                    if derived_ok:
                        skipped.append(f"vLLM-derived grids: {type(exc).__name__}: {exc}"[:200])
                    derived_ok = False
            grids.update({name: GRIDS[name] for name in search.grids})
            knobs = itertools.product(
                search.modes,
                [False, True] if feats["varlen_decode"] and n else [False],
                [None, LORA_CASES] if feats["lora_capture_cases"] and search.lora_and_dbo else [None],
                [False, True] if feats["dbo"] and search.lora_and_dbo else [False],
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


def family_setting(setting: dict[str, Any], pp: str) -> bool:
    """The operator table's configurations: where the family can live, at the default LoRA/DBO knobs."""
    return (
        setting["mode"] == "FULL_AND_PIECEWISE"
        and setting["kda"]
        and not setting["varlen"]
        and setting["lora"] is None
        and not setting["dbo"]
        and pp == "only"
    )


def record_cell(
    cells: dict[str, dict[str, dict[int, list[int]]]],
    spotlight: dict[str, Any],
    setting: dict[str, Any],
    result: dict[str, Any],
) -> None:
    """Widths search: note a stock crash in its (grid, fixed or dense schedule, width) cell; keep the
    spotlight deployment's plan on every grid (its full plan on its own grid)."""
    n, ms = setting["decode_query_len"] - 1, setting["max_num_seqs"]
    kind = "dense" if setting["schedule"] else "fixed"
    crashing = cells.setdefault(setting["grid"], {}).setdefault(kind, {}).setdefault(n, [])
    if not result["stock_ok"]:
        crashing.append(ms)
    if kind == "fixed" and (ms, n) == (SPOTLIGHT["max_num_seqs"], SPOTLIGHT["num_speculative_tokens"]):
        seq = result["sequence"]
        entry = {
            "stock_ok": result["stock_ok"],
            "predicted_crash": predicted_crash(setting),
            "piecewise_top": max(seq.get("PIECEWISE", [0])),
            "full_top": max(seq.get("FULL", [0])),
            "stock_error": (result["stock_error"] or "")[:120] or None,
            "plugin_ok": result["plugin_ok"],
            "plugin_rows": result["plugin_rows"],
        }
        if setting["grid"] == SPOTLIGHT["grid"]:
            entry["sequence"] = seq
        spotlight.setdefault("grids", {})[setting["grid"]] = entry
        spotlight.update(SPOTLIGHT)


def sweep(search: Search, feats: dict[str, bool]) -> dict[str, Any]:
    """Widths: the family's settings (FULL_AND_PIECEWISE, recover-SSM on, no varlen, LoRA or DBO) at every
    max_num_seqs 1-512, by the real manager's descriptors (no replay: the replayed search checks the
    descriptor rule against replays), each compared with the condition and, at a fixed width, its reduced
    form."""
    started = time.monotonic()
    wide = dataclasses.replace(search, max_num_seqs=SWEEP_MAX_NUM_SEQS, modes=("FULL_AND_PIECEWISE",))
    cells: dict[str, dict[str, dict[int, list[int]]]] = {}
    counts: Counter[str] = Counter()
    examples: list[str] = []
    for setting in settings(wide, feats, []):
        if not family_setting(setting, "only"):
            continue
        n, ms = setting["decode_query_len"] - 1, setting["max_num_seqs"]
        kind = "dense" if setting["schedule"] else "fixed"
        crash = descriptor_crash(descriptors(replay_config(setting, "only")))
        counts["configurations"] += 1
        counts["crashes"] += crash
        wrong = crash != predicted_crash(setting)
        if kind == "fixed":
            wrong = wrong or crash != fixed_width_rule(setting["sizes"], ms, n + 1)
        counts["mismatches"] += wrong
        if wrong and len(examples) < 5:
            examples.append(f"{setting}: descriptors crash={crash}")
        crashing = cells.setdefault(setting["grid"], {}).setdefault(kind, {}).setdefault(n, [])
        if crash:
            crashing.append(ms)
    return {
        "max_num_seqs": [SWEEP_MAX_NUM_SEQS[0], SWEEP_MAX_NUM_SEQS[-1]],
        "configurations": counts["configurations"],
        "crashes": counts["crashes"],
        "mismatches": counts["mismatches"],
        "mismatch_examples": examples,
        "cells": {
            g: {k: {n: as_ranges(v) for n, v in by.items()} for k, by in c.items()} for g, c in cells.items()
        },
        "seconds": round(time.monotonic() - started, 1),
    }


def worker(scope: str, memo: bool, with_sweep: bool = True) -> dict[str, Any]:
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
    cells: dict[str, dict[str, dict[int, list[int]]]] = {}  # widths: grid -> fixed/dense -> n -> crashing
    spotlight: dict[str, Any] = {}
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
            if scope == "widths":
                counts["descriptor_rule_mismatches"] += descriptor_crash(descs) == result["stock_ok"]
                if family_setting(setting, pp):
                    record_cell(cells, spotlight, setting, result)
                if not result["stock_ok"] and setting["schedule"] is None:
                    p = max(
                        s
                        for s in setting["sizes"]
                        if s <= setting["max_num_seqs"] * setting["decode_query_len"]
                    )
                    named = f"({p}) must match the existing size ({round_up(p, setting['decode_query_len'])})"
                    counts["message_mismatches"] += named not in (result["stock_error"] or "")
    return {
        "release": compat.installed_versions()["vllm"],
        "scope": scope,
        "features": feats,
        "skipped": skipped,
        "search": {
            "modes": list(search.modes),
            "max_num_seqs": list(search.max_num_seqs),
            "num_speculative_tokens": list(search.speculative_tokens),
            "pp": positions,
            "grids": grid_names(search),
            "lora_capture_cases": [None, LORA_CASES]
            if feats["lora_capture_cases"] and search.lora_and_dbo
            else [None],
            **({} if search.lora_and_dbo else {"dbo": [False]}),
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
        **(
            {
                "descriptor_rule_mismatches": counts["descriptor_rule_mismatches"],
                "message_mismatches": counts["message_mismatches"],
                "cells": {
                    g: {k: {n: as_ranges(v) for n, v in by.items()} for k, by in c.items()}
                    for g, c in cells.items()
                },
                "spotlight": spotlight,
                "sweep": sweep(search, feats) if feats["kda_recoverssm"] and with_sweep else None,
            }
            if scope == "widths"
            else {}
        ),
        "seconds": round(time.monotonic() - started, 1),
    }


# ---------------------------------------------------------------- driver: one subprocess per release


def run_release(
    version: str, installed: str, scope: str, memo: bool, with_sweep: bool = True
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tools"))
    import compat_matrix

    command = [sys.executable, str(Path(__file__)), "--worker", scope, *([] if memo else ["--no-memo"])]
    command += [] if with_sweep else ["--no-sweep"]
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


def sweep_summary(sweep: dict[str, Any]) -> str:
    return (
        f"max_num_seqs {sweep['max_num_seqs'][0]}-{sweep['max_num_seqs'][1]}: "
        f"configs={sweep['configurations']} "
        f"crashes={sweep['crashes']} mismatches={sweep['mismatches']} ({sweep['seconds']}s)"
    )


def print_row(row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"{row['release']:<8} ERROR {row['error']}")
        return
    fams = ", ".join(f"{k} {v['configurations']}" for k, v in row["families"].items()) or "none"
    print(
        f"{row['release']:<8} {row['scope']:<6} configs={row['configurations']:<6} "
        f"stock crashes={row['stock_crashes']:<5} plugin boots={row['plugin_boots']}/{row['configurations']} "
        f"mismatches={row['predicate_mismatches']} families: {fams} ({row['seconds']}s)"
        + (f"; sweep {sweep_summary(row['sweep'])}" if row.get("sweep") else ""),
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


def operator_tables(row: dict[str, Any], search: dict[str, Any]) -> str:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("releases", nargs="*", help=f"default: {RELEASES[0]}-{RELEASES[-1]}")
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
        print(markdown(recorded["releases"]))
        for row in recorded["releases"]:
            if "cells" in row:
                print(f"\n{row['release']}\n\n" + operator_tables(row, recorded["searches"][row["scope"]]))
        return 0
    memo = not args.no_memo
    if args.worker:
        print("ATLAS:" + json.dumps(worker(args.worker, memo, not args.no_sweep)))
        return 0
    from importlib.metadata import version

    installed = version("vllm")
    releases = [installed] if args.installed else (args.releases or RELEASES)

    def scope(release: str) -> str:
        if args.search:
            return str(args.search)
        return "full" if release == installed or args.full_everywhere else "subset"

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:  # the long full search starts first
        first = sorted(releases, key=lambda r: scope(r) != "full")
        submitted = {
            r: pool.submit(run_release, r, installed, scope(r), memo, not args.no_sweep) for r in first
        }
        futures = [submitted[r] for r in releases]
        rows = []
        for future in futures:
            rows.append(future.result())
            print_row(rows[-1])
    summary: dict[str, Any] = {
        "command": "tools/stock_atlas.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "installed_vllm": installed,
        "hidden_size": HIDDEN,
        "dbo_decode_token_threshold": DBO_THRESHOLD,
        "custom_grids": {
            k: list(GRIDS[k]) for k in dict.fromkeys(g for r in releases for g in SEARCHES[scope(r)].grids)
        },
        "seconds": round(time.monotonic() - started, 1),
        "releases": rows,
    }
    path = args.json or (WIDTHS_SUMMARY if args.search == "widths" else SUMMARY)
    write_summary(summary, path)
    print(markdown(rows))
    for row in rows:
        if "cells" in row:
            print("\n" + operator_tables(row, summary["searches"][row["scope"]]))
    print(f"summary: {path} ({path.stat().st_size} bytes, {summary['seconds']} s)")
    bad = any(
        "error" in r
        or r["plugin_failures"]
        or r["predicate_mismatches"]
        or r.get("descriptor_rule_mismatches")
        or r.get("message_mismatches")
        or (r.get("sweep") or {}).get("mismatches")
        for r in rows
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
