"""Tables from the boot records: one row per cell (booted/N, staging crashes, capture figures), the token
check, and with ``--faults`` (automatic when any record carries a variant) what happened after capture:
faults, JIT-at-inference warnings, and whether one occurs if and only if the other does."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from study.boot import JOIN_TOKENS, MAX_TOKENS, PROMPTS, SINGLE_TOKENS
from study.models import MODELS
from study.plan import ORDERS, STOPPED


def summarize(args: argparse.Namespace) -> int:
    """Print the tables for every record under ``args.directory`` (any depth of ``boots/``)."""
    records = [json.loads(p.read_text()) for p in sorted(Path(args.directory).glob("**/boots/*.json"))]
    boots = [b for b in records if not str(b.get("error", "")).startswith(STOPPED)]
    if len(boots) < len(records):
        print(f"({len(records) - len(boots)} boots stopped by the study's deadline or timeout are left out)")
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for b in boots:
        key = (b["model"], b.get("tp", 1), b.get("pp", 1), b.get("executor", "mp"), b.get("mode", "llm"),
               b["order"], b["arm"])  # fmt: skip
        if b.get("variant"):
            key += (b["variant"],)
        cells.setdefault(key, []).append(b)
    header = ("model", "tp", "pp", "executor", "mode", "order", "arm", "booted/N", "staging crash", "runner",
              "attention backend", "receipts", "boot s (median)", "vLLM capture s", "vLLM took GiB",
              "first error")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for key, items in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
        ok = sum(b["ok"] for b in items)
        crash = sum(b.get("staging_crash", False) for b in items)
        runners = ", ".join(sorted({str(b.get("runner", b.get("runner_log", "-"))) for b in items}))
        backends = ", ".join(sorted({backend(b) for b in items}))
        receipts = ", ".join(str(b.get("receipts", "-")) for b in items)
        medians = " | ".join(
            _median(items, k) for k in ("boot_seconds", "vllm_capture_seconds", "vllm_took_gib")
        )
        error = next((b["error"][:90] for b in items if b.get("error")), "")
        arm = key[6] + (f"+{key[7]}" if len(key) > 7 else "")
        print(f"| {' | '.join(map(str, key[:6]))} | {arm} | {ok}/{len(items)} | {crash} | {runners} | "
              f"{backends} | {receipts} | {medians} | {error} |")  # fmt: skip
    print()
    for model in sorted({b["model"] for b in boots}):
        mine = [
            b
            for b in boots
            if b["model"] == model and b["ok"] and b.get("tokens") and b.get("mode", "llm") == "llm"
        ]
        same = all(b["tokens"] == mine[0]["tokens"] for b in mine) if mine else None
        arms = sorted({b["arm"] for b in mine})
        print(f"{model}: {len(mine)} successful LLM boots ({', '.join(arms)}; every tp/pp and order) "
              f"produced identical tokens: {same}")  # fmt: skip
    if getattr(args, "faults", False) or any(b.get("variant") for b in boots):
        print()
        faults(boots)
    if any(b.get("receipt_graph_pool_reserved_bytes") for b in boots):
        print()
        orders(boots)
    if getattr(args, "plot", None):
        plot_orders(boots, Path(args.plot))
    return 0


GIB = 1 << 30
ORDER_FIGURES = (  # (record field, column, its ratio's name, scale): the order study's per-boot figures
    ("vllm_took_gib", 'graph memory, vLLM\'s "took" (GiB)', "graph memory", 1),
    ("receipt_graph_pool_reserved_bytes", "graph pool, receipt (GiB)", "pool", GIB),
    ("receipt_graph_memory_bytes", "free-memory drop over the manager's capture, receipt (GiB)", "drop", GIB),
    ("receipt_capture_seconds", "capture s (receipt)", "capture s", 1),
    ("vllm_kv_tokens", "KV cache tokens", "KV tokens", 1),
)


def backend(b: dict[str, Any]) -> str:
    """The attention backend vLLM logged for the boot ("not logged" in records older than the field)."""
    return str(b.get("attention_backend") or ("not logged" if "attention_backend" not in b else "-"))


def order_cells(boots: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Successful plugin boots with a real-capture receipt, per (model and backend, order), in boot order:
    one model's orders on two attention backends are two studies, never pooled."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for b in sorted(boots, key=lambda b: b["boot_id"]):
        if b["arm"] == "plugin" and b["ok"] and b.get("receipt_graph_pool_reserved_bytes"):
            cells.setdefault((f"{b['model']} ({backend(b)})", b["order"]), []).append(b)
    return cells


def orders(boots: list[dict[str, Any]]) -> None:
    """Per model and order: every boot's figures (median first), and the medians over vLLM's order."""
    cells = order_cells(boots)
    header = ("model (attention backend)", "order", "N", *(column for _, column, _, _ in ORDER_FIGURES),
              *(f"{ratio} / descending" for _, _, ratio, _ in ORDER_FIGURES))  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (model, order), items in sorted(cells.items(), key=lambda kv: (kv[0][0], _order_rank(kv[0][1]))):
        base = cells.get((model, "descending"), [])
        cols = [_values(items, field, scale) for field, _, _, scale in ORDER_FIGURES]
        ratios = [_ratio(items, base, field, scale) for field, _, _, scale in ORDER_FIGURES]
        print(f"| {model} | {order} | {len(items)} | {' | '.join(cols)} | {' | '.join(ratios)} |")


def _order_rank(order: str) -> tuple[int, str]:
    return (ORDERS.index(order) if order in ORDERS else len(ORDERS), order)


def _figures(items: list[dict[str, Any]], field: str, scale: float) -> list[float]:
    return [b[field] / scale for b in items if b.get(field) is not None]


def _values(items: list[dict[str, Any]], field: str, scale: float) -> str:
    values = _figures(items, field, scale)
    if not values:
        return "-"
    fmt = "{:,.0f}" if field.endswith("tokens") else "{:,.3f}" if scale != 1 or "seconds" in field else "{:g}"
    shown = ", ".join(fmt.format(v) for v in values)
    return f"{fmt.format(statistics.median(values))} ({shown})" if len(values) > 1 else shown


def _ratio(items: list[dict[str, Any]], base: list[dict[str, Any]], field: str, scale: float) -> str:
    mine, theirs = _figures(items, field, scale), _figures(base, field, scale)
    if not mine or not theirs or statistics.median(theirs) == 0:
        return "-"
    return f"{statistics.median(mine) / statistics.median(theirs):.3f}"


def plot_orders(boots: list[dict[str, Any]], path: Path) -> None:
    """Graph memory per order, one panel per model: the median bar, every boot a dot (the spread)."""
    cells = order_cells(boots)
    models = sorted({m for m, _ in cells})
    try:
        import matplotlib
    except ImportError:
        print(f"no picture: matplotlib is not installed here (summarize again with it for {path})")
        return
    if not models:
        print("no picture: no plugin boot with a real-capture receipt")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        names = sorted({o for m, o in cells if m == model}, key=_order_rank)
        for i, name in enumerate(names):
            values = _figures(cells[(model, name)], "vllm_took_gib", 1)
            pools = _figures(cells[(model, name)], "receipt_graph_pool_reserved_bytes", GIB)
            ax.bar(i, statistics.median(values), color="#4C72B0" if name == "descending" else "#999999")
            ax.plot([i] * len(values), values, "k.", markersize=7)
            ax.plot([i + 0.25] * len(pools), pools, "r_", markersize=10)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_ylabel("GiB")
        ax.set_title(f"{model}: graph memory (bar: median of vLLM's \"took\"; dots: boots; red: pool)",
                     fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _median(items: list[dict[str, Any]], key: str) -> str:
    values = _figures(items, key, 1)
    return f"{statistics.median(values):g}" if values else "-"


def generated(b: dict[str, Any]) -> bool:
    """Every request came back with all its tokens (two prompts, or one with ``single`` traffic)."""
    tokens = b.get("tokens") or []
    mode = b.get("mode", "llm")
    want = (1, SINGLE_TOKENS) if mode.endswith("single") else (len(PROMPTS), JOIN_TOKENS if mode.endswith(
        "join") else MAX_TOKENS)  # fmt: skip
    return bool(b.get("ok")) and len(tokens) == want[0] and all(len(t) == want[1] for t in tokens)


def captured(b: dict[str, Any]) -> bool:
    return b.get("vllm_capture_seconds") is not None


def arm_label(b: dict[str, Any]) -> str:
    who = {"plugin": "plugin", "vanilla": "no plugin"}.get(b["arm"], b["arm"])
    spec = MODELS.get(b["model"])
    return f"{who}, {spec.label if spec and spec.label else b['model']}"


def faults(boots: list[dict[str, Any]]) -> None:
    """After capture, per arm and variant (``vllm.LLM`` boots): captured, generated, faulted,
    JIT-at-inference, where the faults were raised; then the iff check and one line per boot."""
    llm = [b for b in boots if b.get("mode", "llm").startswith("llm")]
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for b in boots:
        rows.setdefault((f"{arm_label(b)} ({b.get('mode', 'llm')})", b.get("variant", "")), []).append(b)
    header = ("arm (traffic)", "variation", "captured/N", "all requests answered/N", "faulted/N",
              "JIT-at-inference/N", "JIT kernels", "fault raised in (deepest vLLM frame)", "JIT to fault s",
              "mixed steps seen/N", "short KDA index calls/N")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for (arm, variant), items in rows.items():
        n = len(items)
        kernels = sorted({k for b in items for k in b.get("jit_kernels", [])})
        where = sorted({str(b.get("fault_where")) for b in items if b.get("faulted")})
        gaps = [str(b["jit_to_fault_seconds"]) for b in items if "jit_to_fault_seconds" in b]
        answered = sum(
            generated(b) if b.get("mode", "llm").startswith("llm") else bool(b.get("ok")) for b in items
        )
        short = sum(
            any(c["words_read"] > c["words_allocated"] for c in b.get("kda_calls", [])) for b in items
        )
        print(f"| {arm} | {variant or '-'} | {sum(map(captured, items))}/{n} | "
              f"{answered}/{n} | {sum(bool(b.get('faulted')) for b in items)}/{n} | "
              f"{sum(bool(b.get('jit_at_inference')) for b in items)}/{n} | {', '.join(kernels) or '-'} | "
              f"{'; '.join(where) or '-'} | {', '.join(gaps) or '-'} | "
              f"{sum(bool(b.get('mixed_steps')) for b in items)}/{n} | {short}/{n} |")  # fmt: skip
    print()
    for name, group in (("all", llm), ("plugin", [b for b in llm if b["arm"] == "plugin"]),
                        ("no plugin", [b for b in llm if b["arm"] == "vanilla"])):  # fmt: skip
        faulted = [b for b in group if b.get("faulted")]
        jit = [b for b in group if b.get("jit_at_inference")]
        clean = sum(generated(b) and not b.get("faulted") for b in group)
        print(f"iff ({name}, {len(group)} boots): faulted boots with JIT-at-inference before the fault "
              f"{sum(bool(b.get('jit_before_fault')) for b in faulted)}/{len(faulted)}; JIT-at-inference "
              f"boots that faulted {sum(bool(b.get('faulted')) for b in jit)}/{len(jit)}; generated without "
              f"a fault {clean}/{len(group)}")  # fmt: skip
    single = [b for b in llm if b.get("mode") == "llm-single" and b.get("tokens")]
    if single:
        print()
        ref = next((b for b in single if "nospec" in b["model"]), None)
        for b in single:
            t = b["tokens"][0]
            pairs = enumerate(zip(t, ref["tokens"][0], strict=False)) if ref else iter(())
            same = "-" if ref is None else next((i for i, (x, y) in pairs if x != y), None)
            print(f"token check {b['boot_id']}: {len(t)} tokens; first token differing from no speculation: "
                  f"{'none' if same is None else same}")  # fmt: skip
    print()
    print("| boot | captured | generated | fault | raised in | JIT kernels (before fault) | JIT to fault s |")
    print("|---|---|---|---|---|---|---|")
    for b in sorted(llm, key=lambda b: b["boot_id"]):
        fault = (b.get("fault_text") or "-")[:90]
        before = ", ".join(b.get("jit_before_fault", b.get("jit_kernels", []))) or "-"
        raised = b.get("fault_raised_in") or "-"
        print(f"| {b['boot_id']} | {captured(b)} | {generated(b)} | {fault} | {raised} | {before} | "
              f"{b.get('jit_to_fault_seconds', '-')} |")  # fmt: skip
