"""vLLM's own ``VllmConfig`` for ``vllm serve`` arguments, built as the pre-flight builds it (the contract
tests of the seams and of the KDA fix share it)."""

from __future__ import annotations

from typing import Any

import pytest
from configs import NO_WEIGHTS

from vllm_staging_plugin._offline.preflight import arguments, configure
from vllm_staging_plugin._offline.preflight.platform import GPUS, platform_for_check

preflight_release = pytest.mark.skipif(
    not arguments.has_serve_parser(),
    reason="this vLLM lacks the parser the pre-flight builds on (vllm.entrypoints.common.cli_args)",
)
NGRAM_8 = ["--max-num-seqs", "48", "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}']  # fmt: skip


def vllm_config(model: str, *words: str) -> Any:
    """vLLM's own VllmConfig for ``vllm serve MODEL WORDS``, built as the pre-flight builds it."""
    with platform_for_check(GPUS["h200"]) as (platform, emulated):
        if emulated:
            type(platform).emulated_count = 8  # one node of eight
        args = arguments.parse_serve_arguments([model, *NO_WEIGHTS, *words])
        configure.inspect_model_classes(str(args.model))
        return configure.create_engine_config(args)
