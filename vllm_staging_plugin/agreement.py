"""All ranks of a deployment must capture in the same order and with the same capacity: check it first.

Captured forwards contain collectives, so ranks that walk the descriptors in different orders wait on each
other inside capture: a hang, not an error. Before the real capture every rank publishes its plan (order
policy, its argument, pre-sizing arm, capacity and a digest of the ordered descriptors) to the key-value
store of the default process group that vLLM already created, then reads every rank's. Any difference
fails start-up on every rank with one message naming the ranks and their plans.

The store, not a collective: a rank without the plugin (never publishes) costs a bounded wait and a clear
message instead of a deadlock. Under vLLM's own order that rank captures exactly as we do, so the wait
ends in a warning; under another order it ends in an error.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from .settings import DEFAULT_ORDER, ENV_ORDER, Settings
from .sizing import capture_sequence, staging_capacity

logger = logging.getLogger("vllm.staging_plugin")

KEY_PREFIX = "vllm_staging_plugin/plan"
WAIT_SECONDS = 60.0
_round = itertools.count()  # same count on every rank: each builds and captures the same managers


class AgreementError(RuntimeError):
    """Ranks of one deployment would capture in different orders or with different capacities."""


def plan(settings: Settings, ordered: Mapping[Any, Sequence[Any]]) -> dict[str, Any]:
    """What must be identical on every rank; ``ordered`` is this capture's descriptors in capture order."""
    described = [[str(getattr(m, "name", m)), [repr(d) for d in descs]] for m, descs in ordered.items()]
    digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]
    return {
        "order": settings.order,
        "presize": settings.presize,
        "capacity": staging_capacity(ordered),
        "descriptors": sum(len(d) for d in ordered.values()),
        "digest": digest,
        "first": {mode: tokens[:3] for mode, tokens in capture_sequence(ordered).items()},
    }


def check(mine: dict[str, Any], store: Any, rank: int, world_size: int, wait_seconds: float) -> int:
    """Publish ``mine`` as ``rank``, compare with every rank's; :class:`AgreementError` on a split."""
    prefix = f"{KEY_PREFIX}/{next(_round)}"
    store.set(f"{prefix}/{rank}", json.dumps(mine, sort_keys=True))
    keys = [f"{prefix}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=wait_seconds))
    except Exception:  # timed out: some rank never published
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        _missing(mine, missing, wait_seconds)
        keys = [key for r, key in enumerate(keys) if r not in missing]
    plans = {int(key.rsplit("/", 1)[1]): json.loads(store.get(key)) for key in keys}
    if len({json.dumps(p, sort_keys=True) for p in plans.values()}) > 1:
        raise AgreementError(disagreement(plans))
    logger.debug("vllm-staging-plugin: %d ranks agree on the capture plan %s", len(plans), mine["digest"])
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
        "vllm-staging-plugin: the ranks of this deployment would capture CUDA graphs in different orders "
        "or with different staging capacities, which can deadlock the capture's collectives. Set the same "
        "STAGING_PLUGIN_* variables on every node (see README, 'Many GPUs and many nodes'):\n"
        + "\n".join(lines)
    )


def _missing(mine: Mapping[str, Any], missing: list[int], wait_seconds: float) -> None:
    text = (
        f"vllm-staging-plugin: ranks {missing} published no capture plan within {wait_seconds:.0f} s; "
        "is the plugin installed and enabled on every node (VLLM_PLUGINS, STAGING_PLUGIN_DISABLE)?"
    )
    if mine["order"] != DEFAULT_ORDER:
        raise AgreementError(
            f"{text} This rank would capture in order {mine['order']!r} while they capture in vLLM's own "
            f"order; set {ENV_ORDER} identically everywhere or install the plugin on every node."
        )
    logger.warning("%s Going on: under vLLM's own order they capture as this rank does.", text)


def check_process_group(settings: Settings, ordered: Mapping[Any, Sequence[Any]]) -> int | None:
    """:func:`check` over torch.distributed's default group; the ranks that agreed, None without a group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    world = dist.get_world_size()
    return check(plan(settings, ordered), _get_default_store(), dist.get_rank(), world, WAIT_SECONDS)
