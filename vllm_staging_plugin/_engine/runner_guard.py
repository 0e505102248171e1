"""Say so when vLLM picked the V1 model runner: the plugin then has nothing to act on.

The patch lives in Model Runner V2's ``ModelCudaGraphManager``. vLLM 0.33.0 falls back to the V1 runner
(``vllm.v1.worker.gpu_model_runner.GPUModelRunner``) for features V2 lacks or without Triton, and releases
before 0.29.0 run V2 only for some models or on request (``VLLM_USE_V2_MODEL_RUNNER=1``). Without this
guard the plugin would then be silently inactive and ``STAGING_PLUGIN_ORDER`` ignored. The guard wraps
only the runner's constructor and is removed as soon as a V2 manager is built in the process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .installer import INSTALLER, V1_RUNNER_MODULE, Wrapped
from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT, read_settings

logger = logging.getLogger("vllm.staging_plugin")

V1_RUNNER_CLASS = "GPUModelRunner"


class V1RunnerError(RuntimeError):
    """Strict mode: vLLM chose the V1 runner, where the plugin cannot act."""


def message() -> str:
    settings = read_settings()
    ignored = f"{ENV_ORDER}={settings.order}" if settings.order != DEFAULT_ORDER else "pre-sizing"
    return (
        "vllm-staging-plugin is inactive in this worker: vLLM chose the V1 model runner "
        f"({V1_RUNNER_MODULE}.{V1_RUNNER_CLASS}), and the plugin acts only on Model Runner V2's "
        f"ModelCudaGraphManager, so {ignored} and receipts do not apply here. vLLM's log says why it chose "
        f"V1; VLLM_USE_V2_MODEL_RUNNER=1 asks for V2. Set {ENV_STRICT}=1 to fail instead."
    )


def on_v1_runner() -> None:
    """Called when a V1 runner is built: one warning per process, or an error in strict mode."""
    settings = read_settings()
    if settings.disabled:
        return
    INSTALLER.model_runner_v1_chosen()
    if settings.strict:
        raise V1RunnerError(message())
    if not INSTALLER.v1_warned:
        INSTALLER.v1_warned = True
        logger.warning(message())


def guard(module: ModuleType) -> None:
    """Wrap the V1 runner's ``__init__`` (idempotent); never breaks the import of vLLM's module."""
    cls = getattr(module, V1_RUNNER_CLASS, None)
    if not isinstance(cls, type) or "__init__" not in cls.__dict__:
        return

    def make(record: Wrapped) -> dict[str, Any]:
        original: Callable[..., None] = record.originals["__init__"]

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            # not the CPU/XPU runners that subclass it: no CUDA graphs to stage there
            if record.live and type(self) is cls:
                on_v1_runner()
            original(self, *args, **kwargs)

        return {"__init__": __init__}

    INSTALLER.wrap(cls, ("__init__",), make)
