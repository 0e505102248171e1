"""The engine room: everything ``register()`` brings into a vLLM process (front end, engine core, workers).

Rules for this subpackage (tested in ``tests/test_engine_footprint.py``):

* it never imports :mod:`vllm_staging_plugin._offline` (the operator's tools) nor the package root;
* with no ``STAGING_PLUGIN_*`` variable set it pre-sizes and does nothing else: no store round-trip, no
  collective, no pluggy, no receipt, no NVML, nothing written, no hook left once it has fired;
* :mod:`.policies` (pluggy), :mod:`.agreement` and the receipt modules are imported only when the variable
  that asks for them is set; :mod:`.staging` (torch) only once vLLM imported its graph module.

The fixes (:mod:`.staging_fix`, :mod:`.kda_fix`, :mod:`.runner_guard`) share one base (:mod:`.fix`);
:mod:`.installer` starts them; :mod:`.compat` is the one door to vLLM's privates.
"""

from __future__ import annotations

UNKNOWN_VERSION = "0+unknown"
"""The version of a copy with neither install metadata nor a ``pyproject.toml`` beside it (a vendored
copy): a valid version that says it is not known, so receipts and ``--version`` never fail for it."""


def plugin_version() -> str:
    """The installed package's version, else the ``pyproject.toml`` of the source tree this package sits in
    (the source on ``PYTHONPATH``), else :data:`UNKNOWN_VERSION`. pyproject.toml is where it is written."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-staging-plugin")
    except PackageNotFoundError:
        return _source_tree_version()


def _source_tree_version() -> str:
    """The version in ``../../pyproject.toml`` when it is this project's (read by pattern: ``tomllib`` is
    not in Python 3.10)."""
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
