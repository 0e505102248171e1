"""The CPU check of every shape: each config through vLLM's own config code, and the ``vllm.LLM`` keywords
against the ``vllm serve`` argv as vLLM's parser reads it, so a GPU call never finds a typo."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from study.models import engine_kwargs, serve_argv
from study.scheduler import gpu_count


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
