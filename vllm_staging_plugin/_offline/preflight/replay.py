"""The pre-flight's replays: build the real manager from vLLM's config and run its capture on CPU, stock in
vLLM's own order and patched in the chosen order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._engine.settings import Settings
from ..._engine.sizing import capture_sequence, mode_rank
from .. import cpu_replay, seams
from .result import Arm


def _describe(mode: Any, desc: Any) -> str:
    parts = [f"{getattr(mode, 'name', mode)} num_tokens={desc.num_tokens}"]
    if getattr(desc, "uniform_token_count", None):
        parts.append(f"uniform decode {desc.num_reqs} x {desc.uniform_token_count}")
    if getattr(desc, "num_active_loras", 0):
        parts.append(f"{desc.num_active_loras} LoRAs")
    if getattr(desc, "num_ubatches", 1) > 1:
        parts.append(f"{desc.num_ubatches} micro-batches")
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def plugin_settings(order: str, kda_fix: str = "on") -> Settings:
    """The patched arm: the chosen order, pre-sizing on, the KDA state-slot fix as asked, strict (a plugin
    that would refuse this vLLM raises instead of silently leaving it stock), no receipts."""
    return Settings(order=order, presize="on", strict=True, kda_fix=kda_fix)


@dataclass(frozen=True)
class Stage:
    """A pipeline position: which staging path its ranks take (``intermediate_tensors`` before the last)."""

    index: int
    first: bool
    last: bool

    @property
    def staged(self) -> str:
        return "hidden_states" if self.last else "intermediate_tensors"


def pipeline_stages(pipeline_parallel_size: int) -> list[Stage]:
    """One stage per distinct staging path: the first, one middle stage (they all behave alike), the last."""
    pp = max(1, pipeline_parallel_size)
    if pp == 1:
        return [Stage(0, True, True)]
    middle = [Stage(1, False, False)] if pp > 2 else []
    return [Stage(0, True, False), *middle, Stage(pp - 1, False, True)]


def replay_stock(
    vllm_config: Any, inputs: seams.ManagerInputs
) -> list[tuple[Stage, Arm, dict[str, list[int]]]]:
    """Stock in vLLM's own order at every pipeline stage: (stage, arm, vLLM's plan) each."""
    stages = pipeline_stages(int(vllm_config.parallel_config.pipeline_parallel_size))
    return [(stage, *replay_arm(vllm_config, inputs, patched=False, stage=stage)) for stage in stages]


def replay_arm(
    vllm_config: Any,
    inputs: seams.ManagerInputs,
    patched: bool,
    stage: Stage = Stage(0, True, True),
    settings: Settings = cpu_replay.PATCHED,
) -> tuple[Arm, dict[str, list[int]]]:
    """One real capture() of a manager built from ``vllm_config`` at ``stage``, stock or patched with
    ``settings``; returns the arm and vLLM's plan."""
    cfg = cpu_replay.ReplayConfig(
        mode=inputs.cudagraph_mode,
        sizes=list(vllm_config.compilation_config.cudagraph_capture_sizes or []),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        decode_query_len=inputs.decode_query_len,
        hidden_size=inputs.hidden_size,
        dtype=inputs.dtype,
        aux_layers=inputs.aux_layers,
        lora_capture_cases=inputs.lora_capture_cases,
        first_pp_rank=stage.first,
        last_pp_rank=stage.last,
        dbo=inputs.dbo,  # vLLM's own _maybe_ubatch_twin adds the micro-batch twins; the runner is a stand-in
    )
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(patched, settings):
        manager = seams.new_manager(
            vllm_config, inputs.cudagraph_mode, inputs.decode_query_len,
            lora_capture_cases=inputs.lora_capture_cases, varlen_decode=inputs.varlen_decode,
            ubatch_runner=cpu_replay.UbatchRunner() if inputs.dbo else None,
        )  # fmt: skip
        descs = seams.capture_plan(manager)
        plan = capture_sequence(descs)  # vLLM's own order, before any policy
        result = cpu_replay.run_capture(manager, cfg)
        walked = seams.replayed_plan(manager) or descs  # the lists the loop walked, a policy's order
    ran = _ran(result.forwards, walked)
    arm = Arm(ok=result.ok, error=result.error, sequence=_sequence(ran), buffers=result.buffers,
              conclusive=result.conclusive)  # fmt: skip
    if ran:
        arm.allocated_by = _describe(*ran[0][1:])  # store_capture_output allocates from the first output
        if not result.ok:
            arm.failed_at = _describe(*ran[-1][1:])  # the descriptor whose forward raised
    return arm, plan


def _ran(forwards: list[int], walked: dict[Any, list[Any]]) -> list[tuple[Any, Any, Any]]:
    """(list key, mode, descriptor) of each descriptor the capture ran, in order: the loop walks the lists
    PIECEWISE first, each descriptor in its own mode, two forwards each (warm-up, capture)."""
    flat = [
        (key, getattr(d, "cg_mode", key), d) for key in sorted(walked, key=mode_rank) for d in walked[key]
    ]
    return flat[: len(forwards[::2])]


def _sequence(ran: list[tuple[Any, Any, Any]]) -> dict[str, list[int]]:
    lists: dict[Any, list[Any]] = {}
    for key, _, desc in ran:
        lists.setdefault(key, []).append(desc)
    return capture_sequence(lists)
