"""The pre-flight's replays: the deployment's own vLLM config through the one CPU replay
(:func:`..cpu_replay.replay`), stock in vLLM's own order and patched in the chosen order, at each pipeline
stage whose staging differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._engine.settings import Settings
from .. import cpu_replay, seams
from ..cpu_replay import ReplayResult


@dataclass(frozen=True)
class Stage:
    """A pipeline position: which staging path its ranks take (``intermediate_tensors`` before the last)."""

    index: int
    first: bool
    last: bool

    @property
    def staged(self) -> str:
        return "hidden_states" if self.last else "intermediate_tensors"


def pipeline_stages(vllm_config: Any) -> list[Stage]:
    """One stage per distinct staging path: the first, one middle stage (they all behave alike), the last."""
    pp = max(1, int(vllm_config.parallel_config.pipeline_parallel_size))
    if pp == 1:
        return [Stage(0, True, True)]
    middle = [Stage(1, False, False)] if pp > 2 else []
    return [Stage(0, True, False), *middle, Stage(pp - 1, False, True)]


def replay_stock(vllm_config: Any, inputs: seams.ManagerInputs) -> list[ReplayResult]:
    """Stock in vLLM's own order at each of :func:`pipeline_stages` (each arm's ``plan`` is vLLM's, the same
    at every stage)."""
    return [replay_arm(vllm_config, inputs, False, stage) for stage in pipeline_stages(vllm_config)]


def replay_arm(
    vllm_config: Any,
    inputs: seams.ManagerInputs,
    patched: bool,
    stage: Stage = Stage(0, True, True),
    settings: Settings = cpu_replay.PATCHED,
) -> ReplayResult:
    """One real capture() of a manager built from ``vllm_config`` at ``stage``, stock or patched with
    ``settings``."""
    cfg = cpu_replay.ReplayConfig(
        mode=inputs.cudagraph_mode,
        sizes=list(vllm_config.compilation_config.cudagraph_capture_sizes or []),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        decode_query_len=inputs.decode_query_len,
        hidden_size=inputs.hidden_size,
        dtype=inputs.dtype,
        aux_layers=inputs.aux_layers,
        lora_capture_cases=inputs.lora_capture_cases,
        varlen_decode=inputs.varlen_decode,
        first_pp_rank=stage.first,
        last_pp_rank=stage.last,
        dbo=inputs.dbo,  # vLLM's own _maybe_ubatch_twin adds the micro-batch twins; the runner is a stand-in
    )
    return cpu_replay.replay(cfg, patched, settings, vllm_config)
