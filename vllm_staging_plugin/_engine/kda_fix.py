"""The KDA fix: vLLM's shared Kimi KDA layer keeps one state slot per speculative token.

Registry entry (vllm-ascend's fields):

``vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn.KimiGatedDeltaNetAttention.get_kv_cache_spec``
(wrapped: the method the class inherits, or its own where vLLM defines one)
    Why: under ``--use-replayssm`` every Mamba layer asks for no speculative state slots, but the shared
    ``KimiGatedDeltaNetAttention`` (Kimi-Linear) runs the generic GDN speculative kernel, which reads one
    slot per query token: on a step mixing a speculative decode with a prefill it reads past its state
    index.
    How: where vLLM's spec has fewer speculative blocks than speculative tokens under the flag, return it
    with ``num_speculative_blocks = num_speculative_tokens`` (as without the flag) and one INFO line with
    the cost. Kimi-K3's own layer is another class. ``STAGING_PLUGIN_KDA_FIX=off`` leaves it out.
    Upstream PR: none yet; the same change ships as ``patches/kda-spec-state-slots.patch``.
    Removal: when vLLM keeps those slots itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

from . import compat
from .fix import V2_MANAGER_BUILT, ClassWrap, Once, RuntimeFix
from .settings import ENV_KDA_FIX, ENV_STRICT, Settings

logger = logging.getLogger("vllm.staging_plugin")

KDA_MODULE = "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"
KDA_CLASS = "KimiGatedDeltaNetAttention"
SPEC_METHOD = "get_kv_cache_spec"


class KdaShapeError(RuntimeError):
    """The shared KDA layer or its spec is not what the fix was written for (strict mode raises it)."""


@dataclasses.dataclass(frozen=True)
class SlotCost:
    """What keeping the slots costs one request in one KDA layer."""

    slots_before: int
    slots_after: int
    bytes_before: int
    bytes_after: int


class KdaFix(RuntimeFix):
    """The wrapper on ``KimiGatedDeltaNetAttention.get_kv_cache_spec`` for one :class:`Settings`."""

    module = KDA_MODULE
    target = KDA_CLASS
    methods = (SPEC_METHOD,)
    error = KdaShapeError
    retired_by = frozenset({V2_MANAGER_BUILT})  # KV-cache specs are taken before any manager exists

    @functools.cached_property
    def kept(self) -> Once:
        """The cost line: INFO once, DEBUG after."""
        return Once()

    @functools.cached_property
    def already_kept(self) -> Once:
        """The stand-down line, once."""
        return Once()

    @classmethod
    def enabled(cls, settings: Settings) -> bool:
        return settings.kda_fix == "on"

    def find(self, module: Any) -> type:
        cls = getattr(module, KDA_CLASS, None)
        if not isinstance(cls, type) or not callable(getattr(cls, SPEC_METHOD, None)):
            raise KdaShapeError(f"{module.__name__}.{KDA_CLASS}.{SPEC_METHOD} is missing")
        return cls

    def check(self) -> None:
        compat.check_platform()  # out-of-tree platforms run their own kernels for this layer

    def refusal(self, reason: str) -> str:
        return (
            "vllm-staging-plugin: the KDA state-slot fix is inactive, vLLM's shared KDA layer runs as it is "
            "(a Kimi-Linear model with --use-replayssm and speculative decoding can fault on a step that "
            f"mixes a speculative decode with a prefill): {reason}. Set {ENV_STRICT}=1 to fail instead."
        )

    def wrappers(self, wrap: ClassWrap) -> dict[str, Callable[..., Any]]:
        original = wrap.original[SPEC_METHOD]

        @functools.wraps(original)
        def get_kv_cache_spec(layer: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
            spec = original(layer, vllm_config, *args, **kwargs)
            if not wrap.live:
                return spec
            name = type(layer).__qualname__
            try:
                return self.keep_slots(name, vllm_config, spec)
            except KdaShapeError:
                raise  # strict mode
            except Exception as exc:  # never break vLLM's KV-cache setup: its own spec, one warning
                self.refuse(f"{name}.{SPEC_METHOD}: {type(exc).__name__}: {exc}")
                return spec

        return {SPEC_METHOD: get_kv_cache_spec}

    def keep_slots(self, layer: str, vllm_config: Any, spec: Any, quiet: bool = False) -> Any:
        """``spec`` with one speculative slot per speculative token where the fault is, else ``spec``
        (``quiet``: no log line, for the pre-flight)."""
        cache = getattr(vllm_config, "cache_config", None)
        if not getattr(cache, "use_replayssm", False) or spec is None:
            return spec
        tokens = getattr(getattr(vllm_config, "speculative_config", None), "num_speculative_tokens", None)
        if not isinstance(tokens, int) or tokens <= 0:
            return spec
        blocks = getattr(spec, "num_speculative_blocks", None)
        if isinstance(spec, type) or not dataclasses.is_dataclass(spec) or not isinstance(blocks, int):
            self.refuse(
                f"{layer}.{SPEC_METHOD} returned {type(spec).__name__} without num_speculative_blocks"
            )
            return spec
        if blocks >= tokens:
            if not quiet:
                self._already_kept(layer, blocks)
            return spec
        kept = dataclasses.replace(cast(Any, spec), num_speculative_blocks=tokens)
        if not quiet:
            self._announce(layer, tokens, slot_cost(vllm_config, spec, kept))
        return kept

    def _announce(self, layer: str, tokens: int, cost: SlotCost) -> None:
        level = logging.INFO if self.kept() else logging.DEBUG
        logger.log(
            level,
            "vllm-staging-plugin: %s (vLLM's shared KDA layer) keeps one state slot per speculative token "
            "under --use-replayssm (%d speculative tokens): %d state slots per request instead of %d, "
            "%d bytes per request in each such layer instead of %d; %s=off turns this off",
            layer,
            tokens,
            cost.slots_after,
            cost.slots_before,
            cost.bytes_after,
            cost.bytes_before,
            ENV_KDA_FIX,
        )

    def _already_kept(self, layer: str, blocks: int) -> None:
        if not self.already_kept():
            return
        logger.info(
            "vllm-staging-plugin: this vLLM's %s already keeps %d speculative state slots under "
            "--use-replayssm; the plugin leaves its KV-cache spec to vLLM",
            layer,
            blocks,
        )


def slot_cost(vllm_config: Any, before: Any, after: Any) -> SlotCost:
    """Slots and bytes one request holds in one layer, from the spec's own accounting."""
    page = int(before.page_size_bytes)
    used = (int(before.max_memory_usage_bytes(vllm_config)), int(after.max_memory_usage_bytes(vllm_config)))
    return SlotCost(used[0] // page, used[1] // page, *used)
