"""vllm-staging-plugin: pre-size vLLM Model Runner V2 CUDA-graph staging buffers.

``register`` is the ``vllm.general_plugins`` entry point. It is import-light (no torch, no vLLM
import) and idempotent; it raises only for a bad ``STAGING_PLUGIN_*`` value (or in strict mode).
The patch itself applies when vLLM imports ``vllm.v1.worker.gpu.cudagraph_utils``; see
:mod:`vllm_staging_plugin.patch`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from types import ModuleType

__version__ = "0.1.0"
__all__ = ["__version__", "register", "unregister"]

logger = logging.getLogger("vllm.staging_plugin")


def register() -> None:
    """Entry point: arrange for ``ModelCudaGraphManager`` to be patched in this process.

    A bad ``STAGING_PLUGIN_*`` value raises :class:`~vllm_staging_plugin.settings.ConfigError` here, the
    earliest point of start-up (vLLM calls ``register()`` in the front end before any model loads, and does
    not swallow its exceptions). Nothing else raises unless strict mode is on: an unsupported vLLM leaves
    vLLM untouched with one warning.
    """
    from .settings import DEFAULT_ORDER, ENV_ORDER, read_settings, strict_requested

    settings = read_settings()  # ConfigError propagates: fail fast, naming the variable
    if settings.order != DEFAULT_ORDER and not settings.disabled:
        from .policies import validate_order

        validate_order(settings)  # unknown policy or bad argument: ConfigError, before the model loads
    forward_to_ray_workers()
    if settings.disabled:
        if settings.order != DEFAULT_ORDER:
            logger.warning(
                "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE); %s=%s is ignored "
                "and vLLM captures in its own descending order",
                ENV_ORDER,
                settings.order,
            )
        return
    try:
        from . import compat, runner_guard
        from .import_hook import when_imported

        when_imported(compat.CUDAGRAPH_MODULE, _patch_module)
        when_imported(runner_guard.V1_RUNNER_MODULE, runner_guard.guard)
    except Exception as exc:
        if strict_requested():
            raise
        logger.warning("vllm-staging-plugin could not register, vLLM runs unpatched: %s", exc)


RAY_PREFIXES_VARIABLE = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
PLUGIN_PREFIX = "STAGING_PLUGIN_"


def forward_to_ray_workers(environ: MutableMapping[str, str] | None = None) -> None:
    """Have vLLM's Ray executor copy ``STAGING_PLUGIN_*`` to its workers, as it copies ``VLLM_*``.

    vLLM forwards to Ray actors only its own variables and the prefixes listed in
    ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (additive); on a cluster started separately a worker would
    otherwise never see the order and could capture differently from its peers. Set only when a plugin
    variable is set, and inherited by the engine-core process that creates the Ray workers.
    """
    env = os.environ if environ is None else environ
    if not any(key.startswith(PLUGIN_PREFIX) for key in env):
        return
    listed = [p.strip() for p in env.get(RAY_PREFIXES_VARIABLE, "").split(",") if p.strip()]
    if PLUGIN_PREFIX not in listed:
        env[RAY_PREFIXES_VARIABLE] = ",".join([*listed, PLUGIN_PREFIX])


def _patch_module(module: ModuleType) -> None:
    """Called once ``cudagraph_utils`` is imported: check the structure and platform, then patch."""
    from . import compat, patch

    try:
        cls = compat.manager_class(module)
        compat.check_platform()
    except compat.IncompatibleVllm as exc:
        patch.refuse(str(exc))
        return
    except Exception as exc:  # never break the import of vLLM's module
        patch.refuse(f"{type(exc).__name__}: {exc}")
        return
    patch.patch(cls)


def unregister() -> None:
    """Undo :func:`register`: drop the import hook and restore the class if it was patched."""
    import sys

    from . import compat, runner_guard
    from .import_hook import remove_hooks

    remove_hooks(compat.CUDAGRAPH_MODULE)
    remove_hooks(runner_guard.V1_RUNNER_MODULE)
    runner_guard.unguard(sys.modules.get(runner_guard.V1_RUNNER_MODULE))
    module = sys.modules.get(compat.CUDAGRAPH_MODULE)
    cls = getattr(module, compat.MANAGER_CLASS, None) if module else None
    if isinstance(cls, type):
        from .patch import unpatch

        unpatch(cls)
