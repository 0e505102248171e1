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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._engine.installer import Installer

__all__ = ["__version__", "register", "unregister"]

logger = logging.getLogger("vllm.staging_plugin")

_installed: Installer | None = None
"""This process's installer, set by :func:`register` (vLLM calls it once per process; later calls
find it here and do nothing) and cleared by :func:`unregister`."""


def register() -> None:
    """Entry point: read the plugin's variables once and install the patch for this process.

    A bad ``STAGING_PLUGIN_*`` value raises :class:`~vllm_staging_plugin._engine.settings.ConfigError`
    here, the earliest point of start-up (vLLM calls ``register()`` in the front end before any model
    loads, and does not swallow its exceptions). Nothing else raises unless strict mode is on.
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


def unregister() -> None:
    """Undo :func:`register`: hooks, wrappers (only the plugin's own) and the Ray variable."""
    global _installed
    installer, _installed = _installed, None
    if installer is not None:
        installer.uninstall()


UNKNOWN_VERSION = "0+unknown"
"""``__version__`` of a copy with neither install metadata nor a ``pyproject.toml`` beside it (a vendored
copy): a valid version that says it is not known, so receipts and ``--version`` never fail for it."""


def __getattr__(name: str) -> str:
    """``__version__``, looked up only when asked (vLLM's processes never pay for it): the installed
    package's metadata, else the ``pyproject.toml`` of the source tree this package sits in (the source
    on ``PYTHONPATH``), else :data:`UNKNOWN_VERSION`. pyproject.toml is the one place it is written."""
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("vllm-staging-plugin")
        except PackageNotFoundError:
            return _source_tree_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _source_tree_version() -> str:
    """The version in ``../pyproject.toml`` when it is this project's, else :data:`UNKNOWN_VERSION`
    (read by pattern: ``tomllib`` is not in Python 3.10)."""
    import re
    from pathlib import Path

    try:
        text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    except (OSError, UnicodeDecodeError):
        return UNKNOWN_VERSION
    if not re.search(r'^name = "vllm-staging-plugin"$', text, re.M):
        return UNKNOWN_VERSION
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    return found.group(1) if found else UNKNOWN_VERSION
