"""The pre-flight's result: per arm (stock, plugin) what the replayed capture did, and its JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ... import __version__
from .workaround import Workaround

if TYPE_CHECKING:  # torch: the error paths that import this module import neither torch nor vLLM
    from ..cpu_replay import ReplayResult
    from ..seams import KdaMixedStep

FIRST_SIZING_RELEASE = "0.34.0"  # vLLM sizes its staging buffers by the largest descriptor from here on


@dataclass
class StageResult:
    """Both arms at one pipeline position."""

    index: int
    staged: str  # "hidden_states" (last stage) or "intermediate_tensors"
    stock: ReplayResult
    plugin: ReplayResult


@dataclass
class ServingFix:
    """The operator's arguments without ``--use-replayssm``, checked again from the start."""

    serve_arguments: list[str]
    stock_boots: bool
    plugin_boots: bool
    serves: bool | None  # None: the serving question could not be answered on them either


@dataclass
class Preflight:
    vllm_version: str | None
    torch_version: str | None
    platform: dict[str, Any]
    model: str
    architecture: str | None
    cudagraph_mode: str
    capture_sizes: list[int]
    max_num_seqs: int
    decode_query_len: int
    use_kda_recoverssm: bool
    hidden_size: int
    dtype: str
    capacity: int
    sequence: dict[str, list[int]]
    stock: ReplayResult
    plugin: ReplayResult
    order: str
    notes: list[str]
    stages: list[StageResult] = field(default_factory=list)
    parallel: dict[str, int] = field(default_factory=dict)
    workaround: Workaround | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    vllm_sizes_staging: bool = False  # the installed vLLM sizes its staging by the largest descriptor itself
    kda_step: KdaMixedStep | None = None  # vLLM's shared KDA layer on a decode beside a prefill
    kda_step_error: str | None = None  # why that could not be checked here
    kda_step_plugin: KdaMixedStep | None = None  # where stock faults: the same step with the plugin's fix
    kda_fault_at_boot: bool = False  # this vLLM runs such a step in its boot warm-up
    serving_fix: ServingFix | None = None  # where it faults: the arguments re-checked without the fault

    @property
    def serves(self) -> bool:
        """Stock vLLM's answer: False when its shared KDA layer reads past its state index on a speculative
        decode beside a prefill (the engine dies or overwrites another request's state)."""
        return self.kda_step is None or not self.kda_step.faults

    @property
    def plugin_serves(self) -> bool:
        """With the plugin: its KDA state-slot fix gives the kernel an index as wide as the query."""
        fixed = self.kda_step_plugin
        return self.serves or (fixed is not None and not fixed.faults)

    @property
    def unanswered(self) -> list[str]:
        """Each question the check could not answer here, with why: a replayed arm that broke on
        something other than the staging copy, and the serving question."""
        gaps = [
            f"{who} at pipeline stage {s.index}: the replay broke ({arm.error})"
            for s in self.stages
            for who, arm in (("stock vLLM", s.stock), ("with the plugin", s.plugin))
            if not arm.conclusive
        ]
        if self.kda_step_error is not None:
            gaps.append(
                f"serving (vLLM's shared KDA layer on a step mixing a speculative decode with a "
                f"prefill): {self.kda_step_error}"
            )
        return gaps

    def serve_lines(self) -> list[str]:
        """Whether vLLM's shared KDA layer survives a step that mixes a speculative decode with a prefill:
        the report's lines, which ``--json`` carries as the serving question's advice."""
        step = self.kda_step
        if step is None:
            return (
                [] if self.kda_step_error is None else [f"serving: NOT CHECKED here ({self.kda_step_error})"]
            )
        where = f"vLLM's shared KDA layer ({step.layer}, {step.builder})"
        if not step.faults:
            return [
                f"serving: {where} indexes a speculative decode beside a prefill with "
                f"{step.index_columns} state columns for its {step.query_length} tokens"
            ]
        extra = step.extra_bytes_per_request / 1024**2
        spent = (
            f"{step.query_length - 1} more state slots per request in its {step.kda_layers} KDA layers: "
            f"{extra:.1f} MiB per request on each GPU"
        )
        when = (
            "this vLLM runs such a step in its boot warm-up, so stock vLLM dies at boot (CUDA illegal "
            "memory access)"
            if self.kda_fault_at_boot
            else "the engine dies (CUDA illegal memory access) or another request's state is overwritten"
        )
        fixed = self.kda_step_plugin is not None and not self.kda_step_plugin.faults
        plugin = (
            "  with the plugin: fixed, it serves (the layer keeps one state slot per speculative token: "
            f"{spent}, as vLLM without --use-replayssm)"
            if fixed
            else "  with the plugin: NOT fixed (its KDA state-slot fix is off: STAGING_PLUGIN_KDA_FIX=off)"
        )
        return [
            "",
            f"{'serving' if fixed else 'WARNING serving'}: stock {where} reads past its state index on every "
            f"step that mixes a speculative decode with a prefill: {when}",
            f"  why   --use-replayssm leaves it {step.index_columns} state slot per request; its kernel "
            f"reads {step.query_length} index words (1 + {step.query_length - 1} speculative tokens)",
            plugin,
            f"  without the plugin: drop --use-replayssm ({spent}), or patch vLLM with the diff "
            "`vllm-staging-plugin patch kda` prints (same memory, --use-replayssm kept)",
            *self._serving_fix_lines(),
        ]

    def _serving_fix_lines(self) -> list[str]:
        fix = self.serving_fix
        if fix is None:
            return []
        if fix.serves is None:
            return ["        (without --use-replayssm: checked again, serving still not answered here)"]
        if not fix.serves:
            return ["        (without --use-replayssm: checked again, the layer still reads past its index)"]
        boots = (
            "stock vLLM and the plugin boot it"
            if fix.stock_boots
            else ("the plugin boots it (stock vLLM does not)" if fix.plugin_boots else "it does NOT boot")
        )
        return [f"        (without --use-replayssm: checked again, it serves and {boots})"]

    @property
    def plugin_boots(self) -> bool:
        return all(s.plugin.holds(self.capacity) for s in self.stages)

    @property
    def ranks_replayed(self) -> str:
        """Which ranks the replays stand for, in words."""
        tp, pp, dp = (
            self.parallel.get(k, 1)
            for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        )
        if pp == 1:
            text = "replayed the only pipeline stage (hidden_states)"
        else:
            role = {0: "first", pp - 1: "last"}
            parts = [
                f"{s.index} ({role.get(s.index, f'middle, for stages 1-{pp - 2}')}: {s.staged})"
                for s in self.stages
            ]
            text = f"replayed pipeline stages {', '.join(parts)} of {pp}"
        if tp > 1:
            whose = "the" if pp == 1 else "each stage's"
            text += f"; {whose} {tp} tensor-parallel ranks build the same descriptors (one replay for all)"
        if dp > 1:
            text += f"; the {dp} data-parallel engines repeat this engine's plan"
        return text

    @property
    def identical_to_stock(self) -> bool | None:
        if not self.stock.ok or self.order != "descending":
            return None
        return self.stock.buffers == self.plugin.buffers

    @property
    def fixed_in_vllm(self) -> str | None:
        """Where stock crashes at the staging copy: the first vLLM release that sizes the buffers itself."""
        crashed = any(s.stock.crashed for s in self.stages)
        return FIRST_SIZING_RELEASE if crashed and not self.vllm_sizes_staging else None

    @property
    def staging_bytes(self) -> int:
        return sum(int(b["bytes"]) for b in self.plugin.buffers.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin_version": __version__,
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "platform": self.platform,
            "model": self.model,
            "architecture": self.architecture,
            "cudagraph_mode": self.cudagraph_mode,
            "capture_sizes": self.capture_sizes,
            "max_num_seqs": self.max_num_seqs,
            "decode_query_len": self.decode_query_len,
            "use_kda_recoverssm": self.use_kda_recoverssm,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "capacity": self.capacity,
            "sequence": self.sequence,
            "stock": _arm_json(self.stock),
            "plugin": {**_arm_json(self.plugin), "ok": self.plugin_boots, "order": self.order},
            "staging_bytes": self.staging_bytes,
            "identical_to_stock": self.identical_to_stock,
            "vllm_sizes_staging": self.vllm_sizes_staging,
            "parallel": self.parallel,
            "ranks_replayed": self.ranks_replayed,
            "pipeline_stages": [
                {
                    "stage": s.index,
                    "staged": s.staged,
                    "stock_ok": s.stock.ok,
                    "plugin_ok": s.plugin.holds(self.capacity),
                    "buffers": s.plugin.buffers,
                }
                for s in self.stages
            ],
            "stock_workaround": self._workaround_json(),
            "fixed_in_vllm": self.fixed_in_vllm,
            "serve": self._serve_json(),
            "answered": not self.unanswered,
            "unanswered": self.unanswered,
            "notes": self.notes,
            "seconds": self.seconds,
        }

    def _workaround_json(self) -> dict[str, Any] | None:
        """The grid that boots stock vLLM, with what it does not fix: a serving fault stays."""
        if self.workaround is None:
            return None
        serves = self.serves if self.kda_step_error is None else None
        fixes = "boot" if serves is not False else "boot only: the serving fault stays (see serve)"
        return {**self.workaround.to_json(), "fixes": fixes, "serves": serves}

    def _serve_json(self) -> dict[str, Any]:
        """The serving question, always an object: whether it applies (None: could not tell), whether it
        was checked, the answer and the report's advice lines."""
        step = self.kda_step
        advice = [line for line in self.serve_lines() if line]
        fix = asdict(self.serving_fix) if self.serving_fix else None
        if step is None:
            applies = None if self.kda_step_error is not None else False
            return {
                "applies": applies,
                "checked": False,
                "ok": None,
                "plugin_ok": None,
                "error": self.kda_step_error,
                "advice": advice,
                "fix": fix,
            }
        return {
            "applies": True,
            "checked": True,
            "ok": not step.faults,
            "plugin_ok": self.plugin_serves,
            "fault_at_boot": self.kda_fault_at_boot and step.faults,
            "error": None,
            "advice": advice,
            "fix": fix,
            "layer": step.layer,
            "builder": step.builder,
            "index_columns": step.index_columns,
            "query_length": step.query_length,
            "kda_layers": step.kda_layers,
            "extra_bytes_per_request_without_replayssm": step.extra_bytes_per_request,
        }


def _arm_json(arm: ReplayResult) -> dict[str, Any]:
    return {
        "ok": arm.ok,
        "error": arm.error,
        "allocated_by": arm.allocated_by,
        "failed_at": arm.failed_at,
        "captured": arm.captured,
        "buffers": arm.buffers,
    }
