"""The patch on ``ModelCudaGraphManager``, with the registry of every change the plugin makes to vLLM.

Patch registry (vllm-ascend's fields; the installer in :mod:`.installer` applies and undoes each one):

``vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager.__init__`` (wrapped)
    Why: vLLM allocates the staging buffers (``hidden_states``, ``aux_hidden_states``,
    ``intermediate_tensors``) lazily with the rows of the first capture output, so any capture whose first
    descriptor is not the largest crashes at the staging copy; vLLM 0.30.0-0.33.0 reach that in their own
    order (recover-SSM with speculative decoding, docs/stock-crashes.md).
    How: after vLLM's ``__init__``, check the structure (:mod:`.compat`) and record the capacity, the
    largest ``num_tokens`` over every descriptor. Nothing is allocated: vLLM's profiling pass measures
    graph memory inside ``capture_model``, so the buffers must be born there, as stock.
    Upstream PR: vllm-project/vllm#47925 (same mechanism, closed unmerged).
    Removal: when upstream sizes the buffers to the largest descriptor (or captures it first in every
    mode), for every release still supported.
``ModelCudaGraphManager.capture`` (wrapped)
    Why: the pre-sizing must act on vLLM's own first assignment, inside capture.
    How: re-read the capacity; under a non-default ``STAGING_PLUGIN_ORDER`` reorder the real capture's
    descriptors (never the profiling pass's, which samples the largest) after the coupled ranks agreed
    (:mod:`.agreement`); write a receipt if asked (:mod:`.capture_session`); for the capture only (and
    only while pre-sizing), move the manager instance (``__class__``) into a per-class look-alike subclass
    whose set-only slots see vLLM's first assignment (:mod:`.staging`); vLLM's class itself carries no slot.
    The manager holds one plugin attribute, ``_vllm_staging`` (settings, capacity, ranks agreed).
    Upstream PR: as above. Removal: as above; the order knob would then need an upstream hook.
``vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__`` (wrapped, :mod:`.runner_guard`)
    Why: on the V1 runner there is no manager and the plugin would be silently inactive.
    How: one warning (strict: an error); unwrapped as soon as a V2 manager is built.
    Upstream PR: none (a plugin's own diagnosis). Removal: when vLLM drops the V1 runner.
``sys.meta_path`` (two post-import hooks, :mod:`.import_hook`)
    Why: ``register()`` must not import torch or vLLM. How: each hook waits for one module; the patch's
    removes itself when it fires, the V1 runner's when a manager is built (and the patch's when a V1
    runner is). Upstream PR: none. Removal: with the patch.
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (environment, only when a ``STAGING_PLUGIN_*`` is set)
    Why: vLLM's legacy Ray executor and DP Ray backend copy only listed prefixes to Ray actors.
    How: ``STAGING_PLUGIN_`` appended, keeping what the operator listed. Upstream PR: none (vLLM's
    documented extension point). Removal: when every supported Ray path copies the driver environment.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

from . import compat
from .installer import INSTALLER, Wrapped
from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT, Settings, read_settings, strict_requested
from .sizing import staging_capacity
from .staging import (
    STAGING_ATTRS,
    STATE_ATTR,
    ManagerState,
    capture_view,
    ensure_capacity,
    intercepting,
    state_of,
)

logger = logging.getLogger("vllm.staging_plugin")
WRAPPED = ("__init__", "capture")


def patch_module(module: ModuleType) -> None:
    """Called once ``cudagraph_utils`` is imported: check the structure and platform, then patch."""
    try:
        cls = compat.manager_class(module)
        compat.check_platform()
    except compat.IncompatibleVllm as exc:
        refuse(str(exc))
        return
    except Exception as exc:  # never break the import of vLLM's module
        refuse(f"{type(exc).__name__}: {exc}")
        return
    patch(cls)


def refuse(reason: str, strict: bool | None = None) -> None:
    """Leave vLLM stock with exactly one warning per process, or raise in strict mode."""
    if strict_requested() if strict is None else strict:
        raise compat.IncompatibleVllm(f"vllm-staging-plugin (strict mode): {reason}")
    if not INSTALLER.refused:
        INSTALLER.refused = True
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
    return cls in INSTALLER.classes


def patch(cls: type) -> bool:
    """Install the wrappers on ``cls``; returns False if it was already patched."""

    def make(record: Wrapped) -> dict[str, Any]:
        return {
            "__init__": _wrap_init(record, record.originals["__init__"]),
            "capture": _wrap_capture(record, record.originals["capture"]),
        }

    done = INSTALLER.wrap(cls, WRAPPED, make)
    if done:
        logger.debug("patched %s.%s (__init__, capture)", cls.__module__, cls.__name__)
    return done


def unpatch(cls: type) -> bool:
    """Restore ``cls``'s own methods; returns False if it was not patched. Built managers keep working."""
    return INSTALLER.unwrap(cls)


def _wrap_init(record: Wrapped, original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not record.live:
            return original(self, *args, **kwargs)
        settings = read_settings()  # bad configuration fails here, before anything is built
        if settings.order != DEFAULT_ORDER and not settings.disabled:
            from .policies import validate_order

            validate_order(settings)
        original(self, *args, **kwargs)
        if settings.disabled:
            return None
        INSTALLER.model_runner_v2_chosen()
        try:
            compat.check_manager(self)
            capacity = staging_capacity(self._capture_descs)
        except Exception as exc:  # renamed internals, odd descriptors: stay stock
            _deactivate(self, f"{type(exc).__name__}: {exc}", settings.strict)
            return None
        presizing = settings.presize == "on"
        self.__dict__[STATE_ATTR] = ManagerState(settings, capacity if presizing else None)
        _announce(self, capacity, settings)
        return None

    return __init__


def _deactivate(manager: Any, reason: str, strict: bool) -> None:
    """Refuse for this and every later manager: the class goes back to stock.

    Called from ``__init__`` before the manager holds any plugin state, so there is nothing to remove.
    """
    found = INSTALLER.record_for(manager)
    if found is not None:
        unpatch(found[0])
    refuse(reason, strict)


def _announce(manager: Any, capacity: int, settings: Settings) -> None:
    level = logging.DEBUG if INSTALLER.announced else logging.INFO
    INSTALLER.announced = True
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


def _wrap_capture(record: Wrapped, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = state_of(self) if record.live else None
        if state is None:
            return original(self, *args, **kwargs)
        settings = state.settings
        if state.capacity is not None:
            ensure_capacity(self, state)
        profiling = getattr(self, "_max_full_descs_to_capture", None) is not None
        ordered = None  # this capture's descriptors in policy order; vLLM's own when None
        if not profiling and settings.order != DEFAULT_ORDER:  # profiling keeps vLLM's order
            from .agreement import check_coupled_ranks
            from .policies import reordered

            ordered = reordered(settings, self._capture_descs)
            state.ranks_agreed = check_coupled_ranks(settings, ordered, self.vllm_config)
        receipt: Any = nullcontext()
        if settings.receipts_dir is not None:
            from .capture_session import receipt_session

            receipt = receipt_session(self, state, profiling)
        with _in_order(self, ordered), receipt, _staging(self, record, state):
            return original(self, *args, **kwargs)

    return capture


@contextmanager
def _in_order(manager: Any, ordered: dict[Any, list[Any]] | None) -> Iterator[None]:
    """Capture ``ordered`` instead of vLLM's lists, then give the manager its own lists back."""
    if ordered is None:
        yield
        return
    stock = manager._capture_descs
    manager._capture_descs = ordered
    try:
        yield
    finally:
        manager._capture_descs = stock


def _staging(manager: Any, record: Wrapped, state: ManagerState) -> Any:
    if state.capacity is None:
        return nullcontext()
    names = tuple(name for name in STAGING_ATTRS if name in manager.__dict__)
    key = (type(manager), names)
    view = record.views.get(key)
    if view is None:
        view = record.views[key] = capture_view(type(manager), names)
    return intercepting(manager, view)
