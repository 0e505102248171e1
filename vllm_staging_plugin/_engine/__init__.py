"""The engine room: everything ``register()`` brings into a vLLM process.

It never imports the offline tools nor the package root. With no ``STAGING_PLUGIN_*`` variable set it
pre-sizes and does nothing else (docs/design.md, "What runs in a worker under each setting"). The fixes
share one base (:mod:`.fix`), :mod:`.installer` starts them, :mod:`.compat` names every vLLM or torch
private the engine touches (the offline seams import those names).
"""

from __future__ import annotations

UNKNOWN_VERSION = "0+unknown"  # not installed (a vendored copy): a valid version that says it is not known


def plugin_version() -> str:
    """The installed package's version; vLLM discovers the plugin only when it is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-staging-plugin")
    except PackageNotFoundError:
        return UNKNOWN_VERSION
