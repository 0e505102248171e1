"""The staging fix: ``ModelCudaGraphManager``'s staging buffers hold the largest capture descriptor.

Registry entry (vllm-ascend's fields):

``vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager.__init__`` and ``.capture`` (wrapped)
    Why: vLLM allocates the staging buffers lazily with the rows of the first capture output, so a
    capture whose first descriptor is not the largest crashes at the staging copy (in vLLM's own order
    too under recover-SSM with speculative decoding).
    How: ``__init__`` checks the structure (:mod:`.compat`) and records the capacity, the largest
    ``num_tokens``, allocating nothing. ``capture`` reorders the real capture under a non-default
    ``STAGING_PLUGIN_ORDER`` once coupled ranks agree (:mod:`.agreement`), writes a receipt if asked
    (:mod:`.capture_session`) and grows vLLM's first short output (:mod:`.staging`). Where vLLM sizes
    the staging itself it stands down with one INFO line; the order knob and receipts keep working.
    Upstream PR: vllm-project/vllm#47925 (closed unmerged); ``patches/presize-staging-buffers.patch``, with
    its regression test ``lab/upstream/test_cudagraph_presize.py``.
    Removal: once no supported release allocates lazily; the order knob then needs an upstream hook.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from . import compat
from .fix import V1_RUNNER_BUILT, V2_MANAGER_BUILT, ClassWrap, Notify, Once, RuntimeFix
from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT, Settings
from .sizing import staging_capacity

if TYPE_CHECKING:
    from .policies import PolicyRegistry

logger = logging.getLogger("vllm.staging_plugin")


class StagingFix(RuntimeFix):
    """The wrappers on ``ModelCudaGraphManager`` for one :class:`Settings`, and what they learnt."""

    module = compat.CUDAGRAPH_MODULE
    target = compat.MANAGER_CLASS
    methods = ("__init__", "capture")
    error = compat.IncompatibleVllm
    retired_by = frozenset({V1_RUNNER_BUILT})

    def __init__(
        self, settings: Settings, notify: Notify | None = None, policies: PolicyRegistry | None = None
    ) -> None:
        super().__init__(settings, notify, policies)
        self.vllm_sizes_staging = False  # vLLM sizes its staging itself: its release shape, or seen doing so
        self._views: dict[tuple[type, tuple[str, ...]], type] = {}
        self.announced, self.order_refused = Once(), Once()

    def find(self, module: Any) -> type:
        return compat.manager_class(module)

    def check(self) -> None:
        compat.check_platform()

    def apply(self, cls: type) -> bool:
        self.vllm_sizes_staging = compat.release_shape(cls).vllm_sizes_staging or self.vllm_sizes_staging
        applied = super().apply(cls)
        if applied:
            logger.debug("patched %s.%s (__init__, capture)", cls.__module__, cls.__name__)
        return applied

    def refusal(self, reason: str) -> str:
        order = self.settings.order
        ignored = f" {ENV_ORDER}={order} is NOT applied." if order != DEFAULT_ORDER else ""
        return (
            "vllm-staging-plugin is inactive, vLLM runs unpatched (its own staging buffers and capture "
            f"order): {reason}.{ignored} Set {ENV_STRICT}=1 to fail instead."
        )

    def wrappers(self, wrap: ClassWrap) -> dict[str, Callable[..., Any]]:
        return {"__init__": self._wrap_init(wrap), "capture": self._wrap_capture(wrap)}

    # -- the wrappers -------------------------------------------------------------------------------

    def _wrap_init(self, wrap: ClassWrap) -> Callable[..., None]:
        from . import staging  # torch: imported once vLLM imported its module, never at register()

        original = wrap.original["__init__"]

        @functools.wraps(original)
        def __init__(manager: Any, *args: Any, **kwargs: Any) -> None:
            original(manager, *args, **kwargs)
            if not wrap.live:
                return
            self.notify(V2_MANAGER_BUILT)
            try:
                compat.check_manager(manager)
                capacity = staging_capacity(compat.capture_descs(manager))
            except Exception as exc:  # renamed internals, odd descriptors: stay stock
                self._deactivate(f"{type(exc).__name__}: {exc}")
                return
            presizing = self.settings.presize == "on" and not self.vllm_sizes_staging
            manager.__dict__[staging.STATE_ATTR] = staging.ManagerState(
                self.settings, capacity if presizing else None, vllm_sizes_staging=self.vllm_sizes_staging
            )
            self._announce(manager, capacity)

        return __init__

    def _deactivate(self, reason: str) -> None:
        """Refuse for this and every later manager: the class goes back to stock."""
        self.uninstall()
        self.refuse(reason)

    def _announce(self, manager: Any, capacity: int) -> None:
        level = logging.INFO if self.announced() else logging.DEBUG
        if self.vllm_sizes_staging:
            said = _sizes_itself(manager)
        else:
            presize = self.settings.presize
            sizing = (
                f"sized to {capacity} rows, the largest"
                if presize == "on"
                else f"left to vLLM's lazy sizing ({presize}; largest is {capacity} rows)"
            )
            descriptors = sum(len(d) for d in compat.capture_descs(manager).values())
            said = (
                f"{type(manager).__name__} staging buffers ({_names()}) {sizing} of {descriptors} "
                "capture descriptors"
            )
        logger.log(level, "vllm-staging-plugin: %s; capture order: %s", said, self.settings.order)

    def _wrap_capture(self, wrap: ClassWrap) -> Callable[..., Any]:
        from . import staging

        original = wrap.original["capture"]

        @functools.wraps(original)
        def capture(manager: Any, *args: Any, **kwargs: Any) -> Any:
            state = staging.state_of(manager) if wrap.live else None
            if state is None:
                return original(manager, *args, **kwargs)
            settings = state.settings
            presizing = state.capacity is not None and not self.vllm_sizes_staging
            marked = compat.profiling_pass(manager)
            profiling = marked is not False
            if marked is None and settings.order != DEFAULT_ORDER:
                self._unknown_profiling_mark()  # vLLM's order kept, pre-sizing goes on
            in_order: Any = nullcontext()  # vLLM's own order
            if not profiling and settings.order != DEFAULT_ORDER:  # profiling keeps vLLM's order
                ordered = self._policies().reordered(settings, compat.capture_descs(manager))
                from .agreement import check_coupled_ranks  # torch.distributed: only for an order

                state.ranks_agreed = check_coupled_ranks(settings, ordered, manager.vllm_config)
                in_order = staging.swapped(manager, compat.CAPTURE_DESCS, ordered)
            receipt: Any = nullcontext()
            if settings.receipts_dir is not None:
                from .capture_session import receipt_session

                receipt = receipt_session(manager, state, profiling)
            with in_order, receipt:
                if not presizing:
                    return original(manager, *args, **kwargs)
                state.first_tokens = staging.first_tokens(compat.capture_descs(manager))
                try:
                    with self._staging(manager):
                        return original(manager, *args, **kwargs)
                finally:
                    if state.vllm_sizes_staging:
                        self._stand_down(manager)

        return capture

    def _unknown_profiling_mark(self) -> None:
        """No known mark tells vLLM's profiling capture apart: a reordered sample would under-reserve."""
        reason = (
            f"this vLLM's manager has neither {compat.PROFILING_LIMIT} nor {compat.PROFILING_SAMPLE}, so "
            "the memory-profiling capture cannot be told from the real one"
        )
        self.refuse(
            reason,
            f"vllm-staging-plugin: {reason}; {ENV_ORDER}={self.settings.order} is NOT applied (vLLM's own "
            f"order); the staging buffers are still pre-sized. Set {ENV_STRICT}=1 to fail instead.",
            self.order_refused,
        )

    def _stand_down(self, manager: Any) -> None:
        """vLLM sized its first buffer by the largest descriptor itself (a release of the lazy shape that
        does it anyway, such as one carrying the presize patch): the same line as a known release's."""
        self.vllm_sizes_staging = True
        logger.info("vllm-staging-plugin: %s; capture order: %s", _sizes_itself(manager), self.settings.order)

    def _policies(self) -> PolicyRegistry:
        if self.policies is None:
            from .policies import PolicyRegistry

            self.policies = PolicyRegistry.load()  # a tool's patch; register() hands the engine its own
        return self.policies

    def _staging(self, manager: Any) -> Any:
        from .staging import capture_view, swapped

        names = tuple(name for name in compat.STAGING_INITIAL if name in manager.__dict__)
        key = (type(manager), names)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = capture_view(type(manager), names)
        return swapped(manager, "__class__", view)


def _names() -> str:
    return ", ".join(compat.STAGING_INITIAL)


def _sizes_itself(manager: Any) -> str:
    """The stand-down's one wording, in the log and the docs."""
    plan = compat.capture_descs(manager)
    return (
        f"vLLM sizes {type(manager).__name__}'s staging buffers ({_names()}) to the largest of its "
        f"{sum(len(d) for d in plan.values())} capture descriptors ({staging_capacity(plan)} rows) itself; "
        "the plugin leaves them to vLLM"
    )
