"""vllm-staging-plugin: pre-size vLLM Model Runner V2 CUDA-graph staging buffers.

``register`` is the ``vllm.general_plugins`` entry point. It is import-light (no torch, no vLLM
import), idempotent, and never raises unless strict mode is on. The patch itself applies when vLLM
imports ``vllm.v1.worker.gpu.cudagraph_utils``; see :mod:`vllm_staging_plugin.patch`.
"""

from __future__ import annotations

import logging
from types import ModuleType

__version__ = "0.1.0"
__all__ = ["__version__", "register", "unregister"]

logger = logging.getLogger("vllm.staging_plugin")


def register() -> None:
    """Entry point: arrange for ``ModelCudaGraphManager`` to be patched in this process."""
    from .settings import DEFAULT_ORDER, ENV_ORDER, read_settings, strict_requested

    try:
        settings = read_settings()
    except Exception:
        # Left for the manager's construction, which fails start-up with the same clear error.
        settings = None
    try:
        if settings is not None and settings.disabled:
            if settings.order != DEFAULT_ORDER:
                logger.warning(
                    "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE); %s=%s is ignored "
                    "and vLLM captures in its own descending order",
                    ENV_ORDER,
                    settings.order,
                )
            return
        from . import compat
        from .import_hook import when_imported

        when_imported(compat.CUDAGRAPH_MODULE, _patch_module)
    except Exception as exc:
        if strict_requested():
            raise
        logger.warning("vllm-staging-plugin could not register, vLLM runs unpatched: %s", exc)


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

    from . import compat
    from .import_hook import remove_hooks

    remove_hooks(compat.CUDAGRAPH_MODULE)
    module = sys.modules.get(compat.CUDAGRAPH_MODULE)
    cls = getattr(module, compat.MANAGER_CLASS, None) if module else None
    if isinstance(cls, type):
        from .patch import unpatch

        unpatch(cls)
