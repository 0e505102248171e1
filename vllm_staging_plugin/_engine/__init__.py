"""The engine room: everything ``register()`` brings into a vLLM process.

It never imports the offline tools nor the package root. With no ``STAGING_PLUGIN_*`` variable set it
pre-sizes and does nothing else (docs/design.md, "What runs in a worker under each setting"). The fixes
share one base (:mod:`.fix`), :mod:`.installer` starts them, :mod:`.compat` is the one door to vLLM.
"""

from __future__ import annotations

UNKNOWN_VERSION = "0+unknown"  # a vendored copy: a valid version that says it is not known


def plugin_version() -> str:
    """The installed package's version, else the source tree's ``pyproject.toml``, else unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-staging-plugin")
    except PackageNotFoundError:
        return _source_tree_version()


def _source_tree_version() -> str:
    """By pattern: ``tomllib`` is not in Python 3.10."""
    import re
    from pathlib import Path

    try:
        text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    except (OSError, UnicodeDecodeError):
        return UNKNOWN_VERSION
    if not re.search(r'^name = "vllm-staging-plugin"$', text, re.M):
        return UNKNOWN_VERSION
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    return found.group(1) if found else UNKNOWN_VERSION
