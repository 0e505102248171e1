"""The patch on ``ModelCudaGraphManager``, with the registry of every change the plugin makes to vLLM.

Patch registry (vllm-ascend's fields; :class:`~.installer.Installer` applies and undoes each one):

``vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager.__init__`` (wrapped)
    Why: vLLM allocates the staging buffers (``hidden_states``, ``aux_hidden_states``,
    ``intermediate_tensors``) lazily with the rows of the first capture output, so any capture whose first
    descriptor is not the largest crashes at the staging copy; vLLM 0.30.0-0.33.0 reach that in their own
    order (recover-SSM with speculative decoding, docs/stock-crashes.md).
    How: after vLLM's ``__init__``, check the structure (:mod:`.compat`) and record the capacity, the
    largest ``num_tokens`` over every descriptor. Nothing is allocated: vLLM's profiling pass measures
    graph memory inside ``capture_model``, so the buffers must be born there, as stock.
    Upstream PR: vllm-project/vllm#47925 (same mechanism, closed unmerged); the change this project
    proposes is ``upstream/presize-staging-buffers.patch`` with its regression test.
    Removal: when upstream sizes the buffers to the largest descriptor (or captures it first in every
    mode), for every release still supported. Until then, on a vLLM that does, the capture wrapper stands
    down by behaviour (below).
``ModelCudaGraphManager.capture`` (wrapped)
    Why: the pre-sizing must act on vLLM's own first assignment, inside capture.
    How: re-read the capacity; under a non-default ``STAGING_PLUGIN_ORDER`` reorder the real capture's
    descriptors (never the profiling pass's, which samples the largest) after the coupled ranks agreed
    (:mod:`.agreement`); write a receipt if asked (:mod:`.capture_session`); for the capture only (and
    only while pre-sizing), move the manager instance (``__class__``) into a per-class look-alike subclass
    whose set-only slots see vLLM's first assignment (:mod:`.staging`); vLLM's class itself carries no slot.
    The manager holds one plugin attribute, ``_vllm_staging`` (settings, capacity, ranks agreed).
    Stands down by behaviour: when vLLM's own first buffer already holds the capacity although the first
    descriptor captured is smaller, vLLM pre-sizes; one INFO line, and later captures in the process
    leave vLLM's staging alone (the order knob keeps working). A capture whose first descriptor is the
    largest cannot tell the two apart: there the slot keeps vLLM's own tensor, as on stock vLLM.
    Upstream PR: as above. Removal: as above; the order knob would then need an upstream hook.
    On a release whose shape sizes the staging itself (:data:`.compat.SHAPES`, vLLM 0.34.0) the plugin
    records no capacity and never enters the capture view: one INFO line per process says vLLM sizes the
    buffers; the order knob and receipts keep working.
Read on each manager, not wrapped (:mod:`.compat` names each; the structure check and the contract tests
pin them): ``_capture_descs`` and the three staging attributes (checked after ``__init__``); the
profiling pass's mark (``_max_full_descs_to_capture`` on 0.29.0-0.33.0, ``_sample_full_descs`` on
upstream main; :func:`.compat.profiling_pass`: an unrecognized mark keeps vLLM's order with one warning);
``graphs`` (a dict, checked after ``__init__``; :mod:`.staging` never replaces a buffer once a graph
recorded it); ``vllm_config`` (checked after ``__init__``; under a non-default order :mod:`.agreement`
reads its parallel layout, receipts its model); ``pool`` and ``is_last_pp_rank`` (receipts only, read with
defaults; a receipt that fails never fails the capture); the profiling pass's memory deltas
(``_capture_mem_samples``) and the module's ``_extrapolate_full_graph_memory`` (profiling receipts only,
:func:`.compat.profiling_deltas`, :func:`.compat.full_graph_extrapolation`; either missing: no estimate).
``vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn.KimiGatedDeltaNetAttention.get_kv_cache_spec``
(wrapped, :mod:`.kda_slots`; the method the class inherits, or its own where vLLM defines one)
    Why: under ``--use-replayssm`` Mamba layers get no speculative state slots, but this shared KDA layer's
    metadata (the generic GDN builder) hands its kernel one index word per query token: a step mixing a
    speculative decode with a prefill stores out of bounds (illegal memory access; at boot on 0.34.0).
    How: where its spec gives fewer speculative blocks than speculative tokens under ``--use-replayssm``,
    return it with ``num_speculative_blocks = num_speculative_tokens`` (one INFO line with the KV-cache
    cost); otherwise vLLM's spec unchanged. ``STAGING_PLUGIN_KDA_FIX=off`` leaves it out.
    Upstream PR: none yet; the same change as a patch to vLLM ships as ``patches/kda-spec-state-slots.patch``.
    Removal: when vLLM keeps those slots itself (the wrapper then stands down by behaviour, one INFO line).
``vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__`` (wrapped, :mod:`.runner_guard`)
    Why: on the V1 runner there is no manager and the plugin would be silently inactive.
    How: one warning (strict: an error); unwrapped as soon as a V2 manager is built.
    Upstream PR: none (a plugin's own diagnosis). Removal: when vLLM drops the V1 runner.
``sys.meta_path`` (three post-import hooks, :mod:`.import_hook`)
    Why: ``register()`` must not import torch or vLLM. How: each hook waits for one module; the patch's
    and the KDA fix's remove themselves when they fire, the V1 runner's and the KDA fix's when a manager
    is built (and the patch's when a V1 runner is). Upstream PR: none. Removal: with the patch.
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (environment, only when a ``STAGING_PLUGIN_*`` is set)
    Why: vLLM's legacy Ray executor and DP Ray backend copy only listed prefixes to Ray actors.
    How: ``STAGING_PLUGIN_`` appended, keeping what the operator listed. Upstream PR: none (vLLM's
    documented extension point). Removal: when every supported Ray path copies the driver environment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import compat
from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT, Settings
from .sizing import staging_capacity
from .staging import (
    STAGING_ATTRS,
    STATE_ATTR,
    ManagerState,
    capture_view,
    ensure_capacity,
    first_tokens,
    intercepting,
    state_of,
)
from .wrapping import ClassWrap, plugin_wrapper

if TYPE_CHECKING:
    from .agreement import Agreement
    from .policies import PolicyRegistry

logger = logging.getLogger("vllm.staging_plugin")
WRAPPED = ("__init__", "capture")


class ManagerPatch:
    """The wrappers on ``ModelCudaGraphManager`` for one :class:`Settings`, and what they learnt.

    The installer builds one per process from ``register()``'s settings; an offline tool builds its
    own with the settings it chooses and applies it for a block (:meth:`applied_to`).
    """

    def __init__(
        self,
        settings: Settings,
        policies: PolicyRegistry | None = None,
        on_manager_built: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.policies = policies
        self.on_manager_built = on_manager_built
        self.wrap: ClassWrap | None = None
        self.refused = False  # the one "inactive" warning of this process was given
        self.announced = False  # the first manager is logged at INFO, later ones at DEBUG
        self.vllm_presizes = False  # vLLM's own staging holds the largest descriptor (its shape, or seen)
        self.order_refused = False  # the one "order not applied" warning of this process was given
        self.foreign: list[str] = []
        self._agreement: Agreement | None = None
        self._views: dict[tuple[type, tuple[str, ...]], type] = {}

    # -- install / uninstall ------------------------------------------------------------------------

    def install(self, module: ModuleType) -> None:
        """Called once ``cudagraph_utils`` is imported: check the structure and platform, then patch."""
        try:
            cls = compat.manager_class(module)
            compat.check_platform()
        except compat.IncompatibleVllm as exc:
            self.refuse(str(exc))
            return
        except Exception as exc:  # never break the import of vLLM's module
            self.refuse(f"{type(exc).__name__}: {exc}")
            return
        self.patch(cls)

    def patch(self, cls: type) -> bool:
        """Install the wrappers on ``cls``; False if this patch already holds a class."""
        if self.wrap is not None:
            return False
        self.vllm_presizes = compat.release_shape(cls).sizes_staging or self.vllm_presizes
        wrap = ClassWrap(cls, WRAPPED, signals={"__init__": self._manager_built})
        wrap.apply({"__init__": self._wrap_init(wrap), "capture": self._wrap_capture(wrap)})
        self.wrap = wrap
        logger.debug("patched %s.%s (__init__, capture)", cls.__module__, cls.__name__)
        return True

    def uninstall(self) -> list[str]:
        """Restore what the class held; returns the names another tool wrapped meanwhile (left alone)."""
        wrap, self.wrap = self.wrap, None
        if wrap is None:
            return []
        foreign = wrap.restore()
        self.foreign.extend(foreign)
        return foreign

    @contextmanager
    def applied_to(self, cls: type) -> Iterator[ManagerPatch]:
        """For offline tools: ``cls`` wrapped by this patch for the block, then holding what it held."""
        self.patch(cls)
        try:
            yield self
        finally:
            self.uninstall()

    def refuse(self, reason: str) -> None:
        """Leave vLLM stock with exactly one warning per process, or raise in strict mode."""
        if self.settings.strict:
            raise compat.IncompatibleVllm(f"vllm-staging-plugin (strict mode): {reason}")
        if self.refused:
            return
        self.refused = True
        order = self.settings.order
        ignored = f" {ENV_ORDER}={order} is NOT applied." if order != DEFAULT_ORDER else ""
        logger.warning(
            "vllm-staging-plugin is inactive, vLLM runs unpatched (its own staging buffers and capture "
            "order): %s.%s Set %s=1 to fail instead.",
            reason,
            ignored,
            ENV_STRICT,
        )

    # -- the wrappers -------------------------------------------------------------------------------

    def _wrap_init(self, wrap: ClassWrap) -> Callable[..., None]:
        original = wrap.stock["__init__"]

        @plugin_wrapper(original)
        def __init__(manager: Any, *args: Any, **kwargs: Any) -> None:
            original(manager, *args, **kwargs)
            if self.on_manager_built is not None:  # an installer's patch: the installers underneath,
                wrap.signal("__init__")  # whose wrappers it skips, hear of it (a tool's manager is its own)
            if not wrap.live:
                return
            self._manager_built()
            try:
                compat.check_manager(manager)
                capacity = staging_capacity(manager._capture_descs)
            except Exception as exc:  # renamed internals, odd descriptors: stay stock
                self._deactivate(f"{type(exc).__name__}: {exc}")
                return
            presizing = self.settings.presize == "on" and not self.vllm_presizes
            manager.__dict__[STATE_ATTR] = ManagerState(
                self.settings, capacity if presizing else None, vllm_sizes=self.vllm_presizes
            )
            self._announce(manager, capacity)

        return __init__

    def _manager_built(self) -> None:
        """A V2 manager was built in this process (by this patch's wrapper or one on top of it)."""
        if self.on_manager_built is not None:
            self.on_manager_built()

    def _deactivate(self, reason: str) -> None:
        """Refuse for this and every later manager: the class goes back to stock.

        Called from ``__init__`` before the manager holds any plugin state, so there is nothing to remove.
        """
        self.uninstall()
        self.refuse(reason)

    def _announce(self, manager: Any, capacity: int) -> None:
        level = logging.DEBUG if self.announced else logging.INFO
        self.announced = True
        settings = self.settings
        descriptors = sum(len(d) for d in manager._capture_descs.values())
        if self.vllm_presizes:
            logger.log(
                level,
                "vllm-staging-plugin: vLLM sizes %s's staging buffers (%s) to the largest of its %d capture "
                "descriptors (%d rows) itself; the plugin leaves them to vLLM; capture order: %s",
                type(manager).__name__,
                ", ".join(STAGING_ATTRS),
                descriptors,
                capacity,
                settings.order,
            )
            return
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
            descriptors,
            settings.order,
        )

    def _wrap_capture(self, wrap: ClassWrap) -> Callable[..., Any]:
        original = wrap.stock["capture"]

        @plugin_wrapper(original)
        def capture(manager: Any, *args: Any, **kwargs: Any) -> Any:
            state = state_of(manager) if wrap.live else None
            if state is None:
                return original(manager, *args, **kwargs)
            settings = state.settings
            presizing = state.capacity is not None and not self.vllm_presizes
            if presizing:
                ensure_capacity(manager, state)
            marked = compat.profiling_pass(manager)
            profiling = marked is not False
            if marked is None and settings.order != DEFAULT_ORDER:
                self._unknown_profiling_mark()  # vLLM's order kept, pre-sizing goes on
            ordered = None  # this capture's descriptors in policy order; vLLM's own when None
            if not profiling and settings.order != DEFAULT_ORDER:  # profiling keeps vLLM's order
                ordered = self._policies().reordered(settings, manager._capture_descs)
                state.ranks_agreed = self._agreed().check_coupled_ranks(
                    settings, ordered, manager.vllm_config
                )
            receipt: Any = nullcontext()
            if settings.receipts_dir is not None:
                from .capture_session import receipt_session

                receipt = receipt_session(manager, state, profiling)
            with _in_order(manager, ordered), receipt:
                if not presizing:
                    return original(manager, *args, **kwargs)
                state.first_tokens = first_tokens(manager._capture_descs)
                try:
                    with self._staging(manager):
                        return original(manager, *args, **kwargs)
                finally:
                    if state.vllm_presized:
                        self._stand_down()

        return capture

    def _unknown_profiling_mark(self) -> None:
        """This vLLM marks its memory-profiling capture in no way the plugin knows: a reordered sample
        would under-reserve graph memory, so every capture keeps vLLM's order (strict mode: an error)."""
        reason = (
            f"this vLLM's manager has neither {compat.PROFILING_LIMIT} nor {compat.PROFILING_SAMPLE}, so "
            "the memory-profiling capture cannot be told from the real one"
        )
        if self.settings.strict:
            raise compat.IncompatibleVllm(f"vllm-staging-plugin (strict mode): {reason}")
        if self.order_refused:
            return
        self.order_refused = True
        logger.warning(
            "vllm-staging-plugin: %s; %s=%s is NOT applied (vLLM's own order); the staging buffers are "
            "still pre-sized. Set %s=1 to fail instead.",
            reason,
            ENV_ORDER,
            self.settings.order,
            ENV_STRICT,
        )

    def _stand_down(self) -> None:
        if self.vllm_presizes:
            return
        self.vllm_presizes = True
        logger.info(
            "vllm-staging-plugin: this vLLM already pre-sizes its CUDA-graph staging buffers to the largest "
            "capture descriptor; the plugin leaves them to vLLM (capture order: %s)",
            self.settings.order,
        )

    def _policies(self) -> PolicyRegistry:
        if self.policies is None:
            from .policies import PolicyRegistry

            self.policies = PolicyRegistry.load()  # a tool's patch; register() hands the engine its own
        return self.policies

    def _agreed(self) -> Agreement:
        if self._agreement is None:
            from .agreement import Agreement

            self._agreement = Agreement()
        return self._agreement

    def _staging(self, manager: Any) -> Any:
        names = tuple(name for name in STAGING_ATTRS if name in manager.__dict__)
        key = (type(manager), names)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = capture_view(type(manager), names)
        return intercepting(manager, view)


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
