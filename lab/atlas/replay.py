"""One configuration through the real manager on CPU: its descriptors, its stock and patched replay in
vLLM's own order, and the family a stock crash belongs to.

Only the public functions of :mod:`vllm_staging_plugin._offline.cpu_replay` are used; vLLM is imported
when a function runs, never at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .condition import FAMILY
from .space import Setting

if TYPE_CHECKING:
    from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

Descriptors = tuple[tuple[str, tuple[Any, ...]], ...]
Outcome = dict[str, Any]


def descriptors(cfg: ReplayConfig) -> Descriptors:
    """The real manager's descriptor lists for ``cfg``, stock, as a hashable value."""
    from vllm_staging_plugin._offline import cpu_replay, seams

    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
    return tuple((mode.name, tuple(descs)) for mode, descs in seams.capture_plan(manager).items())


def outcome(cfg: ReplayConfig) -> Outcome:
    """Stock and patched replay of ``cfg`` in vLLM's own order."""
    from vllm_staging_plugin._offline.cpu_replay import replay

    stock, patched = replay(cfg, patched=False), replay(cfg, patched=True)
    rows = {b["rows"] for b in patched.buffers.values()}
    return {
        "stock_ok": stock.ok, "stock_error": stock.error, "sequence": stock.sequence,
        "plugin_ok": patched.ok and (not patched.capacity or rows == {patched.capacity}),
        "plugin_error": patched.error, "capacity": patched.capacity, "plugin_rows": sorted(rows),
    }  # fmt: skip


def family(result: Outcome, setting: Setting) -> str:
    """Name a stock crash by the vLLM rule behind it; anything else is reported as unexplained."""
    seq = result["sequence"]
    if setting["kda"] and seq.get("PIECEWISE") and max(seq.get("FULL", [0])) > max(seq["PIECEWISE"]):
        return FAMILY
    first = next(iter(seq))
    return f"unexplained: {setting['mode']}, first {first} {seq[first][0]}, capacity {result['capacity']}"
