"""The second fix: vLLM's shared Kimi KDA layer keeps one state slot per speculative token.

Under ``--use-replayssm`` every Mamba layer asks for no speculative state slots
(``vllm/model_executor/layers/mamba/abstract.py``, ``num_speculative_blocks = 0``). Kimi-K3's own KDA layer
reads the one slot it gets (RecoverSSM), but the shared ``KimiGatedDeltaNetAttention`` (Kimi-Linear) takes
its metadata from the generic GDN builder, whose speculative kernel reads one slot per query token: a step
that mixes a speculative decode with a prefill hands it a one-column index and the state store lands out of
bounds (an illegal memory access; at boot on vLLM 0.34.0, whose warm-up runs such a step). The fix is the
layer's spec with ``num_speculative_blocks = num_speculative_tokens``, as without ``--use-replayssm`` and
as ``kda-spec-state-slots.patch`` does inside vLLM.

It acts by behaviour, on the spec vLLM returns: only with ``--use-replayssm`` and speculative decoding,
only when that spec gives fewer speculative slots than there are speculative tokens. A vLLM that already
keeps the slots (the upstream patch applied) gets one INFO line and its spec unchanged. Kimi-K3's own
layer is another class (``KimiK3DeltaAttention``, a sibling of this one), whatever the model's name.
"""

from __future__ import annotations

import dataclasses
import logging
from types import ModuleType
from typing import Any, cast

from . import compat
from .settings import ENV_KDA_FIX, ENV_STRICT, Settings
from .wrapping import ClassWrap, plugin_wrapper

logger = logging.getLogger("vllm.staging_plugin")

KDA_MODULE = "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"
KDA_CLASS = "KimiGatedDeltaNetAttention"
SPEC_METHOD = "get_kv_cache_spec"


class KdaShapeError(RuntimeError):
    """The shared KDA layer or its spec is not what the fix was written for (strict mode raises it)."""


@dataclasses.dataclass(frozen=True)
class SlotCost:
    """What keeping the slots costs one request in one KDA layer (the upstream patch's cost too)."""

    slots_before: int
    slots_after: int
    bytes_before: int
    bytes_after: int


class KdaSlotsPatch:
    """The wrapper on ``KimiGatedDeltaNetAttention.get_kv_cache_spec`` for one :class:`Settings`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.wrap: ClassWrap | None = None
        self.refused = False  # the one warning of this process was given
        self.kept = False  # the slots were kept at least once (INFO given)
        self.already_kept = False  # vLLM's own spec already keeps them (INFO given)

    def install(self, module: ModuleType) -> None:
        """Called once vLLM imported the layer's module; never breaks that import."""
        cls = getattr(module, KDA_CLASS, None)
        if not isinstance(cls, type) or not callable(getattr(cls, SPEC_METHOD, None)):
            self.refuse(f"{module.__name__}.{KDA_CLASS}.{SPEC_METHOD} is missing")
            return
        try:
            compat.check_platform()  # out-of-tree platforms run their own kernels for this layer
            self.patch(cls)
        except Exception as exc:  # never break the import of vLLM's module
            self.refuse(f"{type(exc).__name__}: {exc}")

    def patch(self, cls: type) -> bool:
        """Wrap ``cls``'s spec method (its own, or the one it inherits); False if already holding one."""
        if self.wrap is not None:
            return False
        wrap = ClassWrap(cls, (SPEC_METHOD,))
        original = wrap.stock[SPEC_METHOD]

        @plugin_wrapper(original)
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

        wrap.apply({SPEC_METHOD: get_kv_cache_spec})
        self.wrap = wrap
        return True

    def uninstall(self) -> list[str]:
        wrap, self.wrap = self.wrap, None
        return wrap.restore() if wrap is not None else []

    def keep_slots(self, layer: str, vllm_config: Any, spec: Any, quiet: bool = False) -> Any:
        """``spec`` with one speculative slot per speculative token where the fault is, else ``spec``
        (``quiet``: no log line, for the pre-flight, which reports the answer itself)."""
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

    def refuse(self, reason: str) -> None:
        """Leave vLLM's layer as it is with one warning per process, or raise in strict mode."""
        if self.settings.strict:
            raise KdaShapeError(f"vllm-staging-plugin (strict mode): {reason}")
        if self.refused:
            return
        self.refused = True
        logger.warning(
            "vllm-staging-plugin: the KDA state-slot fix is inactive, vLLM's shared KDA layer runs as it is "
            "(a Kimi-Linear model with --use-replayssm and speculative decoding can fault on a step that "
            "mixes a speculative decode with a prefill): %s. Set %s=1 to fail instead.",
            reason,
            ENV_STRICT,
        )

    def _announce(self, layer: str, tokens: int, cost: SlotCost) -> None:
        level = logging.DEBUG if self.kept else logging.INFO
        self.kept = True
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
        if self.already_kept:
            return
        self.already_kept = True
        logger.info(
            "vllm-staging-plugin: this vLLM's %s already keeps %d speculative state slots under "
            "--use-replayssm; the plugin leaves its KV-cache spec to vLLM",
            layer,
            blocks,
        )


def slot_cost(vllm_config: Any, before: Any, after: Any) -> SlotCost:
    """Slots and bytes one request holds in one layer, from the spec's own accounting
    (``MambaSpec.max_memory_usage_bytes`` and ``page_size_bytes``, 0.30.0-0.34.0)."""
    page = int(before.page_size_bytes)
    used = (int(before.max_memory_usage_bytes(vllm_config)), int(after.max_memory_usage_bytes(vllm_config)))
    return SlotCost(used[0] // page, used[1] // page, *used)
