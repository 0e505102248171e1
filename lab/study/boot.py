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
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from study.models import serve_argv
from study.plan import ARMS, variant_parts

PROMPTS = [list(range(100, 116)), list(range(2000, 2012))]
MAX_TOKENS = 8
JOIN_TOKENS = 24  # the first request is still decoding when the second arrives
SINGLE_PROMPT = list(range(100, 116)) * 2  # repeats: n-gram drafts are proposed from the first step
SINGLE_TOKENS = 32
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


def variant_env(variant: str, scratch: Path, base: dict[str, str], mode: str = "llm") -> dict[str, str]:
    """The variables a variant (``a+b`` joins several) and the traffic set on top of ``base`` (only those,
    so the record can list them). ``scratch`` is this boot's own folder, for a fresh Triton cache. Probes
    and PDL off come from the sitecustomize in shims/probe, put first on PYTHONPATH so that every process
    of the boot patches vLLM before any use; a ``vllm-*`` variant puts its patched vLLM before that."""
    env: dict[str, str] = {}
    front: list[str] = []
    for part in variant_parts(variant):
        if part == "launch-blocking":
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        elif part == "fresh-triton-cache":
            cache = scratch / "triton-cache"
            cache.mkdir(parents=True, exist_ok=True)
            env["TRITON_CACHE_DIR"] = str(cache)
        elif part == "pdl-off":
            env["STUDY_SHIM_PDL_OFF"] = "1"
        elif part in ("kda-log", "kda-pad"):
            env["STUDY_SHIM_KDA"] = part.removeprefix("kda-")
        elif part.startswith("vllm-"):
            front.append(
                str(Path(base.get("STUDY_PATCHED_VLLM", "/tmp/vllm-patched")) / part.removeprefix("vllm-"))
            )
    if mode.endswith(("-join", "-single")):
        env["STUDY_SHIM_STEPS"] = "1"  # the record shows whether a mixed step happened
    if any(k.startswith("STUDY_SHIM_") for k in env):
        front.append(str(SHIMS / "probe"))
    if front:
        env["PYTHONPATH"] = os.pathsep.join(
            [*front, *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
        )
    return env


def runner_of(worker: Any) -> dict[str, Any]:
    """Runs inside each worker (collective_rpc): which model runner class vLLM built there, in which
    process, whether that process is a Ray actor, and the plugin order it sees."""
    runner = getattr(worker, "model_runner", None)
    cls = type(runner)
    ray_actor = None
    ray = sys.modules.get("ray")  # vLLM imports it; only a Ray worker has it connected
    if ray is not None and ray.is_initialized():  # get_runtime_context() would start a local Ray instance
        with contextlib.suppress(Exception):
            ray_actor = ray.get_runtime_context().get_actor_id()
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
        if args.mode.startswith("serve"):
            _boot_serve(kwargs, record, args.boot_timeout, join=args.mode == "serve-join")
        else:
            _boot_llm(kwargs, record, args.mode.removeprefix("llm").removeprefix("-"))
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:800]
    record.setdefault("boot_seconds", round(time.perf_counter() - started, 2))
    Path(args.record).write_text(json.dumps(record))
    os._exit(0)  # the parent ends the engine-core process group; the record is written


def _boot_llm(kwargs: dict[str, Any], record: dict[str, Any], traffic: str = "") -> None:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(**kwargs)
    record["boot_seconds"] = round(time.perf_counter() - started, 2)
    record["generate_started"] = time.time()  # wall clock, to place log lines before or after it
    if traffic == "join":
        record["tokens"] = _join(llm, record)
    elif traffic == "single":
        params = SamplingParams(temperature=0.0, max_tokens=SINGLE_TOKENS, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": SINGLE_PROMPT}], params, use_tqdm=False)
        record["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    else:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        record["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    record["ok"] = True
    try:  # a callable needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 (set by the parent); the log is the fallback
        record["workers"] = llm.collective_rpc(runner_rpc(), timeout=60)
    except Exception as exc:
        record["workers_error"] = f"{type(exc).__name__}: {exc}"[:300]


def _join(llm: Any, record: dict[str, Any]) -> list[list[int]]:
    """The first prompt alone; the second added once the first has its first token (the engine steps in
    between), so the next step schedules the first request's speculative decode beside the second's
    prefill. Returns both requests' tokens, in prompt order."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=JOIN_TOKENS, ignore_eos=True, detokenize=False)
    engine.add_request("0", {"prompt_token_ids": PROMPTS[0]}, params)
    tokens: dict[str, list[int]] = {}
    joined_at = None
    for _ in range(10_000):
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        if joined_at is None and tokens.get("0"):
            joined_at = len(tokens["0"])
            engine.add_request("1", {"prompt_token_ids": PROMPTS[1]}, params)
        if joined_at is not None and not engine.has_unfinished_requests():
            break
    record["joined_after_tokens"] = joined_at
    return [tokens.get("0", []), tokens.get("1", [])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(model: str, prompt: list[int], max_tokens: int, stream: bool = False) -> bytes:
    # skip_tokenizer_init: the prompt is token ids and nothing is detokenized; return_token_ids gives
    # the completion's ids (its text is empty without a tokenizer).
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "return_token_ids": True, "stream": stream}).encode()  # fmt: skip


def _complete(base: str, model: str, prompt: list[int], max_tokens: int) -> tuple[int, dict[str, Any]]:
    """One completion request; (HTTP status, answer or error)."""
    request = urllib.request.Request(
        f"{base}/v1/completions", _body(model, prompt, max_tokens), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


def _serve_join(base: str, model: str, record: dict[str, Any]) -> None:
    """Two completions: the first streamed; the second sent once the first has streamed a token."""
    request = urllib.request.Request(
        f"{base}/v1/completions", _body(model, PROMPTS[0], JOIN_TOKENS, stream=True),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    second: dict[str, Any] = {}

    def send_second() -> None:
        second["status"], second["answer"] = _complete(base, model, PROMPTS[1], JOIN_TOKENS)

    first: list[int] = []
    thread = threading.Thread(target=send_second)
    with urllib.request.urlopen(request, timeout=120) as r:
        record["http_status"] = r.status
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            first += choices[0].get("token_ids") or []
            if first and thread.ident is None:  # not started yet
                record["joined_after_tokens"] = len(first)
                thread.start()
    thread.join(timeout=120)
    answer = second.get("answer") or {}
    choices = answer.get("choices") or [{}]
    record["second_http_status"] = second.get("status")
    record["response"] = answer
    record["tokens"] = [first, choices[0].get("token_ids") or []]
    record["ok"] = (record["http_status"] == 200 and second.get("status") == 200
                    and len(first) == JOIN_TOKENS and len(record["tokens"][1]) == JOIN_TOKENS)  # fmt: skip


def _boot_serve(kwargs: dict[str, Any], record: dict[str, Any], timeout: float, join: bool = False) -> None:
    """``vllm serve`` on a free localhost port, one completion by token ids (with ``join``, two: the
    second sent once the first has streamed a token), then stop the server."""
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
        if join:
            _serve_join(base, kwargs["model"], record)
        else:
            status, answer = _complete(base, kwargs["model"], PROMPTS[0], MAX_TOKENS)
            record["http_status"], record["response"] = status, answer
            choices = answer.get("choices") or [{}]
            record["tokens"] = [choices[0].get("token_ids")]
            record["ok"] = status == 200 and bool(choices[0].get("token_ids"))
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=20)
