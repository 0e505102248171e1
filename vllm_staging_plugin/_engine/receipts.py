"""Per-capture JSON receipts: the schema (read back by ``_offline.receipt_reader``) and the atomic writer.

A name unique per host, process, rank and capture lets many workers share one directory; ``os.replace``
means a crash leaves no half-written receipt.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

SCHEMA = "vllm-staging-plugin/receipt/v1"


class _Start(TypedDict):
    """Known when the capture starts."""

    schema: str
    kind: str  # "profiling" (vLLM's memory-profiling pass) or "capture" (the real one)
    ok: bool
    error: str | None
    plugin_version: str
    vllm_version: str | None
    torch_version: str
    cuda_version: str | None
    gpu_name: str | None
    driver_version: str | None
    architecture: str | None
    hidden_size: int | None
    cudagraph_mode: str
    capture_sizes: list[int]
    policy: str  # the order this capture ran ("descending" for profiling)
    requested_policy: str  # STAGING_PLUGIN_ORDER
    presize: str
    rank: int
    is_last_pp_rank: bool
    pid: int


class ReceiptStart(_Start, total=False):
    """Known when the capture starts, with the fields a receipt of an older plugin lacks."""

    ranks_agreed: int | None  # ranks whose capture plan matched (None: not checked)
    vllm_sizes_staging: bool  # vLLM sizes the staging itself (its release shape, or seen doing so)
    captured_modes: list[str]  # each descriptor's mode in capture order (set when the capture ends)


class Receipt(ReceiptStart):
    """One receipt as written and as read back: the start's fields and those known when the capture ends."""

    captured_sequence: dict[str, list[int]]
    capacity: int
    staging_bytes: dict[str, dict[str, Any]]
    capture_seconds: float
    graph_memory_bytes: int | None
    graph_pool_reserved_bytes: int | None
    graph_pool_active_bytes: int | None
    profiling_estimate_bytes: int | None
    created_unix: float


REQUIRED_FIELDS = tuple(sorted(Receipt.__required_keys__))
_counter = itertools.count()


def write_receipt(directory: Path, receipt: Receipt) -> Path:
    """Write ``receipt`` atomically into ``directory`` (created if needed); returns its path."""
    missing = [f for f in REQUIRED_FIELDS if f not in receipt]
    if missing:
        raise ValueError(f"receipt lacks fields: {', '.join(missing)}")
    directory.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().replace(os.sep, "_")
    name = f"receipt-{receipt['kind']}-{host}-pid{os.getpid()}-rank{receipt['rank']}-{next(_counter)}"
    target = directory / f"{name}-{time.time_ns()}.json"
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
