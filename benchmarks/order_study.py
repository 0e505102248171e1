"""Capture-order study on real GPUs (issues 4, 10, 11): boot real vLLM as an operator would.

Each boot is a fresh ``python order_study.py boot`` process group running ``vllm.LLM`` (or ``vllm serve`` plus
one HTTP completion request) with vLLM's default multiprocess engine; the plugin reaches vLLM's processes
only through its entry point, selected with VLLM_PLUGINS. The model runner is vLLM's choice (nothing forces
VLLM_USE_V2_MODEL_RUNNER); each record says which runner the workers used. Arms:
  vanilla: VLLM_PLUGINS=none: vLLM loads no general plugin at all (its loader keeps only listed names)
  stock:   STAGING_PLUGIN_PRESIZE=off-allow-crash: vLLM's own lazy staging; the plugin only applies the
           order and writes the receipt (outside the timed capture window)
  plugin:  STAGING_PLUGIN_PRESIZE=on (the shipped behaviour)
Boots are interleaved round-robin (round, model, arm/order); ``--concurrent K`` runs up to K at once, one per
GPU (``--per-gpu`` allows more, see ``--help``), a TP x PP boot taking TP x PP GPUs to itself.

  python benchmarks/order_study.py validate --out DIR           # CPU: configs through vLLM's own classes
  python benchmarks/order_study.py run --out DIR [--models kimi-linear-4l] [--plan vanilla@descending,...]
        [--tp 2] [--pp 2] [--serve-plan plugin@ascending] [--concurrent 2] [--fill-to 3] [--dry-run]
  python benchmarks/order_study.py summarize DIR        # boots table (markdown) + token check
  vllm-staging-plugin report DIR/receipts               # per-capture receipts (the plugin's arms)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
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
QWEN3_06B = QWEN3_COMMON | {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "max_window_layers": 28, "tie_word_embeddings": True,
}  # fmt: skip
QWEN3_8B = QWEN3_COMMON | {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "max_window_layers": 36, "tie_word_embeddings": False,
}  # fmt: skip
# Kimi-Linear-48B-A3B's config.json, cut to 4 layers (KDA 1-3, MLA 4; 1-based as vLLM's is_kda_layer reads
# them), hidden 2048 and 16 experts (top-2, as vLLM's grouped-topk kernel tests use). KDA heads stay 32 x 128
# and MLA keeps kv_lora_rank 512 / rope 64, the shapes its fused kernels (_flashkda_C, FlashMLA) support.
KIMI_LINEAR_4L: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "torch_dtype": "bfloat16",
    "vocab_size": 163840, "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 32, "hidden_act": "silu", "rms_norm_eps": 1e-05, "initializer_range": 0.02,
    "max_position_embeddings": 8192, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "use_cache": True, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "num_nextn_predict_layers": 0,
    "num_experts": 16, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True, "num_expert_group": 1,
    "topk_group": 1,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 128, "num_heads": 32,
                           "short_conv_kernel_size": 4},
}  # fmt: skip
# One-layer EAGLE3 draft for the Qwen3-0.6B target: hidden and target_hidden_size match the target, the
# draft vocabulary is the target's (no draft-to-target id map).
EAGLE3_DRAFT_06B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 1024, "target_hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 1,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "max_position_embeddings": 40960, "rope_theta": 1000000, "vocab_size": 151936,
    "draft_vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False,
}  # fmt: skip
KIMI_LINEAR_DENSE = KIMI_LINEAR_4L | {"num_experts": None}
KIMI_ISSUE10: dict[str, Any] = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
                           "prompt_lookup_min": 1},
    "use_replayssm": True,
    "max_num_seqs": 4,
    "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
}  # fmt: skip
POWERS_TO_256 = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KIMI_K3_WIDTHS: dict[str, Any] = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2,
                           "prompt_lookup_min": 1},
    "use_replayssm": True,
    "max_num_seqs": 48,
    "compilation_config": {"cudagraph_capture_sizes": [*POWERS_TO_256, 512]},
}  # fmt: skip
KIMI_ENV = {"VLLM_KIMI_K3_GEMM_AR": "0", "VLLM_ENABLE_GEMM_RS": "0"}
DRAFT = "@DRAFT@"  # replaced by the draft's folder


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A config-only model folder plus the engine arguments and variables it is booted with."""

    config: dict[str, Any]
    engine: dict[str, Any]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    draft: dict[str, Any] | None = None


MODELS: dict[str, ModelSpec] = {
    "qwen3-0.6b": ModelSpec(QWEN3_06B, {"attention_backend": "TRITON_ATTN"}),
    "qwen3-8b": ModelSpec(QWEN3_8B, {"attention_backend": "TRITON_ATTN"}),
    # issue 10: vLLM turns on KDA recover-SSM (spec decode + --use-replayssm) and caps PIECEWISE at
    # max_num_seqs x (1 + 2) = 12 -> PIECEWISE 8, 4, 2, 1 then FULL 9, 6, 3. No attention_backend: its MLA
    # layer needs an MLA backend, which vLLM picks. No nvidia-cutlass-dsl on the GPU image: GEMM_AR/RS off.
    "kimi-linear-4l": ModelSpec(KIMI_LINEAR_4L, KIMI_ISSUE10, env=KIMI_ENV),
    # issue 17.5: the same shape without experts (num_experts null: a dense MLP, no fused-MoE kernel) and
    # the same recover-SSM plan as kimi-linear-4l (issue 10's settings).
    "kimi-linear-4l-dense": ModelSpec(KIMI_LINEAR_DENSE, KIMI_ISSUE10, env=KIMI_ENV),
    # The Kimi-K3 deployment widths: n-gram 8 tokens (decode_query_len 9), max_num_seqs 48, a power-of-two
    # grid to 512 -> PIECEWISE 256 ... 1 (capped at 48 x 9 = 432), then FULL 261, 135, 72, 36, 18, 9.
    "kimi-linear-4l-dense-k3": ModelSpec(KIMI_LINEAR_DENSE, KIMI_K3_WIDTHS, env=KIMI_ENV),
    # The K3 widths with the pre-flight's verified workaround (`check` adds 261 to the grid: PIECEWISE 261
    # is captured first): stock boots it, so vanilla here is the control at the K3 widths.
    "kimi-linear-4l-dense-k3-workaround": ModelSpec(
        KIMI_LINEAR_DENSE,
        KIMI_K3_WIDTHS | {"compilation_config": {"cudagraph_capture_sizes": [*POWERS_TO_256, 261, 512]}},
        env=KIMI_ENV,
    ),
    # The control: issue 10's settings with vLLM's own derived grid, which stock boots (the pre-flight
    # says so on CPU): what fails after capture without the plugin at all.
    "kimi-linear-4l-dense-safe": ModelSpec(
        KIMI_LINEAR_DENSE,
        {k: v for k, v in KIMI_ISSUE10.items() if k != "compilation_config"},
        env=KIMI_ENV,
    ),
    # issue 11.2: aux_hidden_states; FULL descriptors are multiples of 3, PIECEWISE go up to 512.
    "qwen3-0.6b-eagle3": ModelSpec(
        QWEN3_06B,
        {
            "attention_backend": "TRITON_ATTN",
            "speculative_config": {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 2},
        },
        draft=EAGLE3_DRAFT_06B,
    ),
}
ARMS: dict[str, str | None] = {"vanilla": None, "stock": "off-allow-crash", "plugin": "on"}
ORDERS = ("descending", "ascending", "max-first", "shuffle:1")
PROMPTS = [list(range(100, 116)), list(range(2000, 2012))]
CRASH = "must match the existing size"
PROFILE_AND_REAL = "profiling pass first, real capture last"
CAPTURE_LINE = re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB")
POOL_LINE = re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\), ([\d.]+) GiB \(estimated\)")
KV_LINE = "Available KV cache memory"  # the worker's memory profiling is over
KEEP = re.compile(
    r"staging|Graph capturing|CUDA graph pool|Error|error|Model Runner|Traceback|KV cache memory"
    r"|environment variables|Env var prefixes|[Rr]ay"
)
MAX_KEPT, TRACE_TAIL = 120, 60
STOPPED = "stopped:"  # a boot ended by the study's own stop, not by vLLM: neither counted nor summarized


def model_dir(root: Path, name: str) -> Path:
    """Write the config-only folder (and the draft's) under ``root/models``; returns the model's folder."""
    spec = MODELS[name]
    path = root / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(spec.config, indent=1))
    if spec.draft is not None:
        draft = root / "models" / f"{name}-draft"
        draft.mkdir(parents=True, exist_ok=True)
        (draft / "config.json").write_text(json.dumps(spec.draft, indent=1))
    return path


# ``--executor``: how vLLM runs the workers. ``ray``: RayExecutorV2 worker actors; ``ray-dp``: vLLM's Ray
# data-parallel backend, whose engine core is itself a Ray actor (env from vLLM's get_env_vars_to_copy);
# at TP x PP = 1 it runs the worker in-process, above that through Ray worker actors. Both join the cluster
# RAY_ADDRESS names.
EXECUTORS: dict[str, dict[str, str]] = {
    "mp": {},
    "ray": {"distributed_executor_backend": "ray"},
    "ray-dp": {"data_parallel_backend": "ray"},
}


def engine_kwargs(
    root: Path, name: str, tp: int = 1, pp: int = 1, gpu_mem: float = 0.3, executor: str = "mp"
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` / ``EngineArgs`` for one boot (the same for ``vllm serve``)."""
    draft = str((root / "models" / f"{name}-draft").resolve())
    extra = json.loads(json.dumps(MODELS[name].engine).replace(json.dumps(DRAFT), json.dumps(draft)))
    extra |= EXECUTORS[executor]
    return {
        "model": str(model_dir(root, name).resolve()), "load_format": "dummy", "skip_tokenizer_init": True,
        "seed": 0, "max_model_len": 1024, "gpu_memory_utilization": gpu_mem, "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp, **extra,
    }  # fmt: skip


def serve_argv(kwargs: dict[str, Any]) -> list[str]:
    """``vllm serve`` arguments for ``kwargs``: the model positional, ``--flag`` for True, JSON for dicts."""
    argv = [str(kwargs["model"])]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if key == "model" or value is False or value is None:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv


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


@dataclasses.dataclass(frozen=True)
class Cell:
    round: int
    model: str
    order: str
    arm: str
    tp: int = 1
    pp: int = 1
    mode: str = "llm"  # or "serve"
    executor: str = "mp"  # a key of EXECUTORS

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def boot_id(self) -> str:
        par = "".join(f"-{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp)) if v > 1)
        mode = "" if self.mode == "llm" else f"-{self.mode}"
        ex = "" if self.executor == "mp" else f"-{self.executor}"
        return f"r{self.round}-{self.model}{par}{ex}{mode}-{self.order.replace(':', '')}-{self.arm}"

    @property
    def key(self) -> tuple[str, str, str, int, int, str, str]:
        return (self.model, self.order, self.arm, self.tp, self.pp, self.mode, self.executor)


def record_key(b: dict[str, Any]) -> tuple[str, str, str, int, int, str, str]:
    """``Cell.key`` of a boot record (records from before a field existed get its default)."""
    return (b["model"], b["order"], b["arm"], b.get("tp", 1), b.get("pp", 1), b.get("mode", "llm"),
            b.get("executor", "mp"))  # fmt: skip


def parse_plan(text: str) -> list[tuple[str, str]]:
    """``arm@order,...`` -> [(arm, order)]; arms are checked, orders are the plugin's to check."""
    pairs = []
    for item in filter(None, text.split(",")):
        arm, sep, order = item.partition("@")
        if not sep or arm not in ARMS or not order:
            raise SystemExit(f"plan item {item!r}: want ARM@ORDER, ARM one of {', '.join(ARMS)}")
        pairs.append((arm, order))
    return pairs


def planned_cells(args: argparse.Namespace, out: Path) -> list[Cell]:
    models = args.models.split(",")
    plan = (
        parse_plan(args.plan)
        if args.plan
        else [(a, o) for o in args.orders.split(",") for a in args.arms.split(",")]
    )
    serve = parse_plan(args.serve_plan) if args.serve_plan else []
    kw = {"tp": args.tp, "pp": args.pp, "executor": args.executor}
    if args.fill_to:
        last = -1
        done: dict[tuple[str, str, str, int, int, str, str], int] = {}
        for path in (out / "boots").glob("*.json"):
            b = json.loads(path.read_text())
            if str(b.get("error", "")).startswith(STOPPED):
                continue  # not a measurement: run it again
            key = record_key(b)
            done[key] = done.get(key, 0) + 1
            last = max(last, int(b.get("round", 0)))
        wanted = [(m, a, o, "llm", args.fill_to) for m in models for a, o in plan]
        wanted += [(m, a, o, "serve", args.serve_rounds) for m in models for a, o in serve]
        cells = []
        for step in range(max((n for *_, n in wanted), default=0)):
            for m, a, o, mode, n in wanted:
                cell = Cell(last + 1 + step, m, o, a, mode=mode, **kw)
                if done.get(cell.key, 0) + step < n:
                    cells.append(cell)
        return cells
    rounds = range(args.start_round, args.start_round + args.rounds)
    cells = [Cell(r, m, o, a, **kw) for r in rounds for m in models for a, o in plan]
    return cells + [Cell(args.start_round + r, m, o, a, mode="serve", **kw)
                    for r in range(args.serve_rounds) for m in models for a, o in serve]  # fmt: skip


# ---------------------------------------------------------------------------------------------- the boots


def _runner_of(worker: Any) -> dict[str, Any]:
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
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    record["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    record["ok"] = True
    try:  # a callable needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 (set by the parent); the log is the fallback
        record["workers"] = llm.collective_rpc(_runner_of, timeout=60)
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
        body = {"model": kwargs["model"], "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0.0,
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


# ---------------------------------------------------------------------------------------------- the runner


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
    cell: Cell
    child: subprocess.Popen[bytes]
    gpus: list[int]
    started: float
    log: Path
    record: Path


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
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if cell.mode == "llm":  # lets collective_rpc ship _runner_of to the workers
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    kwargs = engine_kwargs(out, cell.model, cell.tp, cell.pp, args.gpu_mem, cell.executor)
    record = out / "boots" / f"{cell.boot_id}.json"
    log = out / "logs" / f"{cell.boot_id}.log"
    cmd = [sys.executable, __file__, "boot", "--mode", cell.mode, "--kwargs", json.dumps(kwargs),
           "--record", str(record), "--boot-timeout", str(args.boot_timeout)]  # fmt: skip
    with open(log, "w") as handle:
        child = subprocess.Popen(
            cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Running(cell, child, gpus, time.monotonic(), log, record)


def _finish(run: Running, out: Path, busy: set[int]) -> dict[str, Any]:
    with contextlib.suppress(ProcessLookupError):  # the engine core outlives its front end: end the group
        os.killpg(run.child.pid, signal.SIGKILL)
    run.child.wait()
    wait_for_gpu_memory([g for g in run.gpus if g not in busy])  # GPUs no other boot is using
    wall = time.monotonic() - run.started
    record: dict[str, Any] = (
        json.loads(run.record.read_text()) if run.record.exists() else {"ok": False, "error": "no record"}
    )
    c = run.cell
    record.update(boot_id=c.boot_id, round=c.round, model=c.model, order=c.order, arm=c.arm, tp=c.tp, pp=c.pp,
                  mode=c.mode, executor=c.executor, gpus=run.gpus, wall_seconds=round(wall, 1))  # fmt: skip
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
    run.record.write_text(json.dumps(record, indent=1))
    return record


def analyse_log(text: str, trimmed: Path) -> dict[str, Any]:
    """What the engine log says (crash, vLLM's capture lines, runner, plugin lines); keeps a trimmed log."""
    record: dict[str, Any] = {"staging_crash": CRASH in text}
    lines = CAPTURE_LINE.findall(text)  # PROFILE_AND_REAL
    if len(lines) >= 2:
        record["vllm_profiling_capture_seconds"], record["vllm_profiling_took_gib"] = map(float, lines[0])
    if lines:
        record["vllm_capture_seconds"], record["vllm_took_gib"] = map(float, lines[-1])
    if m := POOL_LINE.search(text):
        record["vllm_actual_gib"], record["vllm_estimated_gib"] = float(m[1]), float(m[2])
    v2, v1 = text.count("Using V2 Model Runner"), "Model Runner V2 does not yet support" in text
    record["runner_log"] = "v1 (fallback)" if v1 else f"v2 ({v2} workers)" if v2 else "unknown"
    record["plugin_log_lines"] = sum("vllm-staging-plugin" in line or "vllm_staging_plugin" in line
                                     for line in text.splitlines())  # fmt: skip
    record["memory_profiling_interference"] = "Error in memory profiling" in text
    all_lines = text.splitlines()
    kept = [line[:400] for line in all_lines if KEEP.search(line)][:MAX_KEPT]
    start = max((i for i, line in enumerate(all_lines) if "Traceback" in line), default=None)
    tail = all_lines[start : start + TRACE_TAIL] if start is not None else all_lines[-20:]
    trimmed.write_text("\n".join([*kept, "----- traceback / tail -----", *(t[:400] for t in tail)]) + "\n")
    record["log_excerpt"] = kept[-40:]
    return record


def run(args: argparse.Namespace) -> int:
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
            print("would boot", cell.boot_id, f"gpus={cell.gpus}", json.dumps(kwargs, sort_keys=True))
        print(f"{len(cells)} boots on {n_gpus} GPUs, up to {args.concurrent} at once, {args.per_gpu} per GPU")
        return 0
    # Budget by the typical boot (60 s until one is seen), not the longest: the first boot of a shape on a
    # fresh machine compiles and takes about twice as long, and would end runs early.
    began, walls, queue = time.monotonic(), [60.0], list(cells)
    running: list[Running] = []
    signal.signal(signal.SIGTERM, _stop)  # an outer `timeout` must not leave engines holding the GPUs
    try:
        while queue or running:
            _start_what_fits(queue, running, n_gpus, began, walls, out, args)
            for r in list(running):
                if r.child.poll() is None and time.monotonic() - r.started < args.boot_timeout + 30:
                    continue
                running.remove(r)
                record = _finish(r, out, {g for other in running for g in other.gpus})
                walls.append(record["wall_seconds"])
                print(f"{record['boot_id']:<52} gpus={','.join(map(str, r.gpus)):<4} ok={record['ok']!s:<5} "
                      f"crash={record['staging_crash']!s:<5} wall={record['wall_seconds']:5.1f}s "
                      f"runner={record['runner']} receipts={record['receipts']} "
                      f"capture={record.get('vllm_capture_seconds')} http={record.get('http_status', '-')}",
                      flush=True)  # fmt: skip
            time.sleep(0.5)
    finally:
        for r in running:  # stopped early: end the boots still running, note them, wait for nothing
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.child.pid, signal.SIGKILL)
            note = {"boot_id": r.cell.boot_id, "ok": False, "error": f"{STOPPED} the study was stopped"}
            r.record.write_text(json.dumps(note | dataclasses.asdict(r.cell), indent=1))
            print(f"{r.cell.boot_id}: stopped while running")
    return 0


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _start_what_fits(
    queue: list[Cell], running: list[Running], n_gpus: int, began: float, walls: list[float], out: Path,
    args: argparse.Namespace,
) -> None:  # fmt: skip
    """Start queued boots, in order, while GPUs are free and the deadline allows another typical boot."""
    for cell in list(queue):
        if len(running) >= args.concurrent:
            return
        elapsed = time.monotonic() - began
        if elapsed + statistics.median(walls) * 1.3 > args.deadline:
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


# ---------------------------------------------------------------------------------------------- CPU checks


def validate(args: argparse.Namespace) -> int:
    """On CPU: load every config.json with vLLM's own config code, check the fields each model needs, build
    EngineArgs from the LLM keywords and from the ``vllm serve`` argv (vLLM's parser), and compare them.
    Without a GPU vLLM cannot infer a device for its argument defaults: the CPU platform is named for that."""
    if not gpu_count():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.transformers_utils.config import get_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out, failures = Path(args.out).resolve(), 0
    parser = make_arg_parser(FlexibleArgumentParser())
    for name in args.models.split(","):
        kwargs = engine_kwargs(out, name, args.tp, args.pp)
        problems = []
        config = get_config(kwargs["model"], trust_remote_code=False)
        summary = f"{type(config).__name__} {config.architectures}"
        if name.startswith("kimi-linear-4l"):
            kda = [i for i in range(config.num_hidden_layers) if config.is_kda_layer(i)]
            summary += (
                f" kda layers {kda} moe={config.is_moe} mla={config.is_mla} linear={config.is_linear_attn}"
            )
            moe = name == "kimi-linear-4l"
            if kda != [0, 1, 2] or config.is_moe != moe or not (config.is_mla and config.is_linear_attn):
                problems.append("KDA/MLA/MoE layout")
        spec = kwargs.get("speculative_config", {})
        if spec.get("method") == "eagle3":
            draft = get_config(spec["model"], trust_remote_code=False)
            summary += (
                f"; draft {draft.architectures} hidden {draft.hidden_size} vocab {draft.draft_vocab_size}"
            )
            if (draft.hidden_size, draft.target_hidden_size, draft.draft_vocab_size) != (
                config.hidden_size, config.hidden_size, config.vocab_size):  # fmt: skip
                problems.append("draft does not match the target")
        from_llm = EngineArgs(**kwargs)
        ns = parser.parse_args(serve_argv(kwargs))
        ns.model = ns.model_tag or ns.model  # as `vllm serve` does
        from_cli = EngineArgs.from_cli_args(ns)
        for key in kwargs:
            if getattr(from_cli, key) != getattr(from_llm, key):
                problems.append(
                    f"serve argv gives {key}={getattr(from_cli, key)!r} vs {getattr(from_llm, key)!r}"
                )
        failures += bool(problems)
        print(f"{name}: {'OK' if not problems else 'PROBLEM ' + '; '.join(problems)}: {summary}")
        print(f"  vllm serve {' '.join(serve_argv(kwargs))}")
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------- summaries


def summarize(args: argparse.Namespace) -> int:
    records = [json.loads(p.read_text()) for p in sorted(Path(args.directory).glob("**/boots/*.json"))]
    boots = [b for b in records if not str(b.get("error", "")).startswith(STOPPED)]
    if len(boots) < len(records):
        print(f"({len(records) - len(boots)} boots stopped by the study's deadline or timeout are left out)")
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for b in boots:
        key = (b["model"], b.get("tp", 1), b.get("pp", 1), b.get("executor", "mp"), b.get("mode", "llm"),
               b["order"], b["arm"])  # fmt: skip
        cells.setdefault(key, []).append(b)
    header = ("model", "tp", "pp", "executor", "mode", "order", "arm", "booted/N", "staging crash", "runner",
              "receipts", "boot s (median)", "vLLM capture s", "vLLM took GiB", "first error")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for key, items in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
        ok = sum(b["ok"] for b in items)
        crash = sum(b.get("staging_crash", False) for b in items)
        runners = ", ".join(sorted({str(b.get("runner", b.get("runner_log", "-"))) for b in items}))
        receipts = ", ".join(str(b.get("receipts", "-")) for b in items)
        medians = " | ".join(
            _median(items, k) for k in ("boot_seconds", "vllm_capture_seconds", "vllm_took_gib")
        )
        error = next((b["error"][:90] for b in items if b.get("error")), "")
        print(f"| {' | '.join(map(str, key))} | {ok}/{len(items)} | {crash} | {runners} | {receipts} | "
              f"{medians} | {error} |")  # fmt: skip
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
    r.add_argument("--models", default="qwen3-8b,qwen3-0.6b", help=f"comma list of {', '.join(MODELS)}")
    r.add_argument("--orders", default=",".join(ORDERS))
    r.add_argument("--arms", default="stock,plugin", help=f"comma list of {', '.join(ARMS)}")
    r.add_argument("--plan", default="", help="ARM@ORDER,... (replaces --orders x --arms), e.g. "
                   "stock@ascending,plugin@ascending,vanilla@descending,plugin@descending")  # fmt: skip
    r.add_argument("--serve-plan", default="", help="ARM@ORDER,...: `vllm serve` boots answering one request")
    r.add_argument("--serve-rounds", type=int, default=1)
    r.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of every boot")
    r.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size of every boot")
    r.add_argument("--executor", choices=tuple(EXECUTORS), default="mp",
                   help="mp: vLLM's multiprocessing workers; ray: distributed_executor_backend=ray; "
                   "ray-dp: data_parallel_backend=ray (the engine core is a Ray actor); "
                   "Ray joins the cluster RAY_ADDRESS names")  # fmt: skip
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--start-round", type=int, default=0)
    r.add_argument("--concurrent", type=int, default=1, help="boots at once (a TP x PP boot owns its GPUs)")
    r.add_argument(
        "--per-gpu", type=int, default=1,
        help="boots sharing one GPU (>1: lower --gpu-mem, e.g. 0.12; a boot joins a GPU only after the "
        "others there finished memory profiling, but one ending during another's profiling can still "
        "fail it: records flag memory_profiling_interference)",
    )  # fmt: skip
    r.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: nvidia-smi -L)")
    r.add_argument("--gpu-mem", type=float, default=0.3, help="gpu_memory_utilization of each boot")
    r.add_argument("--deadline", type=float, default=540.0, help="seconds; no boot starts past it")
    r.add_argument("--boot-timeout", type=float, default=300.0)
    r.add_argument("--fill-to", type=int, default=0, help="run only the boots missing for N per cell")
    r.add_argument("--dry-run", action="store_true", help="write the configs, print the boots that would run")
    b = sub.add_parser("boot")
    b.add_argument("--mode", choices=("llm", "serve"), default="llm")
    b.add_argument("--kwargs", required=True, help="JSON of the engine keyword arguments")
    b.add_argument("--record", required=True)
    b.add_argument("--boot-timeout", type=float, default=300.0)
    v = sub.add_parser("validate")
    v.add_argument("--out", required=True)
    v.add_argument("--models", default=",".join(MODELS))
    v.add_argument("--tp", type=int, default=1)
    v.add_argument("--pp", type=int, default=1)
    s = sub.add_parser("summarize")
    s.add_argument("directory")
    args = parser.parse_args()
    commands = {"run": run, "boot": boot, "validate": validate, "summarize": summarize}
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
