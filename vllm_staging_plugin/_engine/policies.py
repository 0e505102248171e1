"""Capture-order policies: the built-ins, third-party packages, and asking the one that owns a name.

Loaded only under a non-default ``STAGING_PLUGIN_ORDER``; ``register()`` builds one registry per process.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from itertools import zip_longest
from typing import Any

import pluggy

from .. import hookspecs
from ..hookspecs import hookimpl
from .settings import ENV_ORDER, ENV_STRICT, ConfigError, Settings
from .sizing import mode_name, mode_rank

ENTRY_POINT_GROUP = "vllm_staging_plugin.order_policies"
BUILTIN = "builtin"
logger = logging.getLogger("vllm.staging_plugin")


class PolicyError(RuntimeError):
    """A policy failed or returned something that is not a permutation of its input."""


def _tokens(desc: Any) -> int:
    return int(desc.num_tokens)


class BuiltinPolicies:
    """The built-in orders; docs/configuration.md says what each is for and what it costs.

    Within one mode: ``descending`` (vLLM's), ``ascending``, ``max-first`` (the largest, then ascending),
    ``shuffle:SEED``. Across the modes: ``full-first``, ``size-descending`` (ties: PIECEWISE first) and
    ``interleaved`` (one graph of each mode in turn, PIECEWISE first).
    """

    WITHIN_MODES = ("descending", "ascending", "max-first", "shuffle")
    ACROSS_MODES = ("full-first", "size-descending", "interleaved")
    NAMES = WITHIN_MODES + ACROSS_MODES

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return list(self.NAMES)

    @hookimpl
    def staging_validate_order(self, policy: str, argument: str | None) -> None:
        if policy == "shuffle":
            if argument is None or not argument.lstrip("-").isdigit():
                raise ValueError(f"shuffle needs an integer seed, as in shuffle:1 (got {argument!r})")
        elif argument is not None:
            raise ValueError(f"{policy} takes no argument (got {argument!r})")

    @hookimpl
    def staging_capture_order(
        self, policy: str, argument: str | None, mode: str, descriptors: tuple[Any, ...]
    ) -> list[Any]:
        self.staging_validate_order(policy, argument)
        if policy == "shuffle":
            shuffled = list(descriptors)
            random.Random(int(str(argument))).shuffle(shuffled)
            return shuffled
        if policy in ("descending", *self.ACROSS_MODES):  # vLLM's own order within a mode
            return list(descriptors)
        ascending = sorted(descriptors, key=_tokens)  # stable: ties keep vLLM's order
        if policy == "ascending" or not descriptors:
            return ascending
        largest = max(descriptors, key=_tokens)  # max-first: the largest, then ascending
        return [largest, *(d for d in ascending if d is not largest)]

    @hookimpl
    def staging_capture_sequence(
        self, policy: str, argument: str | None, descriptors: Mapping[str, tuple[Any, ...]]
    ) -> list[Any] | None:
        if policy not in self.ACROSS_MODES:
            return None
        self.staging_validate_order(policy, argument)
        lists = list(descriptors.values())  # vLLM's order: PIECEWISE, then FULL
        if policy == "full-first":
            return [d for name in sorted(descriptors, key=lambda n: n != "FULL") for d in descriptors[name]]
        if policy == "size-descending":  # stable: ties keep vLLM's order (PIECEWISE first)
            return sorted((d for descs in lists for d in descs), key=_tokens, reverse=True)
        interleaved = zip_longest(*lists)  # interleaved: one of each mode in turn
        return [d for step in interleaved for d in step if d is not None]


class PolicyRegistry:
    """Which package owns which policy name, and a hook caller that reaches only that package."""

    def __init__(self, packages: Iterable[tuple[str, object]], strict: bool = False) -> None:
        """``packages``: (name, hook object) pairs in load order; the built-ins always come first."""
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._owners: dict[str, str] = {}  # policy name -> package name
        for name, plugin in [(BUILTIN, BuiltinPolicies()), *packages]:
            self._add(name, plugin, strict)

    @classmethod
    def load(cls, strict: bool = False) -> PolicyRegistry:
        """The built-ins and every installed entry point; a broken package is skipped with a warning."""
        return cls(_loaded(entry_points(group=ENTRY_POINT_GROUP), strict), strict)

    def _add(self, name: str, plugin: object, strict: bool) -> None:
        if self._pm.get_plugin(name) is not None:
            return
        try:
            self._pm.register(plugin, name=name)
            declared = self._pm.subset_hook_caller(
                "staging_order_policies", [p for p in self._pm.get_plugins() if p is not plugin]
            )()
            if not all(isinstance(g, list | tuple) and all(isinstance(n, str) for n in g) for g in declared):
                raise TypeError(f"staging_order_policies returned {declared!r}, not a list of names")
            names = [n for group in declared for n in group]
        except Exception as exc:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            if strict:
                raise ConfigError(
                    f"order-policy package {name!r} cannot be used ({ENV_STRICT} is on): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            logger.warning("vllm-staging-plugin: order-policy package %r is skipped: %s", name, exc)
            return
        for policy in names:
            owner = self._owners.setdefault(policy, name)
            if owner != name:
                logger.warning(
                    "vllm-staging-plugin: order policy %r is declared by %r and by %r; %r keeps it",
                    policy,
                    owner,
                    name,
                    owner,
                )

    def names(self) -> list[str]:
        return list(self._owners)

    def allowed(self) -> str:
        return ", ".join("shuffle:SEED" if n == "shuffle" else n for n in self._owners)

    def owner(self, policy: str) -> str | None:
        return self._owners.get(policy)

    def _call(self, hook: str, policy: str, **kwargs: Any) -> list[Any]:
        """Call ``hook`` on the package that owns ``policy`` only."""
        plugin = self._pm.get_plugin(self._owners[policy])
        others = [p for p in self._pm.get_plugins() if p is not plugin]
        return list(self._pm.subset_hook_caller(hook, others)(policy=policy, **kwargs))

    def _implements(self, hook: str, policy: str) -> bool:
        plugin = self._pm.get_plugin(self._owners[policy])
        return any(impl.plugin is plugin for impl in getattr(self._pm.hook, hook).get_hookimpls())

    def validate(self, settings: Settings) -> None:
        """:class:`ConfigError` at start-up, naming the variable and the allowed values, for an order we
        cannot run."""
        name = settings.order_name
        if name not in self._owners:
            raise ConfigError(
                f"{ENV_ORDER}={settings.order!r}: unknown order policy {name!r}; "
                f"allowed values: {self.allowed()}"
            )
        try:
            if self._implements("staging_validate_order", name):
                self._call("staging_validate_order", name, argument=settings.order_argument)
            elif self._implements("staging_capture_sequence", name):
                self.sequence(settings, {})
            else:
                self.order(settings, "validation", ())
        except Exception as exc:
            raise ConfigError(
                f"{ENV_ORDER}={settings.order!r}: order policy {name!r} ({self._owners[name]}) refused it: "
                f"{type(exc).__name__}: {exc}; allowed values: {self.allowed()}"
            ) from exc

    def order(self, settings: Settings, mode: str, descriptors: Sequence[Any]) -> list[Any]:
        """One mode's descriptors in the order the configured policy chooses, checked."""
        name, given = settings.order_name, tuple(descriptors)
        try:
            results = self._call(
                "staging_capture_order", name, argument=settings.order_argument, mode=mode, descriptors=given
            )
        except Exception as exc:
            raise PolicyError(
                f"order policy {name!r} failed for mode {mode}: {type(exc).__name__}: {exc}"
            ) from exc
        if not results:
            raise PolicyError(
                f"order policy {name!r} ({self._owners[name]}) returned nothing for mode {mode}"
            )
        return _permutation(name, results[0], given, f"mode {mode}")

    def reordered(
        self, settings: Settings, capture_descs: Mapping[Any, Sequence[Any]]
    ) -> dict[Any, list[Any]]:
        """``capture_descs`` in policy order: each mode's list reordered, or, for a policy across the modes,
        one list under the first one's mode (vLLM captures each descriptor in its own ``cg_mode``)."""
        sequence = self.sequence(settings, capture_descs)
        if sequence is not None:
            return sequence
        return {mode: self.order(settings, mode_name(mode), descs) for mode, descs in capture_descs.items()}

    def sequence(
        self, settings: Settings, capture_descs: Mapping[Any, Sequence[Any]]
    ) -> dict[Any, list[Any]] | None:
        """The whole capture as one list, or None when the policy orders each mode alone."""
        name = settings.order_name
        if not self._implements("staging_capture_sequence", name):
            return None
        ranked = sorted(capture_descs, key=mode_rank)  # vLLM captures PIECEWISE, then FULL
        given = {mode_name(mode): tuple(capture_descs[mode]) for mode in ranked}
        try:
            results = self._call(
                "staging_capture_sequence", name, argument=settings.order_argument, descriptors=given
            )
        except Exception as exc:
            raise PolicyError(
                f"order policy {name!r} failed for the capture sequence: {type(exc).__name__}: {exc}"
            ) from exc
        if not results:  # None: this policy orders each mode alone
            return None
        every = [d for mode in ranked for d in capture_descs[mode]]
        ordered = _permutation(name, results[0], every, "the capture sequence")
        if not ordered:
            return {mode: [] for mode in ranked}
        owner = {id(d): mode for mode in ranked for d in capture_descs[mode]}
        return {owner[id(ordered[0])]: ordered}


def _permutation(name: str, result: Sequence[Any], given: Sequence[Any], where: str) -> list[Any]:
    ordered = list(result)
    if len(ordered) != len(given) or Counter(map(id, ordered)) != Counter(map(id, given)):
        raise PolicyError(
            f"order policy {name!r} returned {len(ordered)} descriptors that are not a "
            f"permutation of the {len(given)} it was given for {where}"
        )
    return ordered


def _loaded(found: Iterable[EntryPoint], strict: bool) -> list[tuple[str, object]]:
    loaded: list[tuple[str, object]] = []
    for entry_point in found:
        try:
            loaded.append((entry_point.name, entry_point.load()))
        except Exception as exc:
            if strict:
                raise ConfigError(
                    f"order-policy entry point {entry_point.name!r} ({entry_point.value}) failed to load "
                    f"({ENV_STRICT} is on): {type(exc).__name__}: {exc}"
                ) from exc
            logger.warning(
                "vllm-staging-plugin: order-policy entry point %r (%s) failed to load and is skipped: %s",
                entry_point.name,
                entry_point.value,
                exc,
            )
    return loaded
