"""Whether a class holds the plugin's wrappers, told the way a reader of the class would: a function that
wraps another (``functools.wraps`` sets ``__wrapped__``) and whose code lives in the plugin's package.
Torch-free, for the start-up children that check ``register()`` imports no torch."""

from __future__ import annotations

import os
from pathlib import Path

import vllm_staging_plugin

PACKAGE = str(Path(vllm_staging_plugin.__file__).parent) + os.sep  # the folder, not a sibling's prefix


def is_plugin_wrapper(function: object) -> bool:
    code = getattr(function, "__code__", None)
    return hasattr(function, "__wrapped__") and code is not None and code.co_filename.startswith(PACKAGE)


def is_patched(cls: type | None) -> bool:
    """Whether the staging fix's wrappers sit in ``cls``'s own ``__dict__``."""
    return cls is not None and any(is_plugin_wrapper(cls.__dict__.get(n)) for n in ("__init__", "capture"))
