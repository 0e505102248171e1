"""One object owns every change the plugin makes to a process; :meth:`Installer.uninstall` is its inverse.

``register()`` builds it from the process's :class:`~.settings.Settings`. The changes, all listed in the
patch registry of :mod:`.patch`: three import hooks (taken off ``sys.meta_path`` as soon as they fire, or
as soon as the worker's runner shows they never will), the manager patch (:class:`~.patch.ManagerPatch`),
the KDA state-slot fix (:class:`~.kda_slots.KdaSlotsPatch`), the V1 runner guard
(:class:`~.runner_guard.RunnerGuard`) and the Ray prefix variable. Each patch keeps
its own state; the installer wires them together and never hands itself to them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from types import ModuleType
from typing import TYPE_CHECKING

from .compat import CUDAGRAPH_MODULE
from .import_hook import PostImportHook, when_imported
from .kda_slots import KDA_MODULE, KdaSlotsPatch
from .runner_guard import V1_RUNNER_MODULE, RunnerGuard
from .settings import DEFAULT_ORDER, ENV_ORDER, Settings

if TYPE_CHECKING:
    from .patch import ManagerPatch
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
        """``policies``: the registry ``register()`` validated the order with (non-default orders only);
        ``environ``: where the Ray variable is changed (the process environment by default)."""
        self.settings = settings
        self.policies = policies
        self.environ: MutableMapping[str, str] = os.environ if environ is None else environ
        self.guard = RunnerGuard(settings, on_v1_runner_built=self._v1_runner_built)
        self.patch: ManagerPatch | None = None  # built when vLLM imports cudagraph_utils (it imports torch)
        self.kda = KdaSlotsPatch(settings)  # installed when vLLM imports the shared KDA layer's module
        self.installed = False
        self._ray_held = False  # this installer holds the Ray prefix (RAY_LEDGER)
        self._hooks: dict[str, PostImportHook] = {}  # this installer's own, by module name, until removed

    def install(self) -> None:
        """Arrange for the patch; imports neither torch nor vLLM. Disabled: only the Ray variable."""
        if self.installed:
            return
        self.installed = True
        self.forward_to_ray_workers()
        if self.settings.disabled:
            if self.settings.order != DEFAULT_ORDER:
                logger.warning(
                    "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE); %s=%s is ignored "
                    "and vLLM captures in its own descending order",
                    ENV_ORDER,
                    self.settings.order,
                )
            return
        hooks = [(CUDAGRAPH_MODULE, self._on_cudagraph_module), (V1_RUNNER_MODULE, self.guard.install)]
        if self.settings.kda_fix == "on":
            hooks.append((KDA_MODULE, self.kda.install))
        for name, callback in hooks:
            hook = when_imported(name, callback)
            if hook is not None:
                self._hooks[name] = hook

    def uninstall(self) -> None:
        """Undo :meth:`install`: hooks, the plugin's own wrappers and the Ray variable.

        A wrapper another tool put on top of the plugin's is left in place with one warning; the plugin's
        inside it then passes every call straight to vLLM. Built managers keep their state.
        """
        for name in list(self._hooks):
            self._remove_hook(name)
        foreign = [
            *(self.patch.uninstall() if self.patch else []),
            *self.kda.uninstall(),
            *self.guard.uninstall(),
        ]
        if foreign:
            names = " and ".join(foreign)
            verb = "was wrapped" if len(foreign) == 1 else "were wrapped"
            logger.warning(
                "vllm-staging-plugin: %s %s by another tool after this plugin; that wrapper is left in "
                "place and the plugin's own, inside it, now passes every call straight to vLLM",
                names,
                verb,
            )
        self.restore_ray_variable()
        self.installed = False

    def _on_cudagraph_module(self, module: ModuleType) -> None:
        from .patch import ManagerPatch  # torch and the staging code: only in processes that build graphs

        if self.patch is None:
            self.patch = ManagerPatch(self.settings, self.policies, on_manager_built=self._v2_manager_built)
        self.patch.install(module)

    def _remove_hook(self, name: str) -> None:
        """Take this installer's hook for ``name`` off ``sys.meta_path`` (fired ones already left)."""
        hook = self._hooks.pop(name, None)
        if hook is not None:
            hook.remove()

    def _v2_manager_built(self) -> None:
        """This worker runs Model Runner V2: the V1 guard has nothing to do. Its model is loaded and its
        KV-cache specs were taken before any manager exists, so a shared KDA layer not imported by now never
        will be: that hook goes too."""
        self._remove_hook(V1_RUNNER_MODULE)
        self._remove_hook(KDA_MODULE)
        self.guard.uninstall()

    def _v1_runner_built(self) -> None:
        """No manager will be built in this worker: the patch's import hook goes."""
        self._remove_hook(CUDAGRAPH_MODULE)

    # -- Ray ------------------------------------------------------------------------------------------

    def forward_to_ray_workers(self) -> None:
        """Have vLLM's Ray executors copy ``STAGING_PLUGIN_*`` to their actors, as they copy ``VLLM_*``.

        vLLM's legacy Ray executor and its data-parallel Ray backend forward only vLLM's own variables
        and the prefixes listed in ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` (additive). Changed only
        when a plugin variable is set; the engine-core process that creates the actors inherits it.
        Every installer that needs the prefix holds it (:class:`RayPrefixLedger`): it stays listed until
        the last holder of that environment uninstalls.
        """
        env = self.environ
        if self._ray_held or not any(key.startswith(PLUGIN_PREFIX) for key in env):
            return
        self._ray_held = True
        RAY_LEDGER.hold(self, env)

    def restore_ray_variable(self) -> None:
        if self._ray_held:
            self._ray_held = False
            RAY_LEDGER.release(self, self.environ)


_Entry = tuple[MutableMapping[str, str], list[Installer], tuple[str | None] | None]


class RayPrefixLedger:
    """Who holds ``STAGING_PLUGIN_`` in an environment's Ray prefix list, and what the list was before.

    The environment is one per process, whichever installer changed it, so its ledger is too
    (:data:`RAY_LEDGER`); a mapping handed to an installer (tests, tools) gets its own entry.
    """

    def __init__(self) -> None:
        # id(environ) -> (environ, holders, (value before the prefix was added,) or None if not added)
        self._entries: dict[int, _Entry] = {}

    def hold(self, holder: Installer, env: MutableMapping[str, str]) -> None:
        """List the prefix in ``env`` (keeping what is there) and count ``holder`` among its holders."""
        _, holders, before = self._entries.get(id(env), (env, [], None))
        previous = env.get(RAY_PREFIXES_VARIABLE)
        listed = [p.strip() for p in (previous or "").split(",") if p.strip()]
        if PLUGIN_PREFIX not in listed:
            env[RAY_PREFIXES_VARIABLE] = ",".join([*listed, PLUGIN_PREFIX])
            if before is None:
                before = (previous,)
        self._entries[id(env)] = (env, [*holders, holder], before)

    def release(self, holder: Installer, env: MutableMapping[str, str]) -> None:
        """``holder`` no longer needs the prefix; the last holder puts back what the list was."""
        entry = self._entries.get(id(env))
        if entry is None:
            return
        _, holders, before = entry
        holders = [h for h in holders if h is not holder]
        if holders:
            self._entries[id(env)] = (env, holders, before)
            return
        del self._entries[id(env)]
        if before is None:
            return
        (previous,) = before
        if previous is None:
            env.pop(RAY_PREFIXES_VARIABLE, None)
        else:
            env[RAY_PREFIXES_VARIABLE] = previous


RAY_LEDGER = RayPrefixLedger()
