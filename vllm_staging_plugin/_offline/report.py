"""Compare capture orders from a directory of receipts: N, median/min/max, ratio to descending.

Several ranks' receipts are reported per rank, each against its own rank's baseline.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exits import Exit
from .receipt_reader import read_receipts
from .text import MIB, first_line

METRICS = (
    ("graph_pool_reserved_bytes", "pool MiB", MIB),
    ("graph_memory_bytes", "took MiB", MIB),
    ("capture_seconds", "capture s", 1),
)


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float


@dataclass
class Row:
    config: str
    arm: str  # "plugin" (pre-sized) or "stock" (vLLM's lazy staging)
    policy: str
    n: int
    ok: int
    stats: dict[str, Stat | None]
    ratios: dict[str, float | None]
    rank: int = 0


class ReportError(Exception):
    """Nothing to report (missing, not a directory, or no capture receipt, or no plotting library): the
    CLI prints the message and exits with ``code`` (2 for a path that is no directory, else 1) instead of
    printing a table-less success."""

    def __init__(self, message: str, code: Exit = Exit.FAILS) -> None:
        super().__init__(message)
        self.code = code


def config_label(receipt: Mapping[str, Any]) -> str:
    sizes = receipt.get("capture_sizes") or []
    return (
        f"{receipt.get('architecture')} h={receipt.get('hidden_size')} "
        f"{receipt.get('cudagraph_mode')} {len(sizes)} sizes<= {max(sizes, default=0)} "
        f"vllm {receipt.get('vllm_version')} on {receipt.get('gpu_name') or 'cpu'}"
    )


def arm(receipt: Mapping[str, Any]) -> str:
    return "plugin" if receipt.get("presize", "on") == "on" else "stock"


def rank_of(receipt: Mapping[str, Any]) -> int:
    rank = receipt.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


def _stat(values: Sequence[float]) -> Stat | None:
    return Stat(statistics.median(values), min(values), max(values)) if values else None


def summarize(receipts: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Rows per (configuration, arm, policy, rank) over real-capture receipts (profiling ones are skipped)."""
    groups: dict[tuple[str, str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in receipts:
        if r.get("kind") == "capture":
            groups[(config_label(r), arm(r), str(r["policy"]), rank_of(r))].append(r)
    rows = []
    for (config, side, policy, rank), items in groups.items():
        good = [r for r in items if r.get("ok")]
        stats = {key: _stat([float(r[key]) for r in good if r.get(key) is not None]) for key, _, _ in METRICS}
        rows.append(Row(config, side, policy, len(items), len(good), stats, {}, rank))
    for row in rows:
        base = _baseline(rows, row.config, row.rank)
        for key, _, _ in METRICS:
            mine, ref = row.stats.get(key), base.stats.get(key) if base else None
            row.ratios[key] = mine.median / ref.median if mine and ref and ref.median else None
    order = {"descending": 0, "ascending": 1, "max-first": 2}
    return sorted(rows, key=lambda r: (r.config, r.arm != "stock", order.get(r.policy, 3), r.policy, r.rank))


def _baseline(rows: list[Row], config: str, rank: int) -> Row | None:
    """This rank's stock descending when the directory has it, else its plugin descending."""
    for side in ("stock", "plugin"):
        for row in rows:
            if (row.config, row.rank, row.arm, row.policy, row.ok > 0) == (
                config,
                rank,
                side,
                "descending",
                True,
            ):
                return row
    return None


def _many_ranks(rows: list[Row]) -> bool:
    return len({r.rank for r in rows}) > 1


def _fmt(stat: Stat | None, scale: float) -> str:
    if stat is None:
        return "-"
    return f"{stat.median / scale:.2f} [{stat.low / scale:.2f}-{stat.high / scale:.2f}]"


def format_table(rows: list[Row]) -> str:
    lines: list[str] = []
    for config in dict.fromkeys(r.config for r in rows):
        mine = [r for r in rows if r.config == config]
        ranked = _many_ranks(mine)  # a rank column only where several ranks wrote receipts
        header = ["arm", "policy", *(["rank"] if ranked else []), "ok/N"]
        for _, label, _ in METRICS:
            header += [f"{label} med [min-max]", "x desc"]
        body = [header]
        for r in mine:
            cells = [r.arm, r.policy, *([str(r.rank)] if ranked else []), f"{r.ok}/{r.n}"]
            for key, _, scale in METRICS:
                ratio = r.ratios.get(key)
                cells += [_fmt(r.stats.get(key), scale), f"{ratio:.2f}" if ratio else "-"]
            body.append(cells)
        widths = [max(len(row[i]) for row in body) for i in range(len(header))]
        lines.append(f"## {config}")
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body]
        lines.append("")
    lines.append("x desc: ratio of medians to stock descending (plugin descending if no stock run).")
    if _many_ranks(rows):
        lines.append("With several ranks, each rank is compared with its own rank's descending run.")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Bar chart of median (min-max whiskers) per arm and policy, one panel per metric."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError("--plot needs matplotlib: pip install 'vllm-staging-plugin[plot]'") from exc
    configs = list(dict.fromkeys(r.config for r in rows))
    fig, axes = plt.subplots(
        len(configs), len(METRICS), figsize=(5 * len(METRICS), 3.2 * len(configs)), squeeze=False
    )
    for i, config in enumerate(configs):
        mine = [r for r in rows if r.config == config]
        ranked = _many_ranks(mine)
        labels = [f"{r.arm}\n{r.policy}" + (f"\nrank {r.rank}" if ranked else "") for r in mine]
        for j, (key, label, scale) in enumerate(METRICS):
            ax = axes[i][j]
            stats = [r.stats.get(key) for r in mine]
            med = [s.median / scale if s else 0 for s in stats]
            err = [
                [(s.median - s.low) / scale if s else 0 for s in stats],
                [(s.high - s.median) / scale if s else 0 for s in stats],
            ]
            colors = ["tab:gray" if r.arm == "stock" else "tab:blue" for r in mine]
            ax.bar(range(len(mine)), med, yerr=err, color=colors, capsize=3)
            for x, (row, stat) in enumerate(zip(mine, stats, strict=True)):
                if stat is None:  # nothing to draw: say why instead of leaving a gap
                    ax.text(x, 0, f"{row.n - row.ok}/{row.n}\nfailed", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(mine)), labels, fontsize=7, rotation=45, ha="right")
            ax.set_title(f"{label}\n{config}" if j == 0 else label, fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:  # no such folder, no permission, a format matplotlib lacks
        raise ReportError(f"--plot {path}: {first_line(str(exc))}", code=Exit.BAD_INPUT) from exc
    finally:
        plt.close(fig)


def report(directory: Path | str, plot_path: Path | None = None) -> str:
    """The comparison table; :class:`ReportError` if there is nothing to compare. A file that is not a
    readable receipt is skipped with one line on stderr naming it."""
    shown, directory = str(directory), Path(directory)  # named as the operator typed it
    if not directory.exists():
        raise ReportError(f"no such directory: {shown}", code=Exit.BAD_INPUT)
    if not directory.is_dir():
        raise ReportError(f"not a directory: {shown}", code=Exit.BAD_INPUT)
    skipped: list[Path] = []

    def skip(path: Path, reason: str) -> None:
        skipped.append(path)
        print(f"vllm-staging-plugin report: skipped {path}: {reason}", file=sys.stderr)

    rows = summarize(read_receipts(directory, skip))
    if not rows:
        note = f" ({len(skipped)} file(s) skipped, see above)" if skipped else ""
        raise ReportError(
            f"no capture receipts in {shown}{note}; vLLM writes one JSON receipt "
            "per capture there when the plugin is active in it (vLLM 0.18.0 or later; `vllm-staging-plugin` "
            f"without arguments says whether it patches this vLLM) and STAGING_PLUGIN_RECEIPTS_DIR={shown}"
        )
    if plot_path is not None:
        plot(rows, plot_path)
    return format_table(rows)
