"""Steady-state decode throughput, plugin vs vanilla, under vLLM's own capture order.

Design, chosen so that the ratio is trustworthy:
- One engine per (shape, arm), each a long-lived ``driver`` process (``vllm.LLM``, vLLM's default multiprocess
  engine, the plugin loaded or not through VLLM_PLUGINS exactly as in order_study.py). The two arms of a shape
  share one GPU (``gpu_memory_utilization`` 0.3 each) and are booted one after the other, so neither sees
  the other's allocations during vLLM's memory profiling.
- Timed calls alternate between the two arms ABBA-wise (rep 0: A B, rep 1: B A, ...) on the same GPU and the
  same warmed-up engines, so clock, thermal and host drift falls on both arms alike, and only one engine
  works at a time. Shapes on other GPUs boot concurrently (the slow part) but are measured one shape after
  the other, so no timed call shares the host with another timed call.
- Each call is ``generate()`` of ``batch`` 16-token prompts with ``ignore_eos`` and a fixed ``max_tokens``
  (128 by default): prefill is one step of 128, so tokens/s is decode throughput. Batches 1 and 64 both
  replay FULL decode graphs (capture sizes reach 512). Untimed warm-up calls per arm and batch come first.
- Reported: tokens/s per call, the median per arm, the ratio of medians (plugin / vanilla) and the paired
  per-rep ratios; plus the first tokens of each arm (identical when the plugin changes nothing observable).

- ``--engines A,B,C`` (each ``MODEL=ARM[+VARIANT]``, lab/study/plan.py) compares engines that differ
  in more than the arm (another grid, a patched vLLM) on one GPU, at most two alive at once (a Kimi-K3 MXFP4
  engine holds about 55 GiB): A stays up, each other engine is booted after A, measured against A ABAB-wise
  (rep 0: A X, rep 1: X A, ...), and stopped before the next; ratios are X / A.

  python lab/decode_bench.py run --out DIR [--models qwen3-0.6b,qwen3-8b] [--batches 1,64] [--reps 3]
  python lab/decode_bench.py run --out DIR --engines MODEL=plugin,MODEL-workaround=vanilla,...
  python lab/decode_bench.py summarize DIR
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the same shapes, arms' environments and log analysis as the boot study (lab/study/)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from study import boot as study_boot
from study import logs, models, plan, scheduler


@dataclasses.dataclass
class Driver:
    """The coordinator's handle on one engine process; commands go in on stdin, answers come back as files."""

    shape: str
    arm: str
    gpu: int
    folder: Path
    variant: str = ""
    proc: subprocess.Popen[bytes] | None = None
    ready: dict[str, Any] | None = None
    error: str | None = None
    counter: int = 0
    stopped: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def start(self, out: Path, args: argparse.Namespace) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        receipts = out / "receipts" / self.folder.name
        env = study_boot.arm_env(self.arm, "descending", receipts, dict(os.environ))
        env |= models.MODELS[self.shape].env
        env |= study_boot.variant_env(self.variant, self.folder, dict(os.environ))
        env |= {"CUDA_VISIBLE_DEVICES": str(self.gpu), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        kwargs = models.engine_kwargs(out, self.shape, gpu_mem=args.gpu_mem)
        cmd = [sys.executable, __file__, "driver", "--kwargs", json.dumps(kwargs), "--dir", str(self.folder)]
        with self.lock, open(self.folder / "engine.log", "w") as log:
            if self.stopped:  # the run is being stopped: start nothing that would outlive it
                raise RuntimeError(f"{self.shape}/{self.arm}: not started, the run is stopping")
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_file(self, path: Path, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.shape}/{self.arm}: engine process ended")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.shape}/{self.arm}: no {path.name} after {timeout:.0f}s")
            time.sleep(0.05)
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def ask(self, batch: int, max_tokens: int, timeout: float = 180.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.counter += 1
        cmd = {"id": self.counter, "batch": batch, "max_tokens": max_tokens}
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return self.wait_file(self.folder / f"answer-{self.counter}.json", timeout)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.proc is None:
                return
            with contextlib.suppress(ProcessLookupError):  # the engine core outlives its front end
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def driver(args: argparse.Namespace) -> int:
    """Inside the engine process: boot, say ready, then answer timed generate() calls until stdin closes."""
    folder = Path(args.dir)
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(**json.loads(args.kwargs))
    ready: dict[str, Any] = {"boot_seconds": round(time.perf_counter() - started, 2)}
    with contextlib.suppress(Exception):  # shipped by value: the workers need not import the study package
        ready["workers"] = llm.collective_rpc(study_boot.runner_rpc(), timeout=60)
    _write(folder / "ready.json", ready)
    for line in sys.stdin:
        cmd = json.loads(line)
        batch, max_tokens = int(cmd["batch"]), int(cmd["max_tokens"])
        prompts = [
            {"prompt_token_ids": [100 + (17 * i + j) % 30000 for j in range(16)]} for i in range(batch)
        ]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        answer = {"id": cmd["id"], "batch": batch, "max_tokens": max_tokens, "seconds": seconds,
                  "tokens": tokens, "tokens_per_s": tokens / seconds,
                  "first_tokens": list(outputs[0].outputs[0].token_ids)[:16]}  # fmt: skip
        _write(folder / f"answer-{cmd['id']}.json", answer)
    os._exit(0)


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _boot_gpu(drivers: list[Driver], out: Path, args: argparse.Namespace) -> None:
    """Boot the arms sharing one GPU one after the other (vLLM's profiler counts the device's memory)."""
    for d in drivers:
        try:
            d.start(out, args)
            d.ready = d.wait_file(d.folder / "ready.json", args.boot_timeout)
        except (RuntimeError, TimeoutError) as exc:
            d.error = str(exc)
        print(f"booted {d.shape}/{d.arm} on GPU {d.gpu}: {d.ready or d.error}", flush=True)


def engine_driver(spec: str, gpu: int, out: Path) -> Driver:
    """``MODEL=ARM[+VARIANT]`` -> its driver (the variant changes the environment, as in the study)."""
    model, sep, rest = spec.partition("=")
    arm, _, variant = rest.partition("+")
    if not sep or model not in models.MODELS or arm not in plan.ARMS:
        raise SystemExit(f"engine {spec!r}: want MODEL=ARM[+VARIANT], ARM one of {', '.join(plan.ARMS)}")
    plan.variant_parts(variant)  # exits naming an unknown variant
    name = f"{model}-{arm}" + (f"-{variant}" if variant else "")
    return Driver(model, arm, gpu, out / "engines" / name, variant=variant)


def run_pairs(args: argparse.Namespace, out: Path) -> int:
    """``--engines``: the first engine against each other one in turn, two alive at once on one GPU."""
    specs = args.engines.split(",")
    drivers = [engine_driver(s, 0, out) for s in specs]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"engines on GPU 0, baseline {specs[0]}; each other engine booted after it and measured against it")
    print(f"per pair: batches {batches}, {args.warmup} warm-up + {args.reps} timed calls per engine, ABAB")
    if args.dry_run:
        for d in drivers:
            kwargs = models.engine_kwargs(out, d.shape, gpu_mem=args.gpu_mem)
            print(f"{d.folder.name} {json.dumps(kwargs, sort_keys=True)}")
        return 0
    began = time.monotonic()
    calls: list[dict[str, Any]] = []
    boots: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, scheduler.stop)
    base = drivers[0]
    try:
        _boot_gpu([base], out, args)
        for other in drivers[1:]:
            if base.ready is None or time.monotonic() - began > args.deadline:
                break
            held = scheduler.gpu_used_mib(0) or 0  # the baseline's memory alone
            try:
                _boot_gpu([other], out, args)
                if other.ready is not None:
                    pair = [base, other]
                    calls += [
                        c | {"pair": other.folder.name}
                        for c in measure(
                            base.folder.name, pair, batches, args, began, label=lambda d: d.folder.name
                        )
                    ]
            finally:
                other.stop()
                # the next engine loads only once this one's memory is back (else it can run out of
                # memory while loading its weights beside the baseline)
                scheduler.wait_for_gpu_memory([0], limit_mib=held + 2048)
                boots.append(_boot_record(other, out))
                _save(out, args, [*boots, _boot_record(base, out)], calls)
    finally:
        base.stop()
    print(table(_save(out, args, [*boots, _boot_record(base, out)], calls)))
    return 0


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    if args.engines:
        return run_pairs(args, out)
    shapes, arms = args.models.split(","), args.arms.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    n_gpus = args.gpus or scheduler.gpu_count() or 1
    waves = [shapes[i : i + n_gpus] for i in range(0, len(shapes), n_gpus)]
    plan = [f"wave {w}: " + ", ".join(f"{s} on GPU {g} ({'+'.join(arms)})" for g, s in enumerate(wave))
            for w, wave in enumerate(waves)]  # fmt: skip
    print("\n".join(plan))
    print(f"per shape: batches {batches}, {args.warmup} warm-up + {args.reps} timed calls per arm, ABBA")
    if args.dry_run:
        for s in shapes:
            print(s, json.dumps(models.engine_kwargs(out, s, gpu_mem=args.gpu_mem), sort_keys=True))
        return 0
    began = time.monotonic()
    calls: list[dict[str, Any]] = []
    boots: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, scheduler.stop)  # an outer `timeout` must not leave engines on the GPUs
    for wave in waves:
        drivers = {
            (s, a): Driver(s, a, g, out / "engines" / f"{s}-{a}") for g, s in enumerate(wave) for a in arms
        }
        try:
            per_gpu = [[drivers[s, a] for a in arms] for s in wave]
            threads = [
                threading.Thread(target=_boot_gpu, args=(ds, out, args), daemon=True) for ds in per_gpu
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for s in wave:
                if any(drivers[s, a].ready is None for a in arms):
                    print(f"{s}: an arm did not boot, not measured")
                    continue
                calls += measure(s, [drivers[s, a] for a in arms], batches, args, began)
        finally:
            for d in drivers.values():
                d.stop()
            boots += [_boot_record(d, out) for d in drivers.values()]
            _save(out, args, boots, calls)  # whatever was measured survives a stop
    print(table(_save(out, args, boots, calls)))
    return 0


def _save(
    out: Path, args: argparse.Namespace, boots: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> dict[str, Any]:
    result = {"args": vars(args), "boots": boots, "calls": calls}
    (out / "decode.json").write_text(json.dumps(result, indent=1))
    return result


def _boot_record(d: Driver, out: Path) -> dict[str, Any]:
    try:
        text = (d.folder / "engine.log").read_text(errors="replace")
    except OSError:
        text = ""
    info = logs.analyse_log(text, d.folder / "engine.trim.log")
    receipts = len(list((out / "receipts" / d.folder.name).glob("receipt-*.json")))
    keep = ("runner_log", "plugin_log_lines", "vllm_capture_seconds", "staging_crash")
    boot = {
        "shape": d.shape,
        "arm": d.arm,
        "variant": d.variant,
        "gpu": d.gpu,
        "ready": d.ready,
        "error": d.error,
    }
    return boot | {k: info.get(k) for k in keep} | {"receipts": receipts}


def measure(
    shape: str,
    drivers: list[Driver],
    batches: list[int],
    args: argparse.Namespace,
    began: float,
    label: Callable[[Driver], str] = lambda d: d.arm,
) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for batch in batches:
        for d in drivers:
            for _ in range(args.warmup):
                d.ask(batch, args.max_tokens)
        for rep in range(args.reps):
            if time.monotonic() - began > args.deadline:
                print(f"deadline: {shape} batch {batch} stopped before rep {rep}")
                return calls
            for d in drivers if rep % 2 == 0 else drivers[::-1]:
                answer = d.ask(batch, args.max_tokens)
                calls.append({"shape": shape, "arm": label(d), "batch": batch, "rep": rep, **answer})
                rate, secs = answer["tokens_per_s"], answer["seconds"]
                print(
                    f"{shape:<12} batch {batch:<3} rep {rep} {label(d):<8} {rate:9.1f} tok/s ({secs:.3f} s)",
                    flush=True,
                )
    return calls


def table(result: dict[str, Any]) -> str:
    """Per shape and batch: tokens/s per call and median per arm, ratio of medians, paired ratios."""
    if result["args"].get("engines"):
        return _pairs_table(result)
    calls = result["calls"]
    arms = result["args"]["arms"].split(",")
    base, other = arms[0], arms[-1]
    lines = [f"| shape | batch | arm | tok/s per call | median | {other}/{base} (medians) | paired ratios | "
             "first tokens equal |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape, batch in sorted({(c["shape"], c["batch"]) for c in calls}):
        mine = [c for c in calls if c["shape"] == shape and c["batch"] == batch]
        med = {
            a: statistics.median([c["tokens_per_s"] for c in mine if c["arm"] == a] or [0.0]) for a in arms
        }
        by_rep = {(c["rep"], c["arm"]): c for c in mine}
        reps = sorted(r for r in {c["rep"] for c in mine} if (r, other) in by_rep and (r, base) in by_rep)
        paired = [by_rep[r, other]["tokens_per_s"] / by_rep[r, base]["tokens_per_s"] for r in reps]
        firsts = {json.dumps(c["first_tokens"]) for c in mine}
        for a in arms:
            per_call = ", ".join(f"{c['tokens_per_s']:.1f}" for c in mine if c["arm"] == a)
            ratio = f"{med[other] / med[base]:.4f}" if a == other and med[base] else ""
            pairs = ", ".join(f"{p:.4f}" for p in paired) if a == other else ""
            same = str(len(firsts) == 1) if a == other else ""
            lines.append(
                f"| {shape} | {batch} | {a} | {per_call} | {med[a]:.1f} | {ratio} | {pairs} | {same} |"
            )
    boots = [f"{b['shape']}/{b['arm']}: runner {b['runner_log']}, plugin log lines {b['plugin_log_lines']}, "
             f"receipts {b['receipts']}, capture {b['vllm_capture_seconds']} s, error {b['error']}"
             for b in result["boots"]]  # fmt: skip
    return "\n".join([*lines, "", *boots])


def _pairs_table(result: dict[str, Any]) -> str:
    """Per compared engine and batch: tokens/s per call of both, the ratio of medians (other / baseline)
    and the paired per-rep ratios."""
    calls = result["calls"]
    lines = ["| engine | batch | tok/s per call | median | vs baseline (medians) | paired ratios | "
             "first tokens equal |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for pair, batch in sorted({(c["pair"], c["batch"]) for c in calls}):
        mine = [c for c in calls if c["pair"] == pair and c["batch"] == batch]
        base = mine[0]["shape"]
        rates = {a: [c["tokens_per_s"] for c in mine if c["arm"] == a] for a in (base, pair)}
        med = {a: statistics.median(r or [0.0]) for a, r in rates.items()}
        by_rep = {(c["rep"], c["arm"]): c["tokens_per_s"] for c in mine}
        reps = sorted(r for r, a in by_rep if a == pair and (r, base) in by_rep)
        paired = ", ".join(f"{by_rep[r, pair] / by_rep[r, base]:.4f}" for r in reps)
        same = str(len({json.dumps(c["first_tokens"]) for c in mine}) == 1)
        for a in (base, pair):
            ratio = f"{med[pair] / med[base]:.4f}" if a == pair and med[base] else ""
            per_call = ", ".join(f"{r:.1f}" for r in rates[a])
            lines.append(f"| {a} | {batch} | {per_call} | {med[a]:.1f} | {ratio} | "
                         f"{paired if a == pair else ''} | {same if a == pair else ''} |")  # fmt: skip
    boots = [f"{b['shape']}/{b['arm']}{'+' + b['variant'] if b.get('variant') else ''}: runner "
             f"{b['runner_log']}, plugin log lines {b['plugin_log_lines']}, receipts {b['receipts']}, "
             f"capture {b['vllm_capture_seconds']} s, error {b['error']}"
             for b in result["boots"]]  # fmt: skip
    return "\n".join([*lines, "", *boots])


def summarize(args: argparse.Namespace) -> int:
    path = Path(args.directory) / "decode.json"
    if not path.exists():
        print(f"no {path}: nothing was measured")
        return 1
    print(table(json.loads(path.read_text())))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--models", default="qwen3-0.6b,qwen3-8b")
    r.add_argument("--arms", default="vanilla,plugin", help="first is the baseline of the ratio")
    r.add_argument("--engines", default="", help="MODEL=ARM[+VARIANT],...: the first against each other "
                   "one in turn, on one GPU (replaces --models/--arms)")  # fmt: skip
    r.add_argument("--batches", default="1,64")
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--max-tokens", type=int, default=128)
    r.add_argument("--gpu-mem", type=float, default=0.3)
    r.add_argument("--gpus", type=int, default=0)
    r.add_argument("--boot-timeout", type=float, default=300.0)
    r.add_argument("--deadline", type=float, default=480.0, help="seconds; no timed rep starts past it")
    r.add_argument("--dry-run", action="store_true")
    d = sub.add_parser("driver")
    d.add_argument("--kwargs", required=True)
    d.add_argument("--dir", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("directory")
    args = parser.parse_args()
    return {"run": run, "driver": driver, "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
