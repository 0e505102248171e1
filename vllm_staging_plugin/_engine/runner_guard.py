"""The V1 runner guard: say so when vLLM picked the V1 model runner, where the plugin has nothing to act on.

Registry entry (vllm-ascend's fields):

``vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__`` (wrapped)
    Why: the staging fix lives in Model Runner V2. Where vLLM picks the V1 runner the plugin would be
    silently inactive and ``STAGING_PLUGIN_ORDER`` ignored.
    How: one warning when a V1 runner is built (strict mode: an error); the wrapper goes once a V2
    manager is built. Upstream PR: none. Removal: when no supported release has the V1 runner.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .fix import V1_RUNNER_BUILT, V2_MANAGER_BUILT, ClassWrap, Once, RuntimeFix
from .settings import DEFAULT_ORDER, ENV_ORDER, ENV_STRICT

logger = logging.getLogger("vllm.staging_plugin")

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V1_RUNNER_CLASS = "GPUModelRunner"


class V1RunnerError(RuntimeError):
    """Strict mode: vLLM chose the V1 runner, where the plugin cannot act."""


class V1RunnerGuard(RuntimeFix):
    """The wrapper on the V1 runner's ``__init__``: one warning per process (strict mode: an error)."""

    module = V1_RUNNER_MODULE
    target = V1_RUNNER_CLASS
    methods = ("__init__",)
    error = V1RunnerError
    retired_by = frozenset({V2_MANAGER_BUILT})

    @functools.cached_property
    def warned(self) -> Once:
        """The warning, once per process."""
        return Once()

    def find(self, module: ModuleType) -> type | None:
        cls = getattr(module, V1_RUNNER_CLASS, None)
        return cls if isinstance(cls, type) and "__init__" in cls.__dict__ else None

    def retire(self) -> None:
        """A V2 manager was built: this worker is V2."""
        self.uninstall()

    def refusal(self, reason: str) -> str:
        return (
            f"vllm-staging-plugin: cannot watch for vLLM's V1 model runner ({reason}); where vLLM picks "
            f"it, the plugin is inactive without saying so. Set {ENV_STRICT}=1 to fail instead."
        )

    def message(self) -> str:
        order = self.settings.order
        ignored = f"{ENV_ORDER}={order}" if order != DEFAULT_ORDER else "pre-sizing"
        return (
            "vllm-staging-plugin is inactive in this worker: vLLM chose the V1 model runner "
            f"({V1_RUNNER_MODULE}.{V1_RUNNER_CLASS}), and the plugin acts only on Model Runner V2's "
            f"ModelCudaGraphManager, so {ignored} and receipts do not apply here. vLLM's log says why it "
            f"chose V1; VLLM_USE_V2_MODEL_RUNNER=1 asks for V2. Set {ENV_STRICT}=1 to fail instead."
        )

    def on_v1_runner(self) -> None:
        """A V1 runner is being built."""
        self.notify(V1_RUNNER_BUILT)
        if self.settings.strict:
            raise V1RunnerError(self.message())
        if self.warned():
            logger.warning(self.message())

    def wrappers(self, wrap: ClassWrap) -> dict[str, Callable[..., Any]]:
        cls, original = wrap.cls, wrap.original["__init__"]

        @functools.wraps(original)
        def __init__(runner: Any, *args: Any, **kwargs: Any) -> None:
            # not the CPU/XPU runners that subclass it: no CUDA graphs to stage there
            if type(runner) is cls and wrap.live:
                self.on_v1_runner()
            original(runner, *args, **kwargs)

        return {"__init__": __init__}
