"""One object owns every change the plugin makes to a process; :meth:`Installer.uninstall` is its inverse.

The changes, all listed in the patch registry of :mod:`.patch`: two import hooks (taken off
``sys.meta_path`` as soon as they fire, or as soon as the worker's runner shows they never will), the
wrappers on ``ModelCudaGraphManager`` and on the V1 ``GPUModelRunner``, and the Ray prefix variable.
Restoring puts back only the plugin's own wrappers: one that another tool has since wrapped is left in
place, its inner plugin wrapper made a pass-through, with one warning (OpenTelemetry's ``unwrap`` would
remove whichever proxy is on top).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .compat import CUDAGRAPH_MODULE
from .import_hook import pending, remove_hooks, when_imported

logger = logging.getLogger("vllm.staging_plugin")

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RAY_PREFIXES_VARIABLE = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
PLUGIN_PREFIX = "STAGING_PLUGIN_"


@dataclass
class Wrapped:
    """One class the plugin wrapped: what its ``__dict__`` held before, and what the plugin put there."""

    originals: dict[str, Any]
    wrappers: dict[str, Any] = field(default_factory=dict)
    live: bool = True  # False once unwrapped: a wrapper still reachable through a foreign one passes through
    views: dict[tuple[type, tuple[str, ...]], type] = field(default_factory=dict)  # capture-time subclasses


class Installer:
    """The plugin's whole footprint in one process (forked children inherit it, spawned ones rebuild it)."""

    def __init__(self) -> None:
        self.classes: dict[type, Wrapped] = {}
        self._ray_before: tuple[str | None] | None = None  # (previous value,) once we changed the variable
        self.refused = False  # the one "inactive" warning of this process was given
        self.announced = False  # the first manager is logged at INFO, later ones at DEBUG
        self.v1_warned = False
        self.foreign_warned = False
        self.agreement_rounds: dict[str, int] = {}

    # -- register() / unregister() -------------------------------------------------------------------

    def install(self) -> None:
        """Arrange for the patch; imports neither torch nor vLLM."""
        self.forward_to_ray_workers()
        when_imported(CUDAGRAPH_MODULE, self._on_cudagraph_module)
        when_imported(V1_RUNNER_MODULE, self._on_v1_runner_module)

    def uninstall(self) -> None:
        """Undo :meth:`install` and what its hooks did to classes, ``sys.meta_path`` and the environment.

        The per-process flags and agreement rounds stay (peers keep counting), as does built managers' state.
        """
        remove_hooks(CUDAGRAPH_MODULE)
        remove_hooks(V1_RUNNER_MODULE)
        for cls in list(self.classes):
            self.unwrap(cls)
        self.restore_ray_variable()

    def _on_cudagraph_module(self, module: ModuleType) -> None:
        from .patch import patch_module

        patch_module(module)

    def _on_v1_runner_module(self, module: ModuleType) -> None:
        from .runner_guard import guard

        guard(module)

    def model_runner_v2_chosen(self) -> None:
        """A manager was built: this worker runs Model Runner V2, so the V1 guard has nothing to do."""
        hook = pending(V1_RUNNER_MODULE)
        if hook is not None:
            hook.remove()
        for cls in [c for c in self.classes if c.__module__ == V1_RUNNER_MODULE]:
            self.unwrap(cls)

    def model_runner_v1_chosen(self) -> None:
        """A V1 runner was built: no manager will be, so the patch's import hook goes."""
        hook = pending(CUDAGRAPH_MODULE)
        if hook is not None:
            hook.remove()

    # -- class wrappers -------------------------------------------------------------------------------

    def wrap(self, cls: type, names: tuple[str, ...], make: Callable[[Wrapped], dict[str, Any]]) -> bool:
        """Replace ``names`` in ``cls.__dict__`` with ``make(record)``'s wrappers; False if already done.

        ``make`` gets the record holding the originals, and each wrapper checks ``record.live``.
        """
        if cls in self.classes:
            return False
        record = Wrapped(originals={name: cls.__dict__[name] for name in names})
        wrappers = make(record)
        for name, wrapper in wrappers.items():
            setattr(cls, name, wrapper)
        record.wrappers = wrappers
        self.classes[cls] = record
        return True

    def unwrap(self, cls: type) -> bool:
        """Put back what ``cls`` held before the plugin; False if it was not wrapped."""
        record = self.classes.pop(cls, None)
        if record is None:
            return False
        record.live = False
        for name, original in record.originals.items():
            if cls.__dict__.get(name) is record.wrappers[name]:
                setattr(cls, name, original)
            else:
                self._foreign(cls, name)
        return True

    def _foreign(self, cls: type, name: str) -> None:
        if not self.foreign_warned:
            self.foreign_warned = True
            logger.warning(
                "vllm-staging-plugin: %s.%s was wrapped by another tool after this plugin; that wrapper is "
                "left in place and the plugin's own, inside it, now passes every call straight to vLLM",
                cls.__qualname__,
                name,
            )

    def record_for(self, obj: object) -> tuple[type, Wrapped] | None:
        """The wrapped class ``obj`` is an instance of (its own class or a base), and its record."""
        for cls in type(obj).__mro__:
            record = self.classes.get(cls)
            if record is not None:
                return cls, record
        return None

    # -- Ray ------------------------------------------------------------------------------------------

    def forward_to_ray_workers(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Have vLLM's Ray executors copy ``STAGING_PLUGIN_*`` to their actors, as they copy ``VLLM_*``.

        vLLM's legacy Ray executor and its data-parallel Ray backend forward only vLLM's own variables
        and the prefixes listed in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (additive). Changed only
        when a plugin variable is set; the engine-core process that creates the actors inherits it.
        """
        env = os.environ if environ is None else environ
        if not any(key.startswith(PLUGIN_PREFIX) for key in env):
            return
        previous = env.get(RAY_PREFIXES_VARIABLE)
        listed = [p.strip() for p in (previous or "").split(",") if p.strip()]
        if PLUGIN_PREFIX in listed:
            return
        env[RAY_PREFIXES_VARIABLE] = ",".join([*listed, PLUGIN_PREFIX])
        if environ is None and self._ray_before is None:
            self._ray_before = (previous,)

    def restore_ray_variable(self) -> None:
        if self._ray_before is None:
            return
        (previous,) = self._ray_before
        self._ray_before = None
        if previous is None:
            os.environ.pop(RAY_PREFIXES_VARIABLE, None)
        else:
            os.environ[RAY_PREFIXES_VARIABLE] = previous


INSTALLER = Installer()
