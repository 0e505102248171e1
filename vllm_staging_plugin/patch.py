"""The patch: wrap ``ModelCudaGraphManager`` so its lazily allocated staging buffers get capacity rows.

How (why each piece sits where it sits, see docs/design.md):

* ``__init__`` wrapper: after vLLM's own ``__init__``, checks the structure and records the capacity,
  the largest ``num_tokens`` over every capture descriptor. It allocates nothing: vLLM's profiling
  pass measures graph memory inside ``capture_model``, so the buffers must be born there, as stock.
* ``capture`` wrapper: re-reads the descriptors (one added after ``__init__`` still fits: buffers grow
  while no FULL graph has recorded their address), checks that all ranks agree, applies the order policy
  to the real capture only, writes the receipt, and *for the duration of the capture only* moves the
  manager into a subclass whose data descriptors for ``hidden_states``, ``aux_hidden_states`` and
  ``intermediate_tensors`` intercept vLLM's own lazy allocation (``torch.empty_like`` of the first
  output). Only if that output has fewer rows than the capacity is a capacity-row tensor of the same
  dtype, device and trailing shape stored instead; under vLLM's descending order the first output
  already has capacity rows and the stock tensor is kept: not one byte changes.
* After capture the manager is an instance of vLLM's class again and its buffers are plain instance
  attributes: graph replay (``run_fullgraph`` at every decode step) runs no plugin code at all.

Idempotent through a sentinel on the class that holds the originals; :func:`unpatch` restores them.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from . import compat
from .settings import (
    DEFAULT_ORDER,
    ENV_ORDER,
    ENV_STRICT,
    Settings,
    read_settings,
    strict_requested,
)
from .sizing import staging_capacity

logger = logging.getLogger("vllm.staging_plugin")

ORIGINALS_ATTR = "_vllm_staging_plugin_originals"  # sentinel on the patched class
CAPACITY_ATTR = "_vllm_staging_capacity"  # per manager: rows, present only while active
SETTINGS_ATTR = "_vllm_staging_settings"
AGREED_ATTR = "_vllm_staging_ranks_agreed"  # per manager: ranks whose plan matched (None: single process)
STAGING_ATTRS = tuple(compat.STAGING_INITIAL)

_state = {"warned": False, "announced": False}


class StagingError(RuntimeError):
    """The plugin cannot keep the staging buffers correct and says why (never a silent cast)."""


def refuse(reason: str, strict: bool | None = None) -> None:
    """Leave vLLM stock with exactly one warning per process, or raise in strict mode."""
    if strict_requested() if strict is None else strict:
        raise compat.IncompatibleVllm(f"vllm-staging-plugin (strict mode): {reason}")
    if not _state["warned"]:
        _state["warned"] = True
        order = os.environ.get(ENV_ORDER, "").strip()
        ignored = f" {ENV_ORDER}={order} is NOT applied." if order not in ("", DEFAULT_ORDER) else ""
        logger.warning(
            "vllm-staging-plugin is inactive, vLLM runs unpatched (stock lazy staging, vLLM's own "
            "descending capture order): %s.%s Set %s=1 to fail instead.",
            reason,
            ignored,
            ENV_STRICT,
        )


def is_patched(cls: type) -> bool:
    return ORIGINALS_ATTR in cls.__dict__


def patch(cls: type) -> bool:
    """Install the wrappers on ``cls``; returns False if it was already patched."""
    if is_patched(cls):
        return False
    originals = {name: cls.__dict__[name] for name in ("__init__", "capture")}
    cls.__init__ = _wrap_init(originals["__init__"])  # type: ignore[misc]
    cls.capture = _wrap_capture(originals["capture"])  # type: ignore[attr-defined]
    setattr(cls, ORIGINALS_ATTR, originals)
    logger.debug("patched %s.%s (__init__, capture)", cls.__module__, cls.__name__)
    return True


def unpatch(cls: type) -> bool:
    """Restore ``cls`` exactly; returns False if it was not patched. Built managers keep working."""
    originals = cls.__dict__.get(ORIGINALS_ATTR)
    if originals is None:
        return False
    for name, original in originals.items():
        setattr(cls, name, original)
    delattr(cls, ORIGINALS_ATTR)
    _CAPTURE_VIEWS.pop(cls, None)
    return True


def _patched_owner(manager: Any) -> type | None:
    return next((c for c in type(manager).__mro__ if ORIGINALS_ATTR in c.__dict__), None)


def _deactivate(manager: Any, reason: str, strict: bool) -> None:
    """Refuse for this and every later manager: the class goes back to stock.

    Called from ``__init__`` before the manager holds a capacity or settings, so there is nothing of the
    plugin's on the instance to remove.
    """
    owner = _patched_owner(manager)
    if owner is not None:
        unpatch(owner)
    refuse(reason, strict)


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        settings = read_settings()  # bad configuration fails here, before anything is built
        from .policies import validate_order

        validate_order(settings)
        original(self, *args, **kwargs)
        if settings.disabled:
            return
        try:
            compat.check_manager(self)
            capacity = staging_capacity(self._capture_descs)
        except Exception as exc:  # renamed internals, odd descriptors: stay stock
            _deactivate(self, f"{type(exc).__name__}: {exc}", settings.strict)
            return
        self.__dict__[SETTINGS_ATTR] = settings
        if settings.presize == "on":
            self.__dict__[CAPACITY_ATTR] = capacity
        _announce(self, capacity, settings)

    return __init__


def _announce(manager: Any, capacity: int, settings: Settings) -> None:
    level = logging.DEBUG if _state["announced"] else logging.INFO
    _state["announced"] = True
    sizing = (
        f"sized to {capacity} rows, the largest"
        if settings.presize == "on"
        else f"left to vLLM's lazy sizing ({settings.presize}; largest is {capacity} rows)"
    )
    logger.log(
        level,
        "vllm-staging-plugin: %s staging buffers (%s) %s of %d capture descriptors; capture order: %s",
        type(manager).__name__,
        ", ".join(STAGING_ATTRS),
        sizing,
        sum(len(d) for d in manager._capture_descs.values()),
        settings.order,
    )


def _wrap_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        settings: Settings | None = self.__dict__.get(SETTINGS_ATTR)
        if settings is None:
            return original(self, *args, **kwargs)
        if CAPACITY_ATTR in self.__dict__:
            ensure_capacity(self)
        profiling = getattr(self, "_max_full_descs_to_capture", None) is not None
        ordered = None  # this capture's descriptors in policy order; vLLM's own when None
        if not profiling:  # vLLM's profiling pass always keeps vLLM's order (it samples the largest)
            if settings.order != DEFAULT_ORDER:
                from .policies import reordered

                ordered = reordered(settings, self._capture_descs)
            from .agreement import check_process_group

            self.__dict__[AGREED_ATTR] = check_process_group(settings, ordered or self._capture_descs)
        from .capture_session import capture_session

        with capture_session(self, settings, profiling, ordered), _intercepting_staging(self):
            return original(self, *args, **kwargs)

    return capture


# Patched class -> its capture-time subclass (with the staging data descriptors), built once.
_CAPTURE_VIEWS: dict[type, type] = {}


def _capture_view(cls: type) -> type:
    """``cls`` plus data descriptors for the staging attributes; same name, no other difference."""
    view = _CAPTURE_VIEWS.get(cls)
    if view is None:
        slots: dict[str, Any] = {name: _StagingSlot(name) for name in STAGING_ATTRS}
        slots.update(__module__=cls.__module__, __qualname__=cls.__qualname__)
        view = _CAPTURE_VIEWS[cls] = type(cls.__name__, (cls,), slots)
    return view


@contextmanager
def _intercepting_staging(manager: Any) -> Iterator[None]:
    """During one capture, route the staging attributes through :class:`_StagingSlot`.

    Swapping ``__class__`` (not putting descriptors on vLLM's class) keeps every read outside capture,
    in particular ``run_fullgraph`` at each FULL graph replay, a plain instance-dict lookup.
    """
    if CAPACITY_ATTR not in manager.__dict__:
        yield
        return
    cls = type(manager)
    manager.__class__ = _capture_view(cls)
    try:
        yield
    finally:
        manager.__class__ = cls


def staging_tensors(manager: Any) -> dict[str, torch.Tensor]:
    """The allocated staging tensors by display name (aux and intermediate ones indexed)."""
    state = vars(manager)
    found: dict[str, torch.Tensor] = {}
    if isinstance(state.get("hidden_states"), torch.Tensor):
        found["hidden_states"] = state["hidden_states"]
    for i, aux in enumerate(state.get("aux_hidden_states") or []):
        found[f"aux_hidden_states[{i}]"] = aux
    for key, tensor in (getattr(state.get("intermediate_tensors"), "tensors", None) or {}).items():
        found[f"intermediate_tensors[{key}]"] = tensor
    return found


def held_rows(manager: Any) -> int | None:
    """Rows of the smallest allocated staging buffer (None before the first capture output)."""
    return min((int(t.shape[0]) for t in staging_tensors(manager).values()), default=None)


def ensure_capacity(manager: Any) -> None:
    """Re-read the descriptors; grow buffers that are too small while that is still safe."""
    capacity = staging_capacity(manager._capture_descs)
    manager.__dict__[CAPACITY_ATTR] = capacity
    rows = held_rows(manager)
    if rows is None or rows >= capacity:
        return
    if getattr(manager, "graphs", None):
        raise StagingError(
            f"a capture descriptor of {capacity} tokens was added after CUDA graphs recorded the "
            f"address of the {rows}-row staging buffers; replacing them would corrupt those graphs. "
            "Register all descriptors before the first capture (vLLM rebuilds the manager when it "
            "re-initialises the KV cache)."
        )
    for name, initial in compat.STAGING_INITIAL.items():
        if name in manager.__dict__:
            manager.__dict__[name] = copy.copy(initial)  # re-allocated lazily at the new capacity


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


def allocation_failure(manager: Any, name: str, value: Any, capacity: int, exc: BaseException) -> str:
    """The start-up error when the capacity-row buffer cannot be allocated, with what to change."""
    settings: Settings = manager.__dict__[SETTINGS_ATTR]
    rows = _rows(value)
    if settings.order != DEFAULT_ORDER:
        advice = (
            f"{ENV_ORDER}={settings.order} captures a {rows}-row descriptor first; with "
            f"{ENV_ORDER}={DEFAULT_ORDER} vLLM's own first output usually has capacity rows and needs no "
            "second allocation, or free GPU memory (lower gpu_memory_utilization)"
        )
    else:
        advice = (
            "vLLM's own order starts with a smaller descriptor here (see docs/stock-crashes.md), so stock "
            "vLLM would crash at the staging copy too; free GPU memory (lower gpu_memory_utilization)"
        )
    return (
        f"vllm-staging-plugin: allocating {name} with {capacity} rows failed ({type(exc).__name__}: "
        f"{exc}); vLLM's own buffer has {rows} rows and a later descriptor of this capture needs "
        f"{capacity}, so the capture cannot go on. {advice}."
    )


def _rows(value: Any) -> int | None:
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    if isinstance(value, list):
        return min((r for r in map(_rows, value) if r is not None), default=None)
    tensors = getattr(value, "tensors", None)
    return _rows(list(tensors.values())) if isinstance(tensors, dict) else None


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, list) and not value)


class _StagingSlot:
    """Data descriptor for one staging attribute; the value lives in the instance ``__dict__``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            return obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, obj: Any, value: Any) -> None:
        capacity = obj.__dict__.get(CAPACITY_ATTR)
        rows = _rows(value)
        if capacity and _is_empty(obj.__dict__.get(self.name)) and rows is not None and rows < capacity:
            value = self._allocate(obj, value, capacity)  # vLLM's first output is short: grow it
        obj.__dict__[self.name] = value

    def _allocate(self, obj: Any, value: Any, capacity: int) -> Any:
        try:
            return presized(value, capacity)
        except Exception as exc:
            # Only reached when vLLM's first output has fewer rows than a later descriptor needs: going
            # on with vLLM's buffer would crash at that descriptor's staging copy, whatever the order.
            raise StagingError(allocation_failure(obj, self.name, value, capacity, exc)) from exc


@contextmanager
def patched(cls: type) -> Iterator[type]:
    """Patch ``cls`` for the duration of a block (tests, the CLI's side-by-side replay)."""
    newly = patch(cls)
    try:
        yield cls
    finally:
        if newly:
            unpatch(cls)
