"""What an engine log says: the staging crash, vLLM's capture and pool lines, the model runner, the plugin's
lines, a CUDA fault (its text, where it was raised, when) and vLLM's JIT-at-inference warnings. The log is
the only witness of the engine-core process, which dies with a fault; a trimmed copy is kept."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

CRASH = "must match the existing size"
PROFILE_AND_REAL = "profiling pass first, real capture last"
CAPTURE_LINE = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
POOL_LINE = re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)")
KV_LINE = "Available KV cache memory"  # the worker's memory profiling is over
KV_AVAILABLE = re.compile(KV_LINE + r": ([\d.]+) GiB")
KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
# vLLM's platform logs its pick ("Using FLASH_ATTN attention backend out of potential backends: ...") or a
# forced one ("Using TRITON_ATTN backend."; older releases print the enum: "AttentionBackendEnum.X").
BACKEND_LINE = re.compile(
    r"Using (?:AttentionBackendEnum\.|_Backend\.)?([A-Z][A-Z0-9_]+) (?:attention )?backend\b"
)
KEEP = re.compile(
    r"staging|Graph capturing|CUDA graph pool|Error|error|Model Runner|Traceback|KV cache memory"
    r"|environment variables|Env var prefixes|[Rr]ay|JIT compilation|illegal memory|study-shim|backend"
)
MAX_KEPT, TRACE_TAIL = 120, 60
# vLLM's JIT monitor (jit_monitor_mode 'warn'): a Triton kernel compiled after warm-up and capture
JIT_LINE = re.compile(r"Triton kernel JIT compilation during inference: (\w+)")
FAULT_LINE = re.compile(r"illegal memory access|CUDA error|Triton Error|cudaError[A-Z]\w*:")
FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
LOG_TIME = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")  # vLLM's log prefix: MM-DD HH:MM:SS
LOG_PREFIX = re.compile(r"^\([^)]*\)\s+[A-Z]+\s+\d\d-\d\d \d\d:\d\d:\d\d\s+\[[^\]]*\]\s?")
GRAPH_FRAME = re.compile(r"cuda_?graph|piecewise", re.IGNORECASE)
SHIM_LINE = "study-shim: PDL off"
MIXED_STEP = re.compile(r"study-shim: mixed step (\{.*\}) pid")
KDA_CALL = re.compile(r"study-shim: kda-call (\{.*\}) pid")


def analyse_log(text: str, trimmed: Path) -> dict[str, Any]:
    """What the engine log says (crash, vLLM's capture lines, runner, plugin lines); keeps a trimmed log."""
    record: dict[str, Any] = {"staging_crash": CRASH in text}
    lines = CAPTURE_LINE.findall(text)  # PROFILE_AND_REAL
    if len(lines) >= 2:
        record["vllm_profiling_capture_seconds"], record["vllm_profiling_took_gib"] = map(float, lines[0])
    if lines:
        record["vllm_capture_seconds"], record["vllm_took_gib"] = map(float, lines[-1])
    if found := KV_AVAILABLE.findall(text):
        record["vllm_available_kv_gib"] = float(found[-1])
    if found := KV_TOKENS.findall(text):
        record["vllm_kv_tokens"] = int(found[-1].replace(",", ""))
    backends = list(dict.fromkeys(BACKEND_LINE.findall(text)))  # every process logs it; first seen first
    record["attention_backend"] = "+".join(backends) if backends else None
    if m := POOL_LINE.search(text):
        record["vllm_actual_gib"], record["vllm_estimated_gib"] = float(m[1]), float(m[2])
    v2, v1 = text.count("Using V2 Model Runner"), "Model Runner V2 does not yet support" in text
    record["runner_log"] = "v1 (fallback)" if v1 else f"v2 ({v2} workers)" if v2 else "unknown"
    record["plugin_log_lines"] = sum("vllm-staging-plugin" in line or "vllm_staging_plugin" in line
                                     for line in text.splitlines())  # fmt: skip
    record["memory_profiling_interference"] = "Error in memory profiling" in text
    all_lines = text.splitlines()
    record.update(analyse_fault(all_lines))
    kept = [line[:400] for line in all_lines if KEEP.search(line)][:MAX_KEPT]
    start = max((i for i, line in enumerate(all_lines) if "Traceback" in line), default=None)
    tail = all_lines[start : start + TRACE_TAIL] if start is not None else all_lines[-20:]
    trimmed.write_text("\n".join([*kept, "----- traceback / tail -----", *(t[:400] for t in tail)]) + "\n")
    record["log_excerpt"] = kept[-40:]
    return record


def _time(line: str) -> datetime | None:
    m = LOG_TIME.search(line)
    return datetime.strptime(f"2000-{m[1]}", "%Y-%m-%d %H:%M:%S") if m else None


def _frame(path: str, line: str, func: str) -> str:
    """A frame as ``vllm/...py:LINE func`` (the install folder cut: site-packages, or the payload's)."""
    for root in ("/site-packages/", "/tmp/site/"):
        if root in path:
            path = path.rsplit(root, 1)[1]
            break
    return f"{path}:{line} {func}"


def analyse_fault(lines: list[str]) -> dict[str, Any]:
    """The first CUDA fault in the log (text, traceback frames, the deepest vLLM frame, graph-wrapper frames
    on the stack, time) and every JIT-at-inference warning (kernel, time, before or after the fault).
    Times come from vLLM's log prefix, to the second."""
    jit = [(i, m[1], _time(line)) for i, line in enumerate(lines) if (m := JIT_LINE.search(line))]
    out: dict[str, Any] = {
        "jit_at_inference": bool(jit),
        "jit_kernels": sorted({k for _, k, _ in jit}),
        "jit_lines": [
            {"line": i, "kernel": k, "time": t and t.strftime("%m-%d %H:%M:%S")} for i, k, t in jit
        ],
        "pdl_off_shim_lines": sum(SHIM_LINE in line for line in lines),
        "mixed_steps": [json.loads(m[1]) for line in lines if (m := MIXED_STEP.search(line))],
        "kda_calls": [json.loads(m[1]) for line in lines if (m := KDA_CALL.search(line))],
        "kda_pads": sum("study-shim: kda-pad" in line for line in lines),
        "faulted": False,
    }
    at = next((i for i, line in enumerate(lines) if FAULT_LINE.search(line)), None)
    if at is None:
        return out
    start = max((i for i in range(at + 1) if "Traceback (most recent call last)" in lines[i]), default=at)
    frames = [_frame(*m.groups()) for line in lines[start:at] if (m := FRAME.search(line))]
    ours = [f for f in frames if f.startswith("vllm/")]
    fault_time = _time(lines[at])
    before = [(i, k, t) for i, k, t in jit if i < at]
    out.update(
        faulted=True,
        fault_text=LOG_PREFIX.sub("", lines[at]).strip()[:300],
        fault_line=at,
        fault_time=fault_time and fault_time.strftime("%m-%d %H:%M:%S"),
        fault_raised_in=frames[-1] if frames else None,
        fault_where=ours[-1] if ours else None,
        fault_frames=frames[-40:],
        fault_graph_frames=[f for f in frames if GRAPH_FRAME.search(f)],
        jit_before_fault=sorted({k for _, k, _ in before}),
        jit_after_fault=sorted({k for i, k, _ in jit if i > at}),
    )
    if before and before[-1][2] and fault_time:
        out["jit_to_fault_seconds"] = (fault_time - before[-1][2]).total_seconds()
    return out
