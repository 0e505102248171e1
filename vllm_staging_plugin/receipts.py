"""Per-capture JSON receipts: what was captured, in which order, at what cost.

Written atomically (temporary file in the same directory, then ``os.replace``) under a name unique per
host, process, rank and capture, so many workers can share one directory and a crash leaves no
half-written receipt.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = "vllm-staging-plugin/receipt/v1"
REQUIRED_FIELDS = (
    "schema", "kind", "ok", "error", "plugin_version", "vllm_version", "torch_version",
    "cuda_version", "gpu_name", "driver_version", "architecture", "hidden_size", "cudagraph_mode",
    "capture_sizes", "policy", "captured_sequence", "capacity", "staging_bytes", "capture_seconds",
    "graph_memory_bytes", "graph_pool_reserved_bytes", "graph_pool_active_bytes",
    "profiling_estimate_bytes", "presize", "rank", "pid", "created_unix",
)  # fmt: skip
_counter = itertools.count()
logger = logging.getLogger("vllm.staging_plugin")


def receipt_name(kind: str, rank: int) -> str:
    host = socket.gethostname().replace(os.sep, "_")
    return f"receipt-{kind}-{host}-pid{os.getpid()}-rank{rank}-{next(_counter)}-{time.time_ns()}.json"


def write_receipt(directory: Path, receipt: dict[str, Any]) -> Path:
    """Write ``receipt`` atomically into ``directory`` (created if needed); returns its path."""
    missing = [f for f in REQUIRED_FIELDS if f not in receipt]
    if missing:
        raise ValueError(f"receipt lacks fields: {', '.join(missing)}")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / receipt_name(str(receipt["kind"]), int(receipt["rank"]))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(receipt, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


Skip = Callable[[Path, str], None]
"""Told about each file named like a receipt that is not one: its path and why."""


def read_receipts(directory: Path, on_skip: Skip | None = None) -> list[dict[str, Any]]:
    """Every complete receipt under ``directory`` (recursively; temporary files are ignored), oldest first.

    Receipts gathered from many hosts include partial copies and foreign files: each file named like a
    receipt that cannot be read, is not JSON, is of another schema or lacks fields is passed to
    ``on_skip`` (default: one warning naming it) and left out, so one bad copy never hides the others.
    """
    skip = on_skip or _warn_skipped
    receipts = []
    for path in sorted(directory.rglob("receipt-*.json")):
        data, problem = _load(path)
        if data is None:
            skip(path, problem)
        else:
            receipts.append(data)
    return sorted(receipts, key=lambda r: (r["created_unix"], r["pid"]))


def _load(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The receipt in ``path``, or None and the reason it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
        return None, f"not a receipt of schema {SCHEMA} (schema: {schema!r})"
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        return None, f"incomplete receipt, lacks fields: {', '.join(missing)}"
    if not all(_is_number(data[key]) for key in ("created_unix", "pid")):
        return None, "created_unix or pid is not a number"
    return data, ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _warn_skipped(path: Path, reason: str) -> None:
    logger.warning("vllm-staging-plugin: skipped %s: %s", path, reason)
