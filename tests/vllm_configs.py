"""vLLM's own ``VllmConfig`` for ``vllm serve`` arguments, built as the pre-flight builds it (the contract
tests of the seams and of the KDA fix share it)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from configs import NO_WEIGHTS

from vllm_staging_plugin._offline.gpus import GPUS
from vllm_staging_plugin._offline.preflight import arguments, configure
from vllm_staging_plugin._offline.preflight.platform import platform_for_check
from vllm_staging_plugin._offline.scoped import attributes
from vllm_staging_plugin._offline.seams import platform as platform_seam

SERVE_PARSER = arguments.has_serve_parser()  # a fact of the installed vLLM: asked once
preflight_release = pytest.mark.skipif(
    not SERVE_PARSER,
    reason="this vLLM lacks the parser the pre-flight builds on (vllm.entrypoints.common.cli_args)",
)
NGRAM_8 = ["--max-num-seqs", "48", "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}']  # fmt: skip


def vllm_config(model: str, *words: str) -> Any:
    """vLLM's own VllmConfig for ``vllm serve MODEL WORDS``, built as the pre-flight builds it; on a vLLM
    without the serve parser the pre-flight builds on (before 0.33.0), from vLLM's engine-argument parser,
    which ``vllm serve`` extends (the same engine options)."""
    with check_platform():
        if SERVE_PARSER:
            args = arguments.parse_serve_arguments([model, *NO_WEIGHTS, *words])
        else:
            args = _engine_arguments(["--model", model, *NO_WEIGHTS, *words])
        configure.inspect_model_classes(str(args.model))
        return configure.create_engine_config(args)


@contextlib.contextmanager
def check_platform() -> Iterator[None]:
    """The pre-flight's platform (an H200 node of eight, emulated on a machine without one); on a vLLM
    without the serve parser, the other platform-branching modules imported first."""
    branching = platform_seam.PLATFORM_BRANCHING_MODULES
    present = {
        "PLATFORM_BRANCHING_MODULES": tuple(
            m for m in branching if SERVE_PARSER or m != arguments.PARSER_MODULE
        )
    }
    with attributes(platform_seam, present), platform_for_check(GPUS["h200"]) as (platform, emulated):
        if emulated:
            type(platform).emulated_count = 8  # one node of eight
        yield


def _engine_arguments(argv: list[str]) -> argparse.Namespace:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed: argparse.Namespace = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
    return parsed
