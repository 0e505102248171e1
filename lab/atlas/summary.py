"""The recorded summary (docs/data/atlas/*.json): what a run writes, in which layout, and whether it is clean.

The layout is compact (a few KB): the search per scope once, per release only what differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .driver import Row
from .space import DBO_THRESHOLD, GRIDS, HIDDEN, SEARCHES


def build(
    command: str,
    installed: str,
    releases: Sequence[str],
    scope_of: Callable[[str], str],
    rows: list[Row],
    seconds: float,
) -> dict[str, Any]:
    """The summary of one run (``rows`` in the order of ``releases``), before :func:`write` compacts it."""
    return {
        "command": command,
        "installed_vllm": installed,
        "hidden_size": HIDDEN,
        "dbo_decode_token_threshold": DBO_THRESHOLD,
        "custom_grids": {
            k: list(GRIDS[k]) for k in dict.fromkeys(g for r in releases for g in SEARCHES[scope_of(r)].grids)
        },
        "seconds": round(seconds, 1),
        "releases": rows,
    }


def write(summary: dict[str, Any], path: Path) -> None:
    """Compact ``summary`` in place (searches per scope, rows without them) and write it to ``path``."""
    rows = summary["releases"]
    summary["searches"] = {r["scope"]: r["search"] for r in rows if "search" in r}
    summary["releases"] = [
        {k: v for k, v in r.items() if k not in ("search", "features") and v != []} for r in rows
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, separators=(",", ":"), default=list) + "\n")


def failed(rows: Sequence[Row]) -> bool:
    """Any error, plugin failure or disagreement between the condition and the outcomes (exit 1)."""
    return any(
        "error" in r
        or r["plugin_failures"]
        or r["predicate_mismatches"]
        or r.get("descriptor_rule_mismatches")
        or r.get("message_mismatches")
        or (r.get("sweep") or {}).get("mismatches")
        for r in rows
    )
