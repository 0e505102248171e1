"""Environment configuration, parsed in one place so every error names its variable and values.

``register()`` reads the environment once, through :func:`read_settings`, and hands the resulting
:class:`Settings` to the installer; nothing else in the engine reads ``STAGING_PLUGIN_*``. The offline
tools build their own :class:`Settings` and never write the variables. Never imports vLLM or torch.

The prefix is ``STAGING_PLUGIN_``, not ``VLLM_``: vLLM's ``Platform.validate_environ`` warns about every
unknown ``VLLM_*`` variable and, in its hard-fail mode, refuses to start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_DISABLE = "STAGING_PLUGIN_DISABLE"
ENV_STRICT = "STAGING_PLUGIN_STRICT"
ENV_ORDER = "STAGING_PLUGIN_ORDER"
ENV_RECEIPTS_DIR = "STAGING_PLUGIN_RECEIPTS_DIR"
ENV_PRESIZE = "STAGING_PLUGIN_PRESIZE"
ENV_KDA_FIX = "STAGING_PLUGIN_KDA_FIX"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
DEFAULT_ORDER = "descending"
PRESIZE_VALUES = ("on", "off", "off-allow-crash")
KDA_FIX_VALUES = ("on", "off")


class ConfigError(ValueError):
    """A configuration variable holds a value the plugin cannot honour."""


@dataclass(frozen=True)
class Settings:
    disabled: bool = False
    strict: bool = False
    order: str = DEFAULT_ORDER
    """Order policy spec, ``NAME`` or ``NAME:ARGUMENT`` (validated by :mod:`.policies`)."""
    receipts_dir: Path | None = None
    presize: str = "on"
    """``on``; ``off`` keeps vLLM's lazy staging (only vLLM's order is then safe); ``off-allow-crash``
    also lets another order run on stock staging, to reproduce the upstream crash on purpose."""
    kda_fix: str = "on"
    """``on``: vLLM's shared KDA layer keeps a state slot per speculative token under ``--use-replayssm``
    (:mod:`.kda_slots`); ``off`` leaves it to vLLM (a Kimi-Linear boot with that flag then faults on a
    mixed step: at boot on vLLM 0.34.0)."""

    @property
    def order_name(self) -> str:
        return self.order.partition(":")[0]

    @property
    def order_argument(self) -> str | None:
        _, sep, argument = self.order.partition(":")
        return argument if sep else None


def parse_bool(name: str, environ: Mapping[str, str]) -> bool:
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    allowed = ", ".join(v for v in (*_FALSE[1:], *_TRUE))
    raise ConfigError(f"{name}={raw!r} is not a boolean; allowed values: {allowed} (or unset)")


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse the plugin's variables; raises :class:`ConfigError` on the first bad value."""
    env = os.environ if environ is None else environ
    order = env.get(ENV_ORDER, "").strip() or DEFAULT_ORDER
    receipts = env.get(ENV_RECEIPTS_DIR, "").strip()
    presize = env.get(ENV_PRESIZE, "").strip().lower() or "on"
    presize = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(presize, presize)
    if presize not in PRESIZE_VALUES:
        raise ConfigError(
            f"{ENV_PRESIZE}={env[ENV_PRESIZE]!r}; allowed values: {', '.join(PRESIZE_VALUES)} "
            "(1/true = on, 0/false = off)"
        )
    if presize == "off" and order != DEFAULT_ORDER:
        raise ConfigError(
            f"{ENV_ORDER}={order!r} needs pre-sizing ({ENV_PRESIZE}=on): with vLLM's lazy staging "
            "any order whose first descriptor is not the largest crashes the boot at the staging "
            f"copy. Allowed: {ENV_PRESIZE}=on, or {ENV_PRESIZE}=off-allow-crash to reproduce the "
            f"crash on purpose, or {ENV_ORDER}={DEFAULT_ORDER}"
        )
    kda_fix = env.get(ENV_KDA_FIX, "").strip().lower() or "on"
    kda_fix = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(kda_fix, kda_fix)
    if kda_fix not in KDA_FIX_VALUES:
        raise ConfigError(
            f"{ENV_KDA_FIX}={env[ENV_KDA_FIX]!r}; allowed values: {', '.join(KDA_FIX_VALUES)} "
            "(1/true = on, 0/false = off)"
        )
    return Settings(
        kda_fix=kda_fix,
        disabled=parse_bool(ENV_DISABLE, env),
        strict=parse_bool(ENV_STRICT, env),
        order=order,
        receipts_dir=Path(receipts) if receipts else None,
        presize=presize,
    )
