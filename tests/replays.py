"""Test-only replays in orders no policy expresses: the CPU replay with the real manager's capture plan
permuted (or a descriptor added) through ``seams.capture_plan`` before its capture, stock and patched
alike. The tools apply an order one way, through ``Settings`` and the plugin's policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from vllm_staging_plugin._engine.settings import Settings
from vllm_staging_plugin._engine.staging import staging_tensors
from vllm_staging_plugin._offline import cpu_replay, seams
from vllm_staging_plugin._offline.cpu_replay import PATCHED, ReplayConfig, ReplayResult
from vllm_staging_plugin._offline.cpu_replay import run as cpu_replay_run
from vllm_staging_plugin._offline.cpu_replay.stand_ins import Model

Reorder = Callable[[list[Any]], list[Any]]


def ascending(descs: list[Any]) -> list[Any]:
    return sorted(descs, key=lambda d: d.num_tokens)


def reorder_plan(manager: Any, reorder: Reorder) -> None:
    """Each mode's descriptors in the manager's live plan, as ``reorder`` returns them."""
    plan = seams.capture_plan(manager)
    for mode, descs in plan.items():
        plan[mode] = reorder(list(descs))


class PatternModel(Model):
    """The stand-in's outputs filled with small integers (exact in every float dtype) that differ per
    forward size, row, column and output, so that staging contents can be compared byte for byte."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        made = super().forward(*args, **kwargs)
        tensors = getattr(made, "tensors", None)  # IntermediateTensors (non-last pipeline rank)
        if isinstance(tensors, dict):
            outputs = list(tensors.values())
        elif isinstance(made, tuple):  # hidden states and the aux hidden states
            outputs = [made[0], *made[1]]
        else:
            outputs = [made]
        for index, tensor in enumerate(outputs):
            rows, width = tensor.shape
            values = torch.arange(rows * width).reshape(rows, width) + 7 * rows + 31 * index
            tensor.copy_((values % 97).to(tensor.dtype))
        return made


def replay_tensors(
    cfg: ReplayConfig,
    patched: bool,
    reorder: Reorder | None = None,
    settings: Settings = PATCHED,
    model: type[Model] = PatternModel,
) -> tuple[ReplayResult, dict[str, torch.Tensor]]:
    """``cpu_replay.replay`` in ``reorder``'s order with ``model``'s outputs (default: a pattern, to compare
    contents), plus the staging tensors (by display name)."""
    with (
        cpu_replay.cpu_stubs(cfg),
        cpu_replay.stock_or_patched(patched, settings),
        mock.patch.object(cpu_replay_run, "Model", model),
    ):
        manager = cpu_replay.build_manager(cfg)
        if reorder is not None:
            reorder_plan(manager, reorder)
        result = cpu_replay.run_capture(manager, cfg)
    return result, dict(staging_tensors(manager))


def replay(
    cfg: ReplayConfig, patched: bool, reorder: Reorder | None = None, settings: Settings = PATCHED
) -> ReplayResult:
    return replay_tensors(cfg, patched, reorder, settings, Model)[0]
