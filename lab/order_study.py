"""Capture-order study on real GPUs: boot real vLLM as an operator would (the command line; the work is in
the ``study`` package beside this file).

Each boot is a fresh ``python order_study.py boot`` process group running ``vllm.LLM`` (or ``vllm serve`` plus
one HTTP completion request) with vLLM's default multiprocess engine; the plugin reaches vLLM's processes
only through its entry point, selected with VLLM_PLUGINS. The model runner is vLLM's choice (nothing forces
VLLM_USE_V2_MODEL_RUNNER); each record says which runner the workers used. Arms:
  vanilla: VLLM_PLUGINS=none: vLLM loads no general plugin at all (its loader keeps only listed names)
  stock:   STAGING_PLUGIN_PRESIZE=off-allow-crash: vLLM's own lazy staging; the plugin only applies the
           order and writes the receipt (outside the timed capture window)
  plugin:  STAGING_PLUGIN_PRESIZE=on (the shipped behaviour)
A plan item ``[MODEL=]ARM@ORDER[+VARIANT]`` may add a variant, which changes only the boot's environment
(launch-blocking, fresh-triton-cache, pdl-off; study/plan.py). Boots are interleaved round-robin (round,
model, arm/order); ``--concurrent K`` runs up to K at once, one per GPU (``--per-gpu`` allows more, see
``--help``), a TP x PP boot taking TP x PP GPUs to itself.

  python lab/order_study.py validate --out DIR           # CPU: configs through vLLM's own classes
  python lab/order_study.py run --out DIR [--models kimi-linear-4l] [--plan vanilla@descending,...]
        [--tp 2] [--pp 2] [--serve-plan plugin@ascending] [--concurrent 2] [--fill-to 3] [--dry-run]
  python lab/order_study.py summarize DIR [--faults] [--plot PNG]  # boots table (markdown), token
        check, and where the plugin's boots wrote receipts the order table (and its picture)
  vllm-staging-plugin report DIR/receipts               # per-capture receipts (the plugin's arms)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study package, however this file is run
from study.boot import boot
from study.models import EXECUTORS, MODELS
from study.plan import ARMS, MODES, ORDERS
from study.scheduler import run
from study.summary import summarize
from study.validate import validate


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
    r.add_argument("--plan", default="", help="[MODEL=]ARM@ORDER[+VARIANT][*N],... (replaces --orders x "
                   "--arms; *N: its own --fill-to count), e.g. stock@ascending,plugin@ascending,"
                   "vanilla@descending,plugin@descending")  # fmt: skip
    r.add_argument("--serve-plan", default="", help="ARM@ORDER,...: `vllm serve` boots answering one request")
    r.add_argument("--serve-rounds", type=int, default=1)
    r.add_argument("--traffic", choices=("", "join", "single"), default="",
                   help="join: the second request arrives after the first's first token (a "
                   "step mixing a speculative decode with a prefill); single: one request")  # fmt: skip
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
    b.add_argument("--mode", choices=MODES, default="llm")
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
    s.add_argument("--faults", action="store_true", help="also the after-capture table (faults, JIT)")
    s.add_argument("--plot", metavar="PNG", help="the order study's picture (graph memory per order, model)")
    args = parser.parse_args()
    commands = {"run": run, "boot": boot, "validate": validate, "summarize": summarize}
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
