"""How long `vllm-staging-plugin check -- ...` takes, cold and warm, per phase. A benchmark,
not a test: run it on a quiet machine and record the table (docs/preflight.md, "How long it takes").

  python lab/preflight_speed.py [--n 5] [--out FILE.json]

Each run is the console script in a fresh process, as an operator runs it, on the small Kimi-Linear
recover-SSM configuration (a crash: the stock workaround's verification replays are part of it). *Cold*:
an empty VLLM_CACHE_ROOT, so vLLM inspects the model class again in its subprocess (the first check of an
architecture on a machine). *Warm*: a cache filled by one unrecorded run first. Cold and warm runs
alternate. Phases come from the check's own ``seconds`` (--json); ``startup`` is the rest of the wall
time: the interpreter, the plugin's and argparse's imports, and process exit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study.models import KIMI_LINEAR_4L

ARGS = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--use-replayssm", "--max-num-seqs", "4",
    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}',
    "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}',
]  # fmt: skip
PHASES = ("startup", "imports", "inspect", "configure", "replay", "workaround", "total")


def one_run(script: Path, model: Path, cache: Path) -> dict[str, float]:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.run([str(script), "check", "--json", "--", str(model), *ARGS], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    wall = time.perf_counter() - started
    out = json.loads(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"the check failed: {out.get('message')}")
    seconds = {name: float(v) for name, v in out["seconds"].items()}
    seconds["startup"] = wall - sum(seconds.values())
    seconds["total"] = wall
    return seconds


def table(runs: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| phase | " + " | ".join(f"{kind} median [min-max] s" for kind in runs) + " |",
             "|---|" + "---|" * len(runs)]  # fmt: skip
    for phase in PHASES:
        cells = []
        for items in runs.values():
            values = [r.get(phase, 0.0) for r in items]
            cells.append(f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bytecode_cached() -> bool:
    """Whether vLLM's modules have compiled bytecode (pip writes it unless --no-compile; without it every
    run compiles vLLM's sources again, seconds of the imports phase)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    where = Path(spec.origin).parent if spec and spec.origin else None
    return bool(where and any((where / "config" / "__pycache__").glob("*.pyc")))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--out", help="also write the runs and the table as JSON here")
    args = parser.parse_args()
    script = Path(sys.executable).with_name("vllm-staging-plugin")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "kimi-linear-4l"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(KIMI_LINEAR_4L))
        warm_cache = Path(tmp) / "warm-cache"
        one_run(script, model, warm_cache)  # fills the warm cache; not recorded
        runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
        for i in range(args.n):
            runs["cold"].append(one_run(script, model, Path(tmp) / f"cold-cache-{i}"))
            runs["warm"].append(one_run(script, model, warm_cache))
            print(f"run {i + 1}/{args.n}: cold {runs['cold'][-1]['total']:.1f} s, "
                  f"warm {runs['warm'][-1]['total']:.1f} s", file=sys.stderr)  # fmt: skip
    text = table(runs)
    conditions = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "vllm_bytecode_cached": _bytecode_cached(),
        "n": args.n,
    }  # fmt: skip
    print(f"conditions: {conditions}")
    print(text)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"conditions": conditions, "runs": runs, "table": text}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
