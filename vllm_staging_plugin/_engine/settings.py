"""Environment configuration, parsed once by ``register()`` so every error names its variable and values.

The prefix is ``STAGING_PLUGIN_``, not ``VLLM_``: vLLM warns about every unknown ``VLLM_*`` variable and,
in its hard-fail mode, refuses to start.
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
    """``off`` keeps vLLM's lazy staging; ``off-allow-crash`` also allows another order, to reproduce the
    upstream crash."""
    kda_fix: str = "on"

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


def parse_switch(name: str, values: tuple[str, ...], environ: Mapping[str, str]) -> str:
    """One of ``values`` (the first when unset; ``1``/``true`` = on, ``0``/``false`` = off), else
    :class:`ConfigError` naming the variable and the allowed values."""
    raw = environ.get(name, "")
    value = raw.strip().lower() or values[0]
    value = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(value, value)
    if value not in values:
        raise ConfigError(f"{name}={raw!r}; allowed values: {', '.join(values)} (1/true = on, 0/false = off)")
    return value


def read_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse the plugin's variables; raises :class:`ConfigError` on the first bad value."""
    env = os.environ if environ is None else environ
    order = env.get(ENV_ORDER, "").strip() or DEFAULT_ORDER
    receipts = env.get(ENV_RECEIPTS_DIR, "").strip()
    presize = parse_switch(ENV_PRESIZE, PRESIZE_VALUES, env)
    if presize == "off" and order != DEFAULT_ORDER:
        raise ConfigError(
            f"{ENV_ORDER}={order!r} needs pre-sizing ({ENV_PRESIZE}=on): with vLLM's lazy staging "
            "any order whose first descriptor is not the largest crashes the boot at the staging "
            f"copy. Allowed: {ENV_PRESIZE}=on, or {ENV_PRESIZE}=off-allow-crash to reproduce the "
            f"crash on purpose, or {ENV_ORDER}={DEFAULT_ORDER}"
        )
    return Settings(
        kda_fix=parse_switch(ENV_KDA_FIX, KDA_FIX_VALUES, env),
        disabled=parse_bool(ENV_DISABLE, env),
        strict=parse_bool(ENV_STRICT, env),
        order=order,
        receipts_dir=Path(receipts) if receipts else None,
        presize=presize,
    )
