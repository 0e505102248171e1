"""Capture-order study on a real GPU (issue 4): boot real vLLM with the plugin loaded by vLLM itself.

Each boot is a fresh ``python order_study.py boot`` process running ``vllm.LLM`` with vLLM's default
multiprocess engine; the plugin reaches the engine-core process only through its entry point, selected
with VLLM_PLUGINS. Arms:
  plugin: STAGING_PLUGIN_PRESIZE=on (the shipped behaviour)
  stock:  STAGING_PLUGIN_PRESIZE=off-allow-crash: vLLM's own lazy staging; the plugin only applies the
          order and writes the receipt (outside the timed capture window)
Boots are interleaved round-robin (round, model, order, arm) so drift falls on every cell alike.

  python benchmarks/order_study.py run --out DIR [--models qwen3-8b] [--rounds 3] [--deadline 540]
  python benchmarks/order_study.py summarize DIR        # boots table (markdown) + token check
  vllm-staging-plugin report DIR/receipts --plot DIR/study.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}  # fmt: skip
MODELS: dict[str, dict[str, Any]] = {  # public Qwen3 config.json shapes; weights are dummy
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "max_window_layers": 28, "tie_word_embeddings": True},
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "max_window_layers": 36, "tie_word_embeddings": False},
}  # fmt: skip
ARMS = {"stock": "off-allow-crash", "plugin": "on"}
ORDERS = ("descending", "ascending", "max-first", "shuffle:1")
PROMPTS = [list(range(100, 116)), list(range(2000, 2012))]
CRASH = "must match the existing size"
PROFILE_AND_REAL = "profiling pass first, real capture last"
CAPTURE_LINE = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
POOL_LINE = re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)")


def wait_for_gpu_memory(limit_mib: int = 2048, timeout: float = 90.0) -> None:
    """Block until the last boot's memory is back, so no boot starts on a partly taken GPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        try:
            used = int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0])
        except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
            return
        if used < limit_mib:
            return
        time.sleep(1.0)
    print(f"warning: GPU memory still in use after {timeout:.0f}s")


def model_dir(root: Path, name: str) -> Path:
    path = root / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(QWEN3_COMMON | MODELS[name], indent=1))
    return path


def boot(args: argparse.Namespace) -> int:
    """One engine boot in this process; writes a JSON record whatever happens."""
    record: dict[str, Any] = {"model": args.model, "order": args.order, "arm": args.arm, "ok": False}
    started = time.perf_counter()
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=args.model_dir, load_format="dummy", skip_tokenizer_init=True, seed=0,
            max_model_len=1024, gpu_memory_utilization=0.3, attention_backend="TRITON_ATTN",
        )  # fmt: skip
        record["boot_seconds"] = round(time.perf_counter() - started, 2)
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        record["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
        record["ok"] = True
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
        record["boot_seconds"] = round(time.perf_counter() - started, 2)
    Path(args.record).write_text(json.dumps(record))
    os._exit(0)  # the parent ends the engine-core process group; the record is written


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    for sub in ("boots", "logs", "receipts"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    models = args.models.split(",")
    dirs = {m: model_dir(out, m) for m in models}
    cells = [(r, m, o, a) for r in range(args.start_round, args.start_round + args.rounds)
             for m in models for o in args.orders.split(",") for a in args.arms.split(",")]  # fmt: skip
    if args.fill_to:
        cells = missing_cells(out, models, args.orders.split(","), args.arms.split(","), args.fill_to)
    if args.dry_run:
        for cell in cells:
            print("would boot", *cell)
        return 0
    # Budget by the typical boot (a guess of 60 s until one is seen), not the longest: the first boot of
    # a shape on a fresh machine compiles and takes about twice as long, and would end runs early.
    began, walls = time.monotonic(), [60.0]
    for rnd, model, order, arm in cells:
        elapsed = time.monotonic() - began
        if elapsed + statistics.median(walls) * 1.3 > args.deadline:
            print(f"deadline: stopping before round {rnd} {model} {order} {arm} ({elapsed:.0f}s used)")
            break
        boot_id = f"r{rnd}-{model}-{order.replace(':', '')}-{arm}"
        receipts = out / "receipts" / boot_id
        env = os.environ | {
            "VLLM_PLUGINS": "vllm_staging_plugin", "STAGING_PLUGIN_PRESIZE": ARMS[arm],
            "STAGING_PLUGIN_ORDER": order, "STAGING_PLUGIN_RECEIPTS_DIR": str(receipts),
            "VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1",
        }  # fmt: skip
        record_path = out / "boots" / f"{boot_id}.json"
        t0 = time.monotonic()
        with open(out / "logs" / f"{boot_id}.log", "w") as log:
            cmd = [sys.executable, __file__, "boot", "--model", model, "--model-dir", str(dirs[model]),
                   "--order", order, "--arm", arm, "--record", str(record_path)]  # fmt: skip
            child = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                child.wait(timeout=args.boot_timeout)
            except subprocess.TimeoutExpired:
                pass
            finally:  # the engine-core process outlives its front end: end the whole group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        wait_for_gpu_memory()
        wall = time.monotonic() - t0
        walls.append(wall)
        record = json.loads(record_path.read_text()) if record_path.exists() else {"ok": False}
        text = (out / "logs" / f"{boot_id}.log").read_text(errors="replace")
        record.update(
            boot_id=boot_id, round=rnd, model=model, order=order, arm=arm, wall_seconds=round(wall, 1)
        )
        record["staging_crash"] = CRASH in text
        lines = CAPTURE_LINE.findall(text)  # PROFILE_AND_REAL
        if len(lines) >= 2:
            record["vllm_profiling_capture_seconds"], record["vllm_profiling_took_gib"] = map(float, lines[0])
            record["vllm_capture_seconds"], record["vllm_took_gib"] = map(float, lines[-1])
        if m := POOL_LINE.search(text):
            record["vllm_actual_gib"], record["vllm_estimated_gib"] = float(m[1]), float(m[2])
        record_path.write_text(json.dumps(record, indent=1))
        capture, took = record.get("vllm_capture_seconds"), record.get("vllm_took_gib")
        print(f"{boot_id:<40} ok={record['ok']!s:<5} crash={record['staging_crash']!s:<5} "
              f"wall={wall:5.1f}s capture={capture} took={took}")  # fmt: skip
    return 0


def missing_cells(
    out: Path, models: list[str], orders: list[str], arms: list[str], target: int
) -> list[tuple[int, str, str, str]]:
    """Boots still needed for ``target`` per cell, given the records in ``out/boots``, round-robin."""
    done: dict[tuple[str, str, str], int] = {}
    last_round = -1
    for path in (out / "boots").glob("*.json"):
        b = json.loads(path.read_text())
        key = (b["model"], b["order"], b["arm"])
        done[key] = done.get(key, 0) + 1
        last_round = max(last_round, int(b.get("round", 0)))
    need = {(m, o, a): target - done.get((m, o, a), 0) for m in models for o in orders for a in arms}
    cells = []
    for step in range(max(need.values(), default=0)):
        cells += [(last_round + 1 + step, m, o, a) for (m, o, a), n in need.items() if n > step]
    return cells


def summarize(args: argparse.Namespace) -> int:
    boots = [json.loads(p.read_text()) for p in sorted(Path(args.directory).glob("**/boots/*.json"))]
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for b in boots:
        cells.setdefault((b["model"], b["order"], b["arm"]), []).append(b)
    header = ("model", "order", "arm", "booted/N", "staging crash", "boot s (median)", "vLLM capture s")
    print("| " + " | ".join((*header, "vLLM took GiB")) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for (model, order, arm), items in sorted(cells.items()):
        ok = sum(b["ok"] for b in items)
        crash = sum(b.get("staging_crash", False) for b in items)
        medians = " | ".join(
            _median(items, k) for k in ("boot_seconds", "vllm_capture_seconds", "vllm_took_gib")
        )
        print(f"| {model} | {order} | {arm} | {ok}/{len(items)} | {crash} | {medians} |")
    print()
    for model in sorted({b["model"] for b in boots}):
        mine = [b for b in boots if b["model"] == model and b.get("tokens")]
        by_arm = {b["arm"]: b["tokens"] for b in mine if b["order"] == "descending"}
        pair = by_arm.get("plugin") == by_arm.get("stock") if len(by_arm) == 2 else "n/a"
        same = all(b["tokens"] == mine[0]["tokens"] for b in mine) if mine else None
        print(f"{model}: descending tokens plugin == stock: {pair}; "
              f"all {len(mine)} successful boots produced identical tokens: {same}")  # fmt: skip
    return 0


def _median(items: list[dict[str, Any]], key: str) -> str:
    values = [b[key] for b in items if b.get(key) is not None]
    return f"{statistics.median(values):g}" if values else "-"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--models", default="qwen3-8b,qwen3-0.6b")
    r.add_argument("--orders", default=",".join(ORDERS))
    r.add_argument("--arms", default="stock,plugin")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--start-round", type=int, default=0)
    r.add_argument("--deadline", type=float, default=540.0, help="seconds; no boot starts past it")
    r.add_argument("--boot-timeout", type=float, default=240.0)
    r.add_argument("--fill-to", type=int, default=0, help="run only the boots missing for N per cell")
    r.add_argument("--dry-run", action="store_true", help="print the boots that would run")
    b = sub.add_parser("boot")
    for name in ("--model", "--model-dir", "--order", "--arm", "--record"):
        b.add_argument(name, required=True)
    s = sub.add_parser("summarize")
    s.add_argument("directory")
    args = parser.parse_args()
    return {"run": run, "boot": boot, "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
