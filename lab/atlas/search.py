"""The search inside one release (the worker process): every setting of a search replayed against the
installed vLLM, stock crashes grouped into families, and the family's condition checked against every
outcome; for the widths search also the operator cells and the unreplayed sweep.

Replays are deterministic functions of (descriptor lists, staging path), so each distinct pair is replayed
once (stock and patched) and counted for every configuration that produced it, unless ``memo`` is off.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any

from . import probes
from .condition import descriptor_crash, family_setting, fixed_width_rule, predicted_crash, round_up
from .ranges import as_ranges
from .replay import Descriptors, Outcome, descriptors, family, outcome
from .space import (
    LORA_CASES,
    PP,
    SEARCHES,
    SPOTLIGHT,
    SWEEP_MAX_NUM_SEQS,
    Search,
    Setting,
    grid_names,
    replay_config,
    settings,
)

# grid -> "fixed" or "dense" -> width -> the crashing max_num_seqs
Cells = dict[str, dict[str, dict[int, list[int]]]]


def example_key(item: tuple[Setting, str]) -> tuple[Any, ...]:
    """Orders a family's crashes so its recorded example is the smallest one."""
    s, pp = item
    return (s["max_num_seqs"], s["decode_query_len"], len(s["sizes"]), s["schedule"] is not None,
            s["varlen"], s["lora"] is not None, s["dbo"], pp != "only", s["grid"])  # fmt: skip


def record_cell(cells: Cells, spotlight: dict[str, Any], setting: Setting, result: Outcome) -> None:
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


def cells_as_ranges(cells: Cells) -> dict[str, dict[str, dict[int, str]]]:
    return {g: {k: {n: as_ranges(v) for n, v in by.items()} for k, by in c.items()} for g, c in cells.items()}


def sweep(search: Search, feats: dict[str, bool]) -> dict[str, Any]:
    """Widths: the family's settings (FULL_AND_PIECEWISE, recover-SSM on, no varlen, LoRA or DBO) at every
    max_num_seqs 1-512, by the real manager's descriptors (no replay: the replayed search checks the
    descriptor rule against replays), each compared with the condition and, at a fixed width, its reduced
    form."""
    started = time.monotonic()
    wide = dataclasses.replace(search, max_num_seqs=SWEEP_MAX_NUM_SEQS, modes=("FULL_AND_PIECEWISE",))
    cells: Cells = {}
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
        "cells": cells_as_ranges(cells),
        "seconds": round(time.monotonic() - started, 1),
    }


def run_search(scope: str, memo: bool, with_sweep: bool = True) -> dict[str, Any]:
    """Search ``scope`` (a key of :data:`~.space.SEARCHES`) on the installed vLLM; one summary row."""
    from vllm_staging_plugin._engine import compat

    started = time.monotonic()
    feats = probes.manager_features()
    search = SEARCHES[scope]
    skipped = [f"{name}: not in this release" for name, present in feats.items() if not present]
    positions = [p for p in search.pp if feats["intermediate_tensors"] or PP[p][1]]
    cache: dict[tuple[Descriptors, str], Outcome] = {}
    counts: Counter[str] = Counter()
    families: dict[str, Counter[str]] = {}
    examples: dict[str, tuple[Setting, str, Outcome]] = {}
    mismatches: list[str] = []
    cells: Cells = {}
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
                    **dict(examples[name][0].items()),
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
                "cells": cells_as_ranges(cells),
                "spotlight": spotlight,
                "sweep": sweep(search, feats) if feats["kda_recoverssm"] and with_sweep else None,
            }
            if scope == "widths"
            else {}
        ),
        "seconds": round(time.monotonic() - started, 1),
    }
