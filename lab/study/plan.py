"""Which boots a run wants: cells of (model, arm, order, variant, parallelism, mode, executor), interleaved
round-robin so that a run stopped by its deadline leaves every cell about equally filled."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

# arm -> STAGING_PLUGIN_PRESIZE; None: the plugin is not loaded at all
ARMS: dict[str, str | None] = {"vanilla": None, "stock": "off-allow-crash", "plugin": "on"}
ORDERS = ("descending", "ascending", "max-first", "shuffle:1", "full-first", "size-descending", "interleaved")
# A variant changes only the boot's environment (study.boot.variant_env), so that one configuration can be
# booted under several debugging switches and compared with itself.
# Variants join with "+" (``kda-log+vllm-kdafix``). The ``vllm-*`` ones put a patched copy of vLLM first on
# PYTHONPATH (lab/gpu/session.sh builds them under STUDY_PATCHED_VLLM, default /tmp/vllm-patched).
VARIANTS: dict[str, str] = {
    "": "-",
    "launch-blocking": "CUDA_LAUNCH_BLOCKING=1",
    "fresh-triton-cache": "fresh TRITON_CACHE_DIR per boot",
    "pdl-off": "PDL off (CudaPlatform.is_arch_support_pdl returns False)",
    "kda-log": "the shared KDA layer's mixed-step kernel arguments logged",
    "kda-pad": "padding control: the (1, 1) index over query-length words of the request's slot",
    "vllm-presize": "vLLM with vllm_staging_plugin/patches/presize-staging-buffers.patch",
    "vllm-kdafix": "vLLM with vllm_staging_plugin/patches/kda-spec-state-slots.patch",
}
# Traffic (the mode's suffix): "" two prompts given together (vllm.LLM) or one completion (serve);
# "join": the second request arrives once the first has its first token, so one step mixes the first
# request's speculative decode with the second's prefill; "single": one request, 32 tokens, whose prompt
# repeats so that n-gram drafts are proposed (the token check against a run without speculation).
MODES = ("llm", "llm-join", "llm-single", "serve", "serve-join")


def variant_parts(variant: str) -> list[str]:
    """``a+b`` -> ``["a", "b"]``; every part must be a known variant."""
    parts = [v for v in variant.split("+") if v]
    for part in parts:
        if part not in VARIANTS:
            raise SystemExit(f"unknown variant {part!r}; known: {', '.join(v for v in VARIANTS if v)}")
    return parts


STOPPED = "stopped:"  # a boot ended by the study's own stop, not by vLLM: neither counted nor summarized
CellKey = tuple[str, str, str, int, int, str, str, str]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One boot to run; ``round`` tells repeats of the same configuration apart."""

    round: int
    model: str
    order: str
    arm: str
    tp: int = 1
    pp: int = 1
    mode: str = "llm"  # one of MODES
    executor: str = "mp"  # a key of study.models.EXECUTORS
    variant: str = ""  # a key of VARIANTS

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def boot_id(self) -> str:
        par = "".join(f"-{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp)) if v > 1)
        mode = "" if self.mode == "llm" else f"-{self.mode}"
        ex = "" if self.executor == "mp" else f"-{self.executor}"
        var = f"-{self.variant}" if self.variant else ""
        return f"r{self.round}-{self.model}{par}{ex}{mode}-{self.order.replace(':', '')}-{self.arm}{var}"

    @property
    def key(self) -> CellKey:
        return (self.model, self.order, self.arm, self.tp, self.pp, self.mode, self.executor, self.variant)


def record_key(b: dict[str, Any]) -> CellKey:
    """``Cell.key`` of a boot record (records from before a field existed get its default)."""
    return (b["model"], b["order"], b["arm"], b.get("tp", 1), b.get("pp", 1), b.get("mode", "llm"),
            b.get("executor", "mp"), b.get("variant", ""))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PlanItem:
    """``[MODEL=]ARM@ORDER[+VARIANT][*N]``: a model named here restricts the item to that model; ``*N``
    sets its own count for ``--fill-to`` (the others get ``--fill-to``'s), so that one run fills arms
    that want different N, interleaved."""

    arm: str
    order: str
    variant: str = ""
    model: str | None = None
    count: int | None = None


def parse_plan(text: str) -> list[PlanItem]:
    """``[MODEL=]ARM@ORDER[+VARIANT][*N],...`` -> items; arms, variants and counts are checked, orders
    are the plugin's to check."""
    items = []
    for item in filter(None, text.split(",")):
        model, _, rest = item.rpartition("=")
        rest, star, count = rest.partition("*")
        pair, _, variant = rest.partition("+")
        arm, sep, order = pair.partition("@")
        bad_count = bool(star) and not (count.isdigit() and int(count) > 0)
        if (not sep or arm not in ARMS or not order or bad_count
                or not all(p in VARIANTS for p in variant.split("+"))):  # fmt: skip
            raise SystemExit(
                f"plan item {item!r}: want [MODEL=]ARM@ORDER[+VARIANT][*N], ARM one of {', '.join(ARMS)}, "
                f"VARIANT one of {', '.join(v for v in VARIANTS if v)}, N a positive count"
            )
        items.append(PlanItem(arm, order, variant, model or None, int(count) if star else None))
    return items


def planned_cells(args: argparse.Namespace, out: Path) -> list[Cell]:
    """The boots to run: ``--rounds`` of the plan, or with ``--fill-to N`` only those still missing for N
    records per cell in ``out/boots`` (a stopped boot does not count), numbered after the last round."""
    models = args.models.split(",")
    plan = (
        parse_plan(args.plan)
        if args.plan
        else [PlanItem(a, o) for o in args.orders.split(",") for a in args.arms.split(",")]
    )
    serve = parse_plan(args.serve_plan) if args.serve_plan else []
    kw = {"tp": args.tp, "pp": args.pp, "executor": args.executor}
    traffic = getattr(args, "traffic", "")
    llm_mode = f"llm-{traffic}" if traffic else "llm"
    serve_mode = "serve-join" if traffic == "join" else "serve"

    def pairs(items: list[PlanItem]) -> list[tuple[str, PlanItem]]:  # plan order first: its priority
        return [(m, p) for p in items for m in models if p.model in (None, m)]

    if args.fill_to:
        last = -1
        done: dict[CellKey, int] = {}
        for path in (out / "boots").glob("*.json"):
            b = json.loads(path.read_text())
            if str(b.get("error", "")).startswith(STOPPED) or b.get("memory_profiling_interference"):
                continue  # not a measurement (stopped, or another boot freed memory while it profiled)
            key = record_key(b)
            done[key] = done.get(key, 0) + 1
            last = max(last, int(b.get("round", 0)))
        wanted = [(m, p, llm_mode, p.count or args.fill_to) for m, p in pairs(plan)]
        wanted += [(m, p, serve_mode, p.count or args.serve_rounds) for m, p in pairs(serve)]
        cells = []
        for step in range(max((n for *_, n in wanted), default=0)):
            for m, p, mode, n in wanted:
                cell = Cell(last + 1 + step, m, p.order, p.arm, mode=mode, variant=p.variant, **kw)
                if done.get(cell.key, 0) + step < n:
                    cells.append(cell)
        return cells
    if any(p.count for p in plan + serve):
        raise SystemExit("a plan item's *N count needs --fill-to")
    rounds = range(args.start_round, args.start_round + args.rounds)
    cells = [Cell(r, m, p.order, p.arm, mode=llm_mode, variant=p.variant, **kw)
             for r in rounds for m, p in pairs(plan)]  # fmt: skip
    return cells + [Cell(args.start_round + r, m, p.order, p.arm, mode=serve_mode, variant=p.variant, **kw)
                    for r in range(args.serve_rounds) for m, p in pairs(serve)]  # fmt: skip
