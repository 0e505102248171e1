"""Ranks whose captures are coupled by collectives must capture in the same order: check it first.

Coupled ranks that capture in different orders hang inside capture. Under a non-default
``STAGING_PLUGIN_ORDER`` only, each coupled rank publishes its plan to the key-value store of vLLM's default
group and reads its peers'; any difference fails start-up naming the ranks. A store, not a collective: a
peer that never publishes costs a bounded wait and a clear error. Which ranks are coupled: docs/design.md,
"Which ranks agree"; independent dense data-parallel engines are never waited on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import compat
from .settings import ENV_ORDER, Settings
from .sizing import capture_sequence, staging_capacity

logger = logging.getLogger("vllm.staging_plugin")

KEY_PREFIX = "vllm_staging_plugin/plan"
WAIT_SECONDS = 60.0
# BatchExecutionDescriptor's fields (a contract test checks that every field of the installed release's
# dataclass is listed): what makes two ranks' captures the same, whatever the repr.
DESCRIPTOR_FIELDS = (
    "cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len", "num_active_loras",
    "num_ubatches",
)  # fmt: skip


class AgreementError(RuntimeError):
    """Coupled ranks would capture in different orders or with different capacities."""


def _value(value: Any) -> Any:
    name = getattr(value, "name", None)
    if isinstance(name, str):  # an enum (CUDAGraphMode)
        return name
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


def describe(desc: Any) -> list[Any]:
    return [_value(getattr(desc, name, None)) for name in DESCRIPTOR_FIELDS]


def plan(settings: Settings, ordered: Mapping[Any, Sequence[Any]]) -> dict[str, Any]:
    """What must be identical on coupled ranks; ``ordered`` is this capture's descriptors in capture order."""
    described = [[str(_value(m)), [describe(d) for d in descs]] for m, descs in ordered.items()]
    digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]
    return {
        "order": settings.order,
        "presize": settings.presize,
        "capacity": staging_capacity(ordered),
        "descriptors": sum(len(d) for d in ordered.values()),
        "digest": digest,
        "first": {mode: tokens[:3] for mode, tokens in capture_sequence(ordered).items()},
    }


def coupled_ranks(rank: int, world_size: int, engine_size: int, data_parallel_size: int, moe: bool) -> range:
    """The default-group ranks whose captures share collectives with ``rank``'s: vLLM lays ranks out as
    ``arange(world).reshape(-1, dp, pp, pcp, tp)``, so one engine, and coupled DP engines, are contiguous."""
    coupled_dp = moe and data_parallel_size > 1
    block = max(engine_size, 1) * (data_parallel_size if coupled_dp else 1)
    start = rank // block * block
    return range(start, min(start + block, world_size))


def engine_size(parallel_config: Any) -> int:
    """One engine's ranks, tp x pp x pcp (not ``world_size``: ``external_launcher`` multiplies it by dp)."""
    size = int(parallel_config.tensor_parallel_size) * int(parallel_config.pipeline_parallel_size)
    return size * int(getattr(parallel_config, "prefill_context_parallel_size", 1) or 1)


def _model_is_moe(vllm_config: Any) -> bool:
    try:
        return bool(getattr(vllm_config.model_config, "is_moe", False))
    except Exception:  # a model config that cannot say: treat as dense (engines not coupled)
        return False


def check(mine: dict[str, Any], store: Any, rank: int, ranks: Sequence[int], wait_seconds: float) -> int:
    """Publish ``mine`` as ``rank``, compare with each of ``ranks``; :class:`AgreementError` on a split.
    The store counts each rank's rounds, so coupled ranks meet in the same round, also after the plugin
    was registered again in a live process group."""
    namespace = f"{KEY_PREFIX}/{ranks[0]}-{ranks[-1]}"
    round_ = int(store.add(f"{namespace}/rounds/{rank}", 1)) - 1
    prefix = f"{namespace}/{round_}"
    store.set(f"{prefix}/{rank}", json.dumps(mine))
    try:
        store.wait([f"{prefix}/{r}" for r in ranks], timedelta(seconds=wait_seconds))
    except Exception:  # timed out: some coupled rank never published
        missing = [r for r in ranks if not store.check([f"{prefix}/{r}"])]
        raise AgreementError(_missing(mine, missing, wait_seconds)) from None
    plans = {r: json.loads(store.get(f"{prefix}/{r}")) for r in ranks}  # compared key-order-free below
    if len({json.dumps(p, sort_keys=True) for p in plans.values()}) > 1:
        raise AgreementError(disagreement(plans))
    logger.debug("vllm-staging-plugin: ranks %s agree on the capture plan %s", list(ranks), mine["digest"])
    return len(plans)


def disagreement(plans: Mapping[int, Mapping[str, Any]]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, p in sorted(plans.items()):
        groups.setdefault(json.dumps(p, sort_keys=True), []).append(rank)
    lines = [
        f"  ranks {ranks}: {ENV_ORDER}={p['order']} presize={p['presize']} capacity={p['capacity']} "
        f"descriptors={p['descriptors']} digest={p['digest']} first={p['first']}"
        for text, ranks in groups.items()
        for p in [json.loads(text)]
    ]
    return (
        "vllm-staging-plugin: ranks whose CUDA-graph captures share collectives would capture in different "
        "orders or with different staging capacities, which can deadlock the capture. Set the same "
        "STAGING_PLUGIN_* variables on every node and in every worker's environment:\n" + "\n".join(lines)
    )


def _missing(mine: Mapping[str, Any], missing: list[int], wait_seconds: float) -> str:
    return (
        f"vllm-staging-plugin: ranks {missing} published no capture plan within {wait_seconds:.0f} s, while "
        f"this rank would capture in order {mine['order']!r}; a rank without the plugin, or with "
        f"{ENV_ORDER} unset, captures in vLLM's own order. Install and enable the plugin on every node "
        f"(VLLM_PLUGINS, STAGING_PLUGIN_DISABLE) and set {ENV_ORDER} identically everywhere."
    )


def check_coupled_ranks(
    settings: Settings, ordered: Mapping[Any, Sequence[Any]], vllm_config: Any
) -> int | None:
    """:func:`check` among the ranks coupled with this one, waiting up to ``WAIT_SECONDS`` (read at the call);
    the count that agreed, None when alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    parallel = vllm_config.parallel_config
    ranks = coupled_ranks(
        dist.get_rank(),
        dist.get_world_size(),
        engine_size(parallel),
        int(parallel.data_parallel_size),
        _model_is_moe(vllm_config),
    )
    if len(ranks) < 2:
        return None
    mine = plan(settings, ordered)
    return check(mine, compat.default_store(), dist.get_rank(), ranks, WAIT_SECONDS)
