"""vllm-staging-plugin: pre-size vLLM Model Runner V2 CUDA-graph staging buffers.

``register`` is the ``vllm.general_plugins`` entry point. :mod:`._engine` runs inside vLLM's processes,
:mod:`._offline` holds the operator's tools, :mod:`.hookspecs` the hooks for order-policy authors.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._engine.installer import Installer

__all__ = ["__version__", "register", "unregister"]

logger = logging.getLogger("vllm.staging_plugin")

_installed: Installer | None = None  # this process's installer: register() runs once per process


def register() -> None:
    """Entry point: read the plugin's variables once and install the fixes for this process.

    Imports neither torch nor vLLM. A bad ``STAGING_PLUGIN_*`` value raises ``ConfigError`` here, before
    any model loads (vLLM does not swallow it); nothing else raises unless strict mode is on.
    """
    global _installed
    if _installed is not None:
        return
    from ._engine.installer import Installer
    from ._engine.settings import DEFAULT_ORDER, read_settings

    settings = read_settings()  # ConfigError propagates: fail fast, naming the variable
    policies = None
    if settings.order != DEFAULT_ORDER and not settings.disabled:
        from ._engine.policies import PolicyRegistry

        policies = PolicyRegistry.load(settings.strict)
        policies.validate(settings)  # unknown policy or bad argument: ConfigError, before the model loads
    installer = Installer(settings, policies)
    try:
        installer.install()
    except Exception as exc:
        installer.uninstall()
        if settings.strict:
            raise
        logger.warning("vllm-staging-plugin could not register, vLLM runs unpatched: %s", exc)
        return
    _installed = installer


def suspended() -> AbstractContextManager[None]:
    """For the offline tools: the registered fixes off vLLM's classes for the block, then back."""
    return nullcontext() if _installed is None else _installed.suspended()


def unregister() -> None:
    """Undo :func:`register`: hooks, wrappers (only the plugin's own) and the Ray variable."""
    global _installed
    installer, _installed = _installed, None
    if installer is not None:
        installer.uninstall()


def __getattr__(name: str) -> str:
    """``__version__``, looked up only when asked (vLLM's processes never pay for it)."""
    if name == "__version__":
        from ._engine import plugin_version

        return plugin_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
