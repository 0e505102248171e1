"""The Kimi-K3 settings operators deploy, each answered by the pre-flight on the installed vLLM: what stock
vLLM does at capture, what the plugin does, and the workaround without it. Writes docs/k3-settings.md.

Every row is one `check` of `tests/data/kimi-k3-4l` (Kimi-K3's published structure, 4 layers; the
capture plan does not depend on the depth) with the row's `vllm serve` arguments, run in this process.

  .venv/bin/python lab/k3_settings.py           # rewrites docs/k3-settings.md (about 15 s on 2 cores)
  .venv/bin/python lab/k3_settings.py --check   # exit 1 if the page differs from a fresh run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "k3-settings.md"
MODEL = "tests/data/kimi-k3-4l"
POWERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

# Where each setting comes from. The drafters are config-only folders in tests/data shaped after the
# public K3 DSpark cards (their README says which field comes from where).
SOURCES = {
    "tp8": "vLLM's Kimi-K3 recipe: tensor parallel 8 on one 8-GPU node",
    "tp16": "vLLM's Kimi-K3 recipe: tensor parallel 16 on two 8 x H200 nodes",
    "seqs48": "the K3 deployment this plugin was built for: max_num_seqs 48, 8 speculative tokens",
    "ngram8": "n-gram speculation at 8 tokens (the K3 deployment's width)",
    "b8": "K3 DSpark drafter, 8-token blocks (tests/data/kimi-k3-dspark-b8) at 8 tokens",
    "b7": "K3 DSpark drafter drafting up to 7 tokens (lightseekorg/kimi-k3-dspark's card; "
    "tests/data/kimi-k3-dspark-b7)",
    "b5": "K3 DSpark drafter, 3 layers and 3 taps, 5-token blocks (tests/data/kimi-k3-dspark-b5)",
    "replayssm": "--use-replayssm on (recover-SSM) and off",
    "grids": "vLLM's derived grid (no -cc) and an operator's power-of-two grid to 512",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Setting:
    """One deployment: the speculation, tensor parallel size, --use-replayssm and the grid."""

    spec: str  # a key of SPECS
    tp: int
    replayssm: bool
    powers: bool  # True: -cc powers of two to 512; False: vLLM derives the grid

    def argv(self) -> list[str]:
        argv = [MODEL, "--load-format", "dummy", "--skip-tokenizer-init", "--max-num-seqs", "48",
                "--tensor-parallel-size", str(self.tp),
                "--speculative-config", json.dumps(SPECS[self.spec])]  # fmt: skip
        if self.replayssm:
            argv.append("--use-replayssm")
        if self.powers:
            argv += ["-cc", json.dumps({"cudagraph_capture_sizes": POWERS})]
        return argv


SPECS: dict[str, dict[str, Any]] = {
    "ngram8": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2},
    "b8": {"method": "dspark", "model": "tests/data/kimi-k3-dspark-b8", "num_speculative_tokens": 8},
    "b7": {"method": "dspark", "model": "tests/data/kimi-k3-dspark-b7"},
    "b5": {"method": "dspark", "model": "tests/data/kimi-k3-dspark-b5"},
}
SETTINGS = [
    Setting(spec, tp, replay, powers)
    for tp in (8, 16)
    for spec in SPECS
    for replay in (True, False)
    for powers in (True, False)
]


def answer(setting: Setting) -> dict[str, Any]:
    """The pre-flight's JSON answer for one setting (vLLM's logs dropped)."""
    from vllm_staging_plugin._offline.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--json", "--", *setting.argv()])
    result: dict[str, Any] = json.loads(out.getvalue())
    result["exit_code"] = code
    return result


def _crash_pair(error: str) -> str:
    """``(256) ... (261)`` from vLLM's expanded-size message."""
    words = error.split()
    sizes = [w for w in words if w.startswith("(") and w.rstrip(")").strip("(").isdigit()]
    return " ... ".join(sizes[:2]) if len(sizes) >= 2 else error[:60]


def row(setting: Setting, result: dict[str, Any]) -> str:
    """One markdown row: the setting, its plan, and the three answers."""
    spec = {"ngram8": "n-gram, 8 tokens", "b8": "DSpark block 8, 8 tokens", "b7": "DSpark block 7",
            "b5": "DSpark block 5"}[setting.spec]  # fmt: skip
    grid = "powers of two to 512" if setting.powers else "vLLM's derived"
    head = f"| {setting.tp} | {spec} | {'on' if setting.replayssm else 'off'} | {grid} |"
    if "capacity" not in result:  # the check could not be made: say what it said
        return f"{head} - | - | {result.get('error', '?')} | - | - |"
    stock = result["stock"]
    stock_text = "boots" if stock["ok"] else f"crashes at capture {_crash_pair(stock['error'] or '')}"
    plugin = "boots" if result["plugin"]["ok"] else "fails"
    if result["exit_code"] == 4:
        plugin += "; will not serve (shared KDA layer)"
    workaround = result.get("stock_workaround") or {}
    fix = "-" if stock["ok"] else ("add " + ", ".join(
        str(s) for s in workaround.get("cudagraph_capture_sizes", []) if s not in result["capture_sizes"]
    ) + " to the grid" if workaround.get("verified") else "none verified")  # fmt: skip
    aux = sum(1 for name in result["plugin"]["buffers"] if name.startswith("aux_hidden_states"))
    rows = f"{result['capacity']} ({aux} aux)"
    return f"{head} {result['decode_query_len']} | {rows} | {stock_text} | {plugin} | {fix} |"


def page(rows: list[str]) -> str:
    header = [
        "# Kimi-K3 settings, answered",
        "",
        "The settings Kimi-K3 deployments use, each answered by `vllm-staging-plugin check` on vLLM 0.33.0",
        "(`tests/data/kimi-k3-4l`, the published structure cut to 4 layers, with `--max-num-seqs 48`).",
        "Generated by `lab/k3_settings.py`; a test re-runs some rows and compares them with this page.",
        "*stock*: vLLM without the plugin, in its own order; *workaround*: the capture size `check` adds",
        "to the grid so that stock vLLM boots (verified by replaying stock vLLM with it). The GPU boots of",
        "three of these settings at tensor parallel 1 (`--use-replayssm`, powers of two: DSpark blocks 8,",
        "5 and 7) are in [data/2026-12-02-k3-deploy](data/2026-12-02-k3-deploy/README.md); tensor",
        "parallelism does not change a rank's capture plan (every rank stages the full hidden size), so",
        "the answers hold per rank.",
        "",
        "| TP | speculation | `--use-replayssm` | grid | decode_query_len | staging rows | stock vLLM "
        "| with the plugin | workaround without it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    sources = ["", "Sources of the settings:", ""] + [f"- {text}" for text in SOURCES.values()]
    return "\n".join([*header, *rows, *sources]) + "\n"


def generate(settings: list[Setting]) -> list[str]:
    return [row(s, answer(s)) for s in settings]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with docs/k3-settings.md, write nothing"
    )
    args = parser.parse_args()
    text = page(generate(SETTINGS))
    if args.check:
        same = PAGE.read_text() == text
        print("docs/k3-settings.md is current" if same else "docs/k3-settings.md differs from a fresh run")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(SETTINGS)} settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
