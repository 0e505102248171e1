"""Per-capture JSON receipts: what was captured, in which order, at what cost.

Written atomically (temporary file in the same directory, then ``os.replace``) under a name unique per
host, process, rank and capture, so many workers can share one directory and a crash leaves no
half-written receipt.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import tempfile
import time
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


def read_receipts(directory: Path) -> list[dict[str, Any]]:
    """Every complete receipt under ``directory`` (recursively; temporary files are ignored), oldest first."""
    receipts = []
    for path in sorted(directory.rglob("receipt-*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") == SCHEMA:
            receipts.append(data)
    return sorted(receipts, key=lambda r: (r["created_unix"], r["pid"]))
