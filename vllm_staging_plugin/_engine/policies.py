"""Capture-order policies: the built-ins, third-party loading, validation and application."""

from __future__ import annotations

import functools
import logging
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import pluggy

from .. import hookspecs
from ..hookspecs import hookimpl
from .settings import DEFAULT_ORDER, ENV_ORDER, ConfigError, Settings, strict_requested

ENTRY_POINT_GROUP = "vllm_staging_plugin.order_policies"
logger = logging.getLogger("vllm.staging_plugin")


class PolicyError(RuntimeError):
    """A policy returned something that is not a permutation of its input."""


def _tokens(desc: Any) -> int:
    return int(desc.num_tokens)


class BuiltinPolicies:
    """The four built-in orders; ``trylast`` so a third-party policy of the same name wins."""

    NAMES = ("descending", "ascending", "max-first", "shuffle")

    @hookimpl(trylast=True)
    def staging_order_policies(self) -> list[str]:
        return list(self.NAMES)

    @hookimpl(trylast=True)
    def staging_capture_order(
        self, policy: str, argument: str | None, mode: str, descriptors: tuple[Any, ...]
    ) -> list[Any] | None:
        if policy not in self.NAMES:
            return None
        if policy == "shuffle":
            if argument is None or not argument.lstrip("-").isdigit():
                raise ValueError(f"shuffle needs an integer seed, as in shuffle:1 (got {argument!r})")
            shuffled = list(descriptors)
            random.Random(int(argument)).shuffle(shuffled)
            return shuffled
        if argument is not None:
            raise ValueError(f"{policy} takes no argument (got {argument!r})")
        if policy == "descending":  # vLLM's own order, untouched
            return list(descriptors)
        ascending = sorted(descriptors, key=_tokens)  # stable: ties keep vLLM's order
        if policy == "ascending" or not descriptors:
            return ascending
        largest = max(descriptors, key=_tokens)  # max-first: the largest, then ascending
        return [largest, *(d for d in ascending if d is not largest)]


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """Built once per process: built-ins first, then every entry point of :data:`ENTRY_POINT_GROUP`.

    Entry points are loaded one by one (not with pluggy's ``load_setuptools_entrypoints``) so that one
    broken policy package is skipped with a warning naming it instead of failing every non-default order.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(BuiltinPolicies(), name="builtin")
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if pm.get_plugin(entry_point.name) is not None or pm.is_blocked(entry_point.name):
            continue
        try:
            pm.register(entry_point.load(), name=entry_point.name)
        except Exception as exc:
            if strict_requested():
                raise
            logger.warning(
                "vllm-staging-plugin: order-policy entry point %r (%s) failed to load and is skipped: %s",
                entry_point.name,
                entry_point.value,
                exc,
            )
    return pm


def policy_names() -> list[str]:
    names: list[str] = []
    for group in reversed(plugin_manager().hook.staging_order_policies()):
        names.extend(n for n in group if n not in names)
    return names


def allowed_orders() -> str:
    return ", ".join("shuffle:SEED" if n == "shuffle" else n for n in policy_names())


def validate_order(settings: Settings) -> None:
    """Fail at start-up, naming the variable and the allowed values, for an order we cannot run."""
    if settings.order == DEFAULT_ORDER:
        return
    if settings.order_name not in policy_names():
        raise ConfigError(
            f"{ENV_ORDER}={settings.order!r}: unknown order policy {settings.order_name!r}; "
            f"allowed values: {allowed_orders()}"
        )
    try:
        order_descriptors(settings, "validation", ())
    except (ValueError, PolicyError) as exc:
        raise ConfigError(
            f"{ENV_ORDER}={settings.order!r}: {exc}; allowed values: {allowed_orders()}"
        ) from exc


def order_descriptors(settings: Settings, mode: str, descriptors: Sequence[Any]) -> list[Any]:
    """One mode's descriptors in the order the configured policy chooses, checked."""
    given = tuple(descriptors)
    result = plugin_manager().hook.staging_capture_order(
        policy=settings.order_name, argument=settings.order_argument, mode=mode, descriptors=given
    )
    if result is None:
        raise PolicyError(f"no order policy answered for {settings.order_name!r}")
    ordered = list(result)
    if len(ordered) != len(given) or Counter(map(id, ordered)) != Counter(map(id, given)):
        raise PolicyError(
            f"order policy {settings.order_name!r} returned {len(ordered)} descriptors that are not a "
            f"permutation of the {len(given)} it was given for mode {mode}"
        )
    return ordered


def reordered(settings: Settings, capture_descs: Mapping[Any, Sequence[Any]]) -> dict[Any, list[Any]]:
    """``capture_descs`` with each mode's list in policy order (modes keep vLLM's order)."""
    return {
        mode: order_descriptors(settings, str(getattr(mode, "name", mode)), descs)
        for mode, descs in capture_descs.items()
    }
