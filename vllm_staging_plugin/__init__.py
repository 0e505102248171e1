"""vllm-staging-plugin: pre-size vLLM Model Runner V2 CUDA-graph staging buffers.

``register`` is the ``vllm.general_plugins`` entry point. It is import-light (no torch, no vLLM import)
and idempotent; it raises only for a bad ``STAGING_PLUGIN_*`` value (or in strict mode). The patch
applies when vLLM imports ``vllm.v1.worker.gpu.cudagraph_utils``.

Layout: :mod:`._engine` is what runs inside vLLM's processes, :mod:`._offline` the operator's tools (CLI,
pre-flight, CPU replay, report), :mod:`.hookspecs` the public hooks for order-policy authors. The engine
part never imports the offline part.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"
__all__ = ["__version__", "register", "unregister"]

logger = logging.getLogger("vllm.staging_plugin")


def register() -> None:
    """Entry point: arrange for ``ModelCudaGraphManager`` to be patched in this process.

    A bad ``STAGING_PLUGIN_*`` value raises :class:`~vllm_staging_plugin._engine.settings.ConfigError`
    here, the earliest point of start-up (vLLM calls ``register()`` in the front end before any model
    loads, and does not swallow its exceptions). Nothing else raises unless strict mode is on.
    """
    from ._engine.settings import DEFAULT_ORDER, ENV_ORDER, read_settings, strict_requested

    settings = read_settings()  # ConfigError propagates: fail fast, naming the variable
    if settings.order != DEFAULT_ORDER and not settings.disabled:
        from ._engine.policies import validate_order

        validate_order(settings)  # unknown policy or bad argument: ConfigError, before the model loads
    from ._engine.installer import INSTALLER

    if settings.disabled:
        INSTALLER.forward_to_ray_workers()  # Ray actors must see the kill switch too
        if settings.order != DEFAULT_ORDER:
            logger.warning(
                "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE); %s=%s is ignored "
                "and vLLM captures in its own descending order",
                ENV_ORDER,
                settings.order,
            )
        return
    try:
        INSTALLER.install()
    except Exception as exc:
        if strict_requested():
            raise
        logger.warning("vllm-staging-plugin could not register, vLLM runs unpatched: %s", exc)


def unregister() -> None:
    """Undo :func:`register`: hooks, wrappers (only the plugin's own) and the Ray variable."""
    from ._engine.installer import INSTALLER

    INSTALLER.uninstall()
