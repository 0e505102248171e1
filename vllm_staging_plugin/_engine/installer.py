"""One object owns every change the plugin makes to a process; :meth:`Installer.uninstall` is its inverse.

It starts each fix of :data:`.registry.FIXES` the settings enable and passes their events to one another.
The offline tools suspend it for a block (:meth:`suspended`) instead of stacking a second layer of wrappers.

Registry entries of its own two changes:

``sys.meta_path`` (one post-import hook per fix)
    Why: ``register()`` must not import torch or vLLM. How: each hook waits for its fix's module and
    leaves when it fires or its fix retires. Upstream PR: none. Removal: with the fixes.
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (only when a ``STAGING_PLUGIN_*`` variable is set)
    Why: vLLM's ``RayDistributedExecutor`` and data-parallel Ray backend copy only listed prefixes to Ray
    actors. How: ``STAGING_PLUGIN_`` appended, the operator's list put back exactly on uninstall.
    Upstream PR: none (vLLM's extension point). Removal: when every supported Ray path copies the
    environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from . import registry
from .fix import RuntimeFix
from .settings import DEFAULT_ORDER, ENV_ORDER, Settings

if TYPE_CHECKING:
    from .policies import PolicyRegistry

logger = logging.getLogger("vllm.staging_plugin")

RAY_PREFIXES_VARIABLE = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
PLUGIN_PREFIX = "STAGING_PLUGIN_"


class Installer:
    """The plugin's whole footprint in one process (forked children inherit it, spawned ones rebuild it)."""

    def __init__(
        self,
        settings: Settings,
        policies: PolicyRegistry | None = None,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.policies = policies
        self.environ: MutableMapping[str, str] = os.environ if environ is None else environ
        self.fixes: tuple[RuntimeFix, ...] = ()
        self.installed = False
        self._ray_before: tuple[str | None] | None = None  # the Ray variable before this installer listed it

    def install(self) -> None:
        """Start every fix the settings enable; imports neither torch nor vLLM. Disabled: the Ray variable."""
        if self.installed:
            return
        self.installed = True
        self._list_ray_prefix()
        if self.settings.disabled:
            if self.settings.order != DEFAULT_ORDER:
                logger.warning(
                    "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE); %s=%s is ignored "
                    "and vLLM captures in its own descending order",
                    ENV_ORDER,
                    self.settings.order,
                )
            return
        if not self.fixes:
            enabled = (fix for fix in registry.FIXES if fix.enabled(self.settings))
            self.fixes = tuple(fix(self.settings, self.notify, self.policies) for fix in enabled)
        for fix in self.fixes:
            fix.start()

    def uninstall(self) -> None:
        """Undo :meth:`install`; a wrapper another tool put on top stays, with one warning."""
        foreign = [name for fix in self.fixes for name in fix.uninstall()]
        if foreign:
            names = " and ".join(foreign)
            verb = "was wrapped" if len(foreign) == 1 else "were wrapped"
            logger.warning(
                "vllm-staging-plugin: %s %s by another tool after this plugin; that wrapper is left in "
                "place and the plugin's own, inside it, now passes every call straight to vLLM",
                names,
                verb,
            )
        self._restore_ray_prefix()
        self.installed = False

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """vLLM's classes as before :meth:`install` for the block, then the same wrappers again."""
        for fix in self.fixes:
            fix.suspend()
        try:
            yield
        finally:
            for fix in self.fixes:
                fix.resume()

    def notify(self, event: str) -> None:
        """A fix saw ``event`` in this process: the fixes it makes needless retire."""
        for fix in self.fixes:
            if event in fix.retired_by:
                fix.retire()

    def _list_ray_prefix(self) -> None:
        """Have vLLM's Ray executors copy ``STAGING_PLUGIN_*`` to their actors, as they copy ``VLLM_*``."""
        env = self.environ
        if not any(key.startswith(PLUGIN_PREFIX) for key in env):
            return
        previous = env.get(RAY_PREFIXES_VARIABLE)
        listed = [p.strip() for p in (previous or "").split(",") if p.strip()]
        if PLUGIN_PREFIX not in listed:
            env[RAY_PREFIXES_VARIABLE] = ",".join([*listed, PLUGIN_PREFIX])
            self._ray_before = (previous,)

    def _restore_ray_prefix(self) -> None:
        """Put back exactly the operator's list (nothing if this installer did not change it)."""
        before, self._ray_before = self._ray_before, None
        if before is None:
            return
        (previous,) = before
        if previous is None:
            self.environ.pop(RAY_PREFIXES_VARIABLE, None)
        else:
            self.environ[RAY_PREFIXES_VARIABLE] = previous
