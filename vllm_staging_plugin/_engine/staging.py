"""Per-manager staging: vLLM's first capture output is grown to the capacity as vLLM stores it.

vLLM allocates each staging buffer as ``empty_like`` of the first capture output and then only tests "is it
still empty". For one capture the manager moves into a subclass whose set-only slots see that first
assignment and store a capacity-row tensor where vLLM's is shorter; otherwise vLLM's tensor is kept.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .compat import AUX_HIDDEN_STATES, HIDDEN_STATES, INTERMEDIATE_TENSORS
from .settings import DEFAULT_ORDER, ENV_ORDER, Settings
from .sizing import CAPTURE_MODE_ORDER, Descriptor

STATE_ATTR = "_vllm_staging"  # per manager: its ManagerState, in the instance __dict__


@dataclass
class ManagerState:
    """The plugin's one attribute on a manager: its settings and, while pre-sizing, the capacity."""

    settings: Settings
    capacity: int | None  # rows; None when pre-sizing is off
    ranks_agreed: int | None = None  # ranks whose capture plan matched (None: not checked)
    first_tokens: int | None = None  # num_tokens of this capture's first descriptor
    vllm_sizes_staging: bool = False  # by its release shape, or seen sizing its first buffer itself


class StagingError(RuntimeError):
    """The plugin cannot keep the staging buffers correct and says why (never a silent cast)."""


def state_of(manager: object) -> ManagerState | None:
    state = vars(manager).get(STATE_ATTR)
    return state if isinstance(state, ManagerState) else None


def staging_tensors(manager: object) -> dict[str, torch.Tensor]:
    """The allocated staging tensors by display name (aux and intermediate ones indexed)."""
    state = vars(manager)
    found: dict[str, torch.Tensor] = {}
    if isinstance(state.get(HIDDEN_STATES), torch.Tensor):
        found[HIDDEN_STATES] = state[HIDDEN_STATES]
    for i, aux in enumerate(state.get(AUX_HIDDEN_STATES) or []):
        found[f"{AUX_HIDDEN_STATES}[{i}]"] = aux
    for key, tensor in (getattr(state.get(INTERMEDIATE_TENSORS), "tensors", None) or {}).items():
        found[f"{INTERMEDIATE_TENSORS}[{key}]"] = tensor
    return found


def staging_buffer_bytes(manager: object) -> dict[str, dict[str, Any]]:
    """Rows, shape, dtype and bytes of each allocated staging buffer, by name (receipts, replays)."""
    return {
        name: {
            "rows": int(t.shape[0]),
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "bytes": t.numel() * t.element_size(),
        }
        for name, t in staging_tensors(manager).items()
    }


def first_tokens(capture_descs: Mapping[Any, Sequence[Descriptor]]) -> int | None:
    """``num_tokens`` of the descriptor vLLM captures first (PIECEWISE before FULL), None if none."""
    by_name = {str(getattr(mode, "name", mode)): descs for mode, descs in capture_descs.items()}
    for name in CAPTURE_MODE_ORDER:
        if by_name.get(name):
            return int(by_name[name][0].num_tokens)
    return None


def presized(value: Any, capacity: int) -> Any:
    """``value`` with every staging tensor grown to ``capacity`` rows (same dtype/device/trailing)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] >= capacity:
            return value
        return value.new_empty((capacity, *value.shape[1:]))
    if isinstance(value, list):
        return [presized(v, capacity) for v in value]
    tensors = getattr(value, "tensors", None)
    if isinstance(tensors, dict):  # IntermediateTensors (non-last pipeline rank)
        grown = copy.copy(value)
        grown.tensors = {k: presized(v, capacity) for k, v in tensors.items()}
        return grown
    return value


def allocation_failure(settings: Settings, name: str, value: Any, capacity: int, exc: BaseException) -> str:
    """The start-up error when the capacity-row buffer cannot be allocated, with what to change."""
    rows = rows_of(value)
    if settings.order != DEFAULT_ORDER:
        advice = (
            f"{ENV_ORDER}={settings.order} captures a {rows}-row descriptor first; with "
            f"{ENV_ORDER}={DEFAULT_ORDER} vLLM's own first output usually has capacity rows and needs no "
            "second allocation, or free GPU memory (lower gpu_memory_utilization)"
        )
    else:
        advice = (
            "vLLM's own order starts with a smaller descriptor here (as recover-SSM with speculative "
            "decoding does: its PIECEWISE sizes stop below the largest FULL decode descriptor), so stock "
            "vLLM would crash at the staging copy too; free GPU memory (lower gpu_memory_utilization)"
        )
    return (
        f"vllm-staging-plugin: allocating {name} with {capacity} rows failed ({type(exc).__name__}: "
        f"{exc}); vLLM's own buffer has {rows} rows and a later descriptor of this capture needs "
        f"{capacity}, so the capture cannot go on. {advice}."
    )


def rows_of(value: Any) -> int | None:
    """Rows of a staging value (tensor, list of tensors, IntermediateTensors); the smallest for many."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    if isinstance(value, list):
        return min((r for r in map(rows_of, value) if r is not None), default=None)
    tensors = getattr(value, "tensors", None)
    return rows_of(list(tensors.values())) if isinstance(tensors, dict) else None


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, list) and not value)


class _StagingSlot:
    """Set-only descriptor for one staging attribute: with no ``__get__``, reads never run plugin code."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, value: Any) -> None:
        own = obj.__dict__
        state = own.get(STATE_ATTR)
        capacity = state.capacity if isinstance(state, ManagerState) else None
        if capacity and _is_empty(own.get(self.name)):
            rows = rows_of(value)
            if rows is not None and rows < capacity:  # vLLM's first output is short: grow it
                value = self._allocate(state, value, capacity)
            elif rows is not None and state.first_tokens is not None and state.first_tokens < capacity:
                state.vllm_sizes_staging = True  # vLLM sized it by the largest descriptor itself
        own[self.name] = value

    def _allocate(self, state: ManagerState, value: Any, capacity: int) -> Any:
        try:
            return presized(value, capacity)
        except Exception as exc:
            # vLLM's shorter buffer would crash at a later staging copy anyway: stop here, saying why
            raise StagingError(allocation_failure(state.settings, self.name, value, capacity, exc)) from exc


def capture_view(cls: type, names: Sequence[str]) -> type:
    """``cls`` plus a slot for each of ``names``, only those the manager holds: a set-only slot answers a
    read of a missing attribute with itself."""
    slots: dict[str, Any] = {name: _StagingSlot(name) for name in names}
    slots.update(__module__=cls.__module__, __qualname__=cls.__qualname__)
    return type(cls.__name__, (cls,), slots)


@contextmanager
def swapped(manager: Any, name: str, value: Any) -> Iterator[None]:
    """``manager.name`` is ``value`` for one capture, then what it was: its class (a capture view, so vLLM's
    class stays free of plugin code at every replay), or its descriptor lists (in policy order)."""
    before = getattr(manager, name)
    setattr(manager, name, value)
    try:
        yield
    finally:
        setattr(manager, name, before)
