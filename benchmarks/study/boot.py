"""One boot: the environment an arm and a variant give it, and the child process that boots vLLM (``vllm.LLM``
and two prompts, or ``vllm serve`` and one completion) and writes a JSON record whatever happens."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from study.models import serve_argv
from study.plan import ARMS, VARIANTS

PROMPTS = [list(range(100, 116)), list(range(2000, 2012))]
MAX_TOKENS = 8
SHIMS = Path(__file__).resolve().parent / "shims"


def arm_env(arm: str, order: str, receipts: Path, base: dict[str, str]) -> dict[str, str]:
    """The boot's environment: the operator's, minus anything that would force vLLM's choices."""
    env = {k: v for k, v in base.items() if not k.startswith("STAGING_PLUGIN_")}
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # run as an operator would: vLLM picks the runner
    env |= {"PYTHONUNBUFFERED": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if ARMS[arm] is None:
        env["VLLM_PLUGINS"] = "none"  # vLLM loads a general plugin only if its name is listed
    else:
        env |= {"VLLM_PLUGINS": "vllm_staging_plugin", "STAGING_PLUGIN_PRESIZE": str(ARMS[arm]),
                "STAGING_PLUGIN_ORDER": order, "STAGING_PLUGIN_RECEIPTS_DIR": str(receipts)}  # fmt: skip
    return env


def variant_env(variant: str, scratch: Path, base: dict[str, str]) -> dict[str, str]:
    """The variables a variant sets on top of ``base`` (only those, so the record can list them).
    ``scratch`` is this boot's own folder, for a fresh Triton cache. ``pdl-off`` puts a sitecustomize on
    PYTHONPATH, so that every process of the boot (front end, engine core) patches vLLM before any use."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(v for v in VARIANTS if v)}")
    if variant == "launch-blocking":
        return {"CUDA_LAUNCH_BLOCKING": "1"}
    if variant == "fresh-triton-cache":
        cache = scratch / "triton-cache"
        cache.mkdir(parents=True, exist_ok=True)
        return {"TRITON_CACHE_DIR": str(cache)}
    if variant == "pdl-off":
        path = [str(SHIMS / "pdl_off"), *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
        return {"PYTHONPATH": os.pathsep.join(path), "STUDY_SHIM_PDL_OFF": "1"}
    return {}


def runner_of(worker: Any) -> dict[str, Any]:
    """Runs inside each worker (collective_rpc): which model runner class vLLM built there, in which
    process, whether that process is a Ray actor, and the plugin order it sees."""
    runner = getattr(worker, "model_runner", None)
    cls = type(runner)
    ray_actor = None
    if "ray" in sys.modules:
        with contextlib.suppress(Exception):
            ray_actor = sys.modules["ray"].get_runtime_context().get_actor_id()
    return {"rank": getattr(worker, "rank", None), "runner_class": f"{cls.__module__}.{cls.__qualname__}",
            "pid": os.getpid(), "ray_actor_id": ray_actor,
            "staging_plugin_order": os.environ.get("STAGING_PLUGIN_ORDER")}  # fmt: skip


def runner_rpc() -> Any:
    """``runner_of``, shipped by value: the workers need not import this package (Ray actors, spawned
    engine cores started from another folder)."""
    import cloudpickle  # vLLM's own dependency; it serializes callables for collective_rpc

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return runner_of


def boot(args: argparse.Namespace) -> int:
    """One engine boot in this process; writes a JSON record whatever happens."""
    kwargs = json.loads(args.kwargs)
    record: dict[str, Any] = {"ok": False, "mode": args.mode, "engine_kwargs": kwargs}
    started = time.perf_counter()
    try:
        if args.mode == "serve":
            _boot_serve(kwargs, record, args.boot_timeout)
        else:
            _boot_llm(kwargs, record)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:800]
    record.setdefault("boot_seconds", round(time.perf_counter() - started, 2))
    Path(args.record).write_text(json.dumps(record))
    os._exit(0)  # the parent ends the engine-core process group; the record is written


def _boot_llm(kwargs: dict[str, Any], record: dict[str, Any]) -> None:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(**kwargs)
    record["boot_seconds"] = round(time.perf_counter() - started, 2)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    record["generate_started"] = time.time()  # wall clock, to place log lines before or after it
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    record["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    record["ok"] = True
    try:  # a callable needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 (set by the parent); the log is the fallback
        record["workers"] = llm.collective_rpc(runner_rpc(), timeout=60)
    except Exception as exc:
        record["workers_error"] = f"{type(exc).__name__}: {exc}"[:300]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _boot_serve(kwargs: dict[str, Any], record: dict[str, Any], timeout: float) -> None:
    """``vllm serve`` on a free localhost port, one completion by token ids, then stop the server."""
    port = _free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *serve_argv(kwargs),
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    record["argv"] = argv[2:]
    started = time.perf_counter()
    server = subprocess.Popen(argv)  # same process group: the parent's killpg ends it whatever happens
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode} before /health answered")
            if time.perf_counter() - started > timeout:
                raise TimeoutError("vllm serve did not become healthy in time")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
            time.sleep(1.0)
        record["boot_seconds"] = round(time.perf_counter() - started, 2)
        # skip_tokenizer_init: the prompt is token ids and nothing is detokenized; return_token_ids gives
        # the completion's ids (its text is empty without a tokenizer).
        body = {"model": kwargs["model"], "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        request = urllib.request.Request(
            f"{base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                record["http_status"], answer = r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            record["http_status"], answer = exc.code, {"error": exc.read().decode(errors="replace")[:500]}
        record["response"] = answer
        choices = answer.get("choices") or [{}]
        record["tokens"] = [choices[0].get("token_ids")]
        record["ok"] = record["http_status"] == 200 and bool(choices[0].get("token_ids"))
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=20)
