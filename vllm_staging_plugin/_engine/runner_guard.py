"""Say so when vLLM picked the V1 model runner: the plugin then has nothing to act on.

The patch lives in Model Runner V2's ``ModelCudaGraphManager``. vLLM 0.33.0 falls back to the V1 runner
(``vllm.v1.worker.gpu_model_runner.GPUModelRunner``) for features V2 lacks or without Triton, and releases
before 0.29.0 run V2 only for some models or on request (``VLLM_USE_V2_MODEL_RUNNER=1``). Without this
guard the plugin would then be silently inactive and ``STAGING_PLUGIN_ORDER`` ignored. The guard wraps
only the runner's constructor and is removed as soon as a V2 manager is built in the process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT, Settings
from .wrapping import ClassWrap, plugin_wrapper

logger = logging.getLogger("vllm.staging_plugin")

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V1_RUNNER_CLASS = "GPUModelRunner"


class V1RunnerError(RuntimeError):
    """Strict mode: vLLM chose the V1 runner, where the plugin cannot act."""


class RunnerGuard:
    """The wrapper on the V1 runner's ``__init__``: one warning per process (strict mode: an error)."""

    def __init__(self, settings: Settings, on_v1_runner_built: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.on_v1_runner_built = on_v1_runner_built
        self.wrap: ClassWrap | None = None
        self.warned = False

    def message(self) -> str:
        order = self.settings.order
        ignored = f"{ENV_ORDER}={order}" if order != DEFAULT_ORDER else "pre-sizing"
        return (
            "vllm-staging-plugin is inactive in this worker: vLLM chose the V1 model runner "
            f"({V1_RUNNER_MODULE}.{V1_RUNNER_CLASS}), and the plugin acts only on Model Runner V2's "
            f"ModelCudaGraphManager, so {ignored} and receipts do not apply here. vLLM's log says why it "
            f"chose V1; VLLM_USE_V2_MODEL_RUNNER=1 asks for V2. Set {ENV_STRICT}=1 to fail instead."
        )

    def _v1_runner_built(self) -> None:
        if self.on_v1_runner_built is not None:
            self.on_v1_runner_built()

    def on_v1_runner(self) -> None:
        """A V1 runner is being built."""
        self._v1_runner_built()
        if self.settings.strict:
            raise V1RunnerError(self.message())
        if not self.warned:
            self.warned = True
            logger.warning(self.message())

    def install(self, module: ModuleType) -> None:
        """Wrap the V1 runner's ``__init__`` (once); never breaks the import of vLLM's module."""
        cls = getattr(module, V1_RUNNER_CLASS, None)
        if self.wrap is not None or not isinstance(cls, type) or "__init__" not in cls.__dict__:
            return
        try:
            self.wrap = self._wrap(cls)
        except Exception as exc:  # never break the import of vLLM's module
            if self.settings.strict:
                raise V1RunnerError(
                    f"vllm-staging-plugin (strict mode): cannot wrap {cls.__name__}: {exc}"
                ) from exc
            logger.warning(
                "vllm-staging-plugin: cannot watch for vLLM's V1 model runner (%s: %s); where vLLM picks it, "
                "the plugin is inactive without saying so. Set %s=1 to fail instead.",
                type(exc).__name__,
                exc,
                ENV_STRICT,
            )

    def _wrap(self, cls: type) -> ClassWrap:
        wrap = ClassWrap(cls, ("__init__",), signals={"__init__": self._v1_runner_built})
        original = wrap.stock["__init__"]

        @plugin_wrapper(original)
        def __init__(runner: Any, *args: Any, **kwargs: Any) -> None:
            # not the CPU/XPU runners that subclass it: no CUDA graphs to stage there
            if type(runner) is cls:
                if self.on_v1_runner_built is not None:  # an installer's guard: the ones it skips hear of it
                    wrap.signal("__init__")
                if wrap.live:
                    self.on_v1_runner()
            original(runner, *args, **kwargs)

        wrap.apply({"__init__": __init__})
        return wrap

    def uninstall(self) -> list[str]:
        wrap, self.wrap = self.wrap, None
        return wrap.restore() if wrap is not None else []
