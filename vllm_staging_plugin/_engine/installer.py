"""One object owns every change the plugin makes to a process; :meth:`Installer.uninstall` is its inverse.

``register()`` builds it from the process's :class:`~.settings.Settings`. It starts each fix of
:data:`FIXES` the settings enable, passes the fixes' events to one another (a worker that built a V2 manager
needs no V1 guard, and one that built a V1 runner no staging hook), and lists ``STAGING_PLUGIN_`` for
vLLM's Ray actors. The offline tools suspend it for a block (:meth:`suspended`) instead of stacking a
second layer of wrappers on vLLM's classes.

Registry entries of its own two changes:

``sys.meta_path`` (one post-import hook per fix, :meth:`.fix.RuntimeFix.start`)
    Why: ``register()`` must not import torch or vLLM. How: each hook waits for its fix's module and
    leaves when it fires or its fix retires. Upstream PR: none. Removal: with the fixes.
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (only when a ``STAGING_PLUGIN_*`` variable is set)
    Why: vLLM's Ray executor and data-parallel Ray backend copy only listed prefixes to Ray actors. How:
    ``STAGING_PLUGIN_`` appended, the operator's list put back exactly on uninstall. Upstream PR: none
    (vLLM's documented extension point). Removal: when every supported Ray path copies the environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from .fix import RuntimeFix
from .kda_fix import KdaFix
from .runner_guard import V1RunnerGuard
from .settings import DEFAULT_ORDER, ENV_ORDER, Settings
from .staging_fix import StagingFix

if TYPE_CHECKING:
    from .policies import PolicyRegistry

logger = logging.getLogger("vllm.staging_plugin")

RAY_PREFIXES_VARIABLE = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
PLUGIN_PREFIX = "STAGING_PLUGIN_"
_Fix = TypeVar("_Fix", bound=RuntimeFix)


class Installer:
    """The plugin's whole footprint in one process (forked children inherit it, spawned ones rebuild it)."""

    def __init__(
        self,
        settings: Settings,
        policies: PolicyRegistry | None = None,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        """``policies``: the registry ``register()`` validated the order with (non-default orders only);
        ``environ``: where the Ray variable is changed (the process environment by default)."""
        self.settings = settings
        self.policies = policies
        self.environ: MutableMapping[str, str] = os.environ if environ is None else environ
        self.fixes: tuple[RuntimeFix, ...] = ()
        self.installed = False
        self._ray_before: tuple[str | None] | None = None  # the Ray variable before this installer listed it

    def fix(self, kind: type[_Fix]) -> _Fix | None:
        """This installer's fix of class ``kind`` (None when the settings leave it out)."""
        return next((f for f in self.fixes if isinstance(f, kind)), None)

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
            enabled = (fix for fix in FIXES if fix.enabled(self.settings))
            self.fixes = tuple(fix(self.settings, self.notify, self.policies) for fix in enabled)
        for fix in self.fixes:
            fix.start()

    def uninstall(self) -> None:
        """Undo :meth:`install`: hooks, the plugin's own wrappers and the Ray variable.

        A wrapper another tool put on top of the plugin's is left in place with one warning; the plugin's
        inside it then passes every call straight to vLLM. Built managers keep their state.
        """
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
        """vLLM's classes as they were before :meth:`install` for the block, then the same wrappers again
        (hooks stay; a module vLLM imports meanwhile is patched after the block): an offline tool applies
        a fix of its own there, one plugin layer at a time."""
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

    # -- Ray ------------------------------------------------------------------------------------------

    def _list_ray_prefix(self) -> None:
        """Have vLLM's Ray executors copy ``STAGING_PLUGIN_*`` to their actors, as they copy ``VLLM_*``.

        vLLM's Ray executor and its data-parallel Ray backend forward only vLLM's own variables and the
        prefixes listed in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``. Changed only when a plugin variable
        is set, keeping what the operator listed; the engine-core process that creates the actors inherits it.
        """
        env = self.environ
        if not any(key.startswith(PLUGIN_PREFIX) for key in env):
            return
        previous = env.get(RAY_PREFIXES_VARIABLE)
        listed = [p.strip() for p in (previous or "").split(",") if p.strip()]
        if PLUGIN_PREFIX not in listed:
            env[RAY_PREFIXES_VARIABLE] = ",".join([*listed, PLUGIN_PREFIX])
            self._ray_before = (previous,)

    def _restore_ray_prefix(self) -> None:
        """Put back exactly what the operator's list was (nothing if this installer did not change it)."""
        before, self._ray_before = self._ray_before, None
        if before is None:
            return
        (previous,) = before
        if previous is None:
            self.environ.pop(RAY_PREFIXES_VARIABLE, None)
        else:
            self.environ[RAY_PREFIXES_VARIABLE] = previous


FIXES: tuple[type[RuntimeFix], ...] = (StagingFix, V1RunnerGuard, KdaFix)
"""Every runtime fix, in start order; each says whether the settings enable it."""
