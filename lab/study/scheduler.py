"""Where and when boots run: each a child process group on its GPUs, started in plan order while GPUs are
free and the deadline still fits a typical boot, so that a stage fits one GPU-machine call and a call
again on the same machine (``--fill-to``) runs only what is missing. ``--per-gpu`` shares one GPU."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from study.boot import arm_env, variant_env
from study.logs import KV_LINE, analyse_log
from study.models import MODELS, engine_kwargs
from study.plan import STOPPED, Cell, planned_cells

ENTRY = Path(__file__).resolve().parent.parent / "order_study.py"  # its ``boot`` command runs one boot


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def gpu_used_mib(index: int) -> int | None:
    query = ["nvidia-smi", "-i", str(index), "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        return int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
        return None


def wait_for_gpu_memory(gpus: list[int], limit_mib: int = 2048, timeout: float = 90.0) -> None:
    """Block until a finished boot's memory is back, so no boot starts on a partly taken GPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        used = [gpu_used_mib(g) for g in gpus]
        if all(u is None or u < limit_mib for u in used):
            return
        time.sleep(1.0)
    print(f"warning: GPU memory of {gpus} still in use after {timeout:.0f}s")


@dataclasses.dataclass
class Running:
    """A boot in flight: its child process group, GPUs, log and record paths."""

    cell: Cell
    child: subprocess.Popen[bytes]
    gpus: list[int]
    started: float
    log: Path
    record: Path
    forced_env: dict[str, str]


def _past_profiling(run: Running) -> bool:
    """True once every worker of the boot has sized its KV cache (memory profiling is over)."""
    try:
        return run.log.read_text(errors="replace").count(KV_LINE) >= run.cell.gpus
    except OSError:
        return False


def _place(cell: Cell, running: list[Running], n_gpus: int, per_gpu: int) -> list[int] | None:
    """GPUs for ``cell`` now, or None. A multi-GPU boot needs its GPUs to itself; with ``per_gpu`` > 1 a
    boot joins a GPU only while no boot there is still profiling memory (vLLM's profiler counts every
    process's allocations on the device as its own)."""
    load = {g: [r for r in running if g in r.gpus] for g in range(n_gpus)}
    if cell.gpus > 1:
        free = [g for g in range(n_gpus) if not load[g]]
        return free[: cell.gpus] if len(free) >= cell.gpus else None
    options = [g for g in range(n_gpus) if len(load[g]) < per_gpu and all(
        r.cell.gpus == 1 and _past_profiling(r) for r in load[g])]  # fmt: skip
    return [min(options, key=lambda g: len(load[g]))] if options else None


def _start(cell: Cell, gpus: list[int], out: Path, args: argparse.Namespace) -> Running:
    receipts = out / "receipts" / cell.boot_id
    env = arm_env(cell.arm, cell.order, receipts, dict(os.environ)) | MODELS[cell.model].env
    forced = variant_env(cell.variant, out / "scratch" / cell.boot_id, env, cell.mode)
    env |= forced
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if cell.mode.startswith("llm"):  # lets collective_rpc ship runner_of to the workers
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    kwargs = engine_kwargs(out, cell.model, cell.tp, cell.pp, args.gpu_mem, cell.executor)
    record = out / "boots" / f"{cell.boot_id}.json"
    log = out / "logs" / f"{cell.boot_id}.log"
    cmd = [sys.executable, str(ENTRY), "boot", "--mode", cell.mode, "--kwargs", json.dumps(kwargs),
           "--record", str(record), "--boot-timeout", str(args.boot_timeout)]  # fmt: skip
    with open(log, "w") as handle:
        child = subprocess.Popen(
            cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Running(cell, child, gpus, time.monotonic(), log, record, forced)


def _finish(run: Running, out: Path, busy: set[int] | None) -> dict[str, Any]:
    """End the boot's process group, wait for its GPU memory (not when ``busy`` is None: the study is
    stopping), and complete its record from the log."""
    with contextlib.suppress(ProcessLookupError):  # the engine core outlives its front end: end the group
        os.killpg(run.child.pid, signal.SIGKILL)
    run.child.wait()
    if busy is not None:
        wait_for_gpu_memory([g for g in run.gpus if g not in busy])  # GPUs no other boot is using
    wall = time.monotonic() - run.started
    record: dict[str, Any] = (
        json.loads(run.record.read_text()) if run.record.exists() else {"ok": False, "error": "no record"}
    )
    c = run.cell
    record.update(boot_id=c.boot_id, round=c.round, model=c.model, order=c.order, arm=c.arm, tp=c.tp, pp=c.pp,
                  mode=c.mode, executor=c.executor, gpus=run.gpus, wall_seconds=round(wall, 1))  # fmt: skip
    if c.variant:  # records of plain boots stay as they were
        record["variant"] = c.variant
    if run.forced_env:
        record["forced_env"] = run.forced_env
    record.update(analyse_log(run.log.read_text(errors="replace"), out / "logs" / f"{c.boot_id}.trim.log"))
    receipts = sorted((out / "receipts" / c.boot_id).glob("receipt-*.json"))
    classes = sorted({str(w.get("runner_class")) for w in record.get("workers") or []})
    record["runner_classes"] = classes  # from the workers themselves (LLM boots)
    v2 = "vllm.v1.worker.gpu."
    by_class = ("v2" if all(c.startswith(v2) for c in classes) else "v1") if classes else None
    record["runner"] = by_class or record["runner_log"]
    record["receipts"] = len(receipts)
    written = [json.loads(p.read_text()) for p in receipts]
    record["receipt_ranks"] = sorted({r.get("rank") for r in written}, key=str)
    record["receipt_pids"] = sorted({r.get("pid") for r in written}, key=str)  # which processes captured
    record["receipt_orders"] = sorted({f"{r.get('kind')}:{r.get('policy')}" for r in written})
    real = [r for r in written if r.get("kind") == "capture" and r.get("ok")]
    if len(real) == 1:  # one engine, one real capture: its measured figures (the order study's table)
        for field in ("graph_pool_reserved_bytes", "graph_pool_active_bytes", "graph_memory_bytes",
                      "capture_seconds", "captured_modes", "captured_sequence"):  # fmt: skip
            record[f"receipt_{field}"] = real[0].get(field)
    run.record.write_text(json.dumps(record, indent=1))
    shutil.rmtree(out / "scratch" / c.boot_id, ignore_errors=True)  # a fresh Triton cache is not kept
    return record


def run(args: argparse.Namespace) -> int:
    """Run the planned boots (or, with ``--dry-run``, print them) and write one record per boot."""
    out = Path(args.out).resolve()
    for sub in ("boots", "logs", "receipts"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    cells = planned_cells(args, out)
    n_gpus = args.gpus or gpu_count() or (1 if not args.dry_run else 2)
    if any(c.gpus > n_gpus for c in cells):
        raise SystemExit(f"a boot needs {max(c.gpus for c in cells)} GPUs; {n_gpus} here")
    if args.dry_run:
        for cell in cells:
            kwargs = engine_kwargs(out, cell.model, cell.tp, cell.pp, args.gpu_mem, cell.executor)
            forced = variant_env(cell.variant, out / "scratch" / cell.boot_id, dict(os.environ), cell.mode)
            env = f" env={json.dumps(forced, sort_keys=True)}" if forced else ""
            print("would boot", cell.boot_id, f"gpus={cell.gpus}", json.dumps(kwargs, sort_keys=True) + env)
        shutil.rmtree(out / "scratch", ignore_errors=True)
        print(f"{len(cells)} boots on {n_gpus} GPUs, up to {args.concurrent} at once, {args.per_gpu} per GPU")
        return 0
    began, queue = time.monotonic(), list(cells)
    walls: dict[str, list[float]] = {}  # per model, in finishing order: the deadline's estimate
    running: list[Running] = []
    signal.signal(signal.SIGTERM, stop)  # an outer `timeout` must not leave engines holding the GPUs
    try:
        while queue or running:
            _start_what_fits(queue, running, n_gpus, began, walls, out, args)
            for r in list(running):
                if r.child.poll() is None and time.monotonic() - r.started < args.boot_timeout + 30:
                    continue
                running.remove(r)
                record = _finish(r, out, {g for other in running for g in other.gpus})
                walls.setdefault(r.cell.model, []).append(record["wall_seconds"])
                print(f"{record['boot_id']:<52} gpus={','.join(map(str, r.gpus)):<4} ok={record['ok']!s:<5} "
                      f"crash={record['staging_crash']!s:<5} wall={record['wall_seconds']:5.1f}s "
                      f"runner={record['runner']} receipts={record['receipts']} "
                      f"capture={record.get('vllm_capture_seconds')} http={record.get('http_status', '-')} "
                      f"fault={record['faulted']!s:<5} jit={','.join(record['jit_kernels']) or '-'}",
                      flush=True)  # fmt: skip
            time.sleep(0.5)
    finally:
        stop_running(running, out)
    return 0


def stop_running(running: list[Running], out: Path) -> None:
    """The study stops early: end the boots still running and wait for nothing. A boot whose log already
    shows a CUDA fault is a measurement (its process may hang after the fault until the deadline), so it
    keeps its record from the log; any other is noted as stopped and counts nowhere."""
    for r in running:
        record = _finish(r, out, busy=None)
        if record["faulted"]:
            if record.get("error") in (None, "no record"):
                record["error"] = f"faulted, then stopped by the study: {record['fault_text']}"
                r.record.write_text(json.dumps(record, indent=1))
            print(f"{r.cell.boot_id}: faulted, then stopped while running")
            continue
        note = {"boot_id": r.cell.boot_id, "ok": False, "error": f"{STOPPED} the study was stopped"}
        r.record.write_text(json.dumps(note | dataclasses.asdict(r.cell), indent=1))
        print(f"{r.cell.boot_id}: stopped while running")


def typical_wall(model: str, walls: dict[str, list[float]]) -> float:
    """A boot's expected wall time: the median of the model's boots after its first in this run, else of
    every model's boots after their first, else 60 s. Each model's first boot on a fresh machine compiles
    (1.4-3.3x a later one: 161, 203 and 244 s against 64-144 s on vLLM 0.33.0) and would end the run early."""
    later = walls.get(model, [])[1:] or [w for ws in walls.values() for w in ws[1:]]
    return statistics.median(later) if later else 60.0


def stop(signum: int, frame: Any) -> None:
    """SIGTERM handler: unwind through ``run``'s ``finally``, which ends the boots still running."""
    raise SystemExit(f"stopped by signal {signum}")


def _start_what_fits(
    queue: list[Cell], running: list[Running], n_gpus: int, began: float, walls: dict[str, list[float]],
    out: Path, args: argparse.Namespace,
) -> None:  # fmt: skip
    """Start queued boots, in order, while GPUs are free and the deadline allows another typical boot."""
    for cell in list(queue):
        if len(running) >= args.concurrent:
            return
        elapsed = time.monotonic() - began
        if elapsed + typical_wall(cell.model, walls) * 1.3 > args.deadline:
            print(f"deadline: not starting {len(queue)} boots ({elapsed:.0f}s used), first {cell.boot_id}")
            queue.clear()
            return
        gpus = _place(cell, running, n_gpus, args.per_gpu)
        if gpus is None:
            if cell.gpus > 1:
                return  # keep the round-robin order: a TP/PP boot is not overtaken
            continue
        queue.remove(cell)
        running.append(_start(cell, gpus, out, args))
