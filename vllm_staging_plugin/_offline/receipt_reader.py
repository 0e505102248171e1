"""Read receipts back: every complete receipt under a directory, the bad ones named and skipped."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from .._engine.receipts import REQUIRED_FIELDS, SCHEMA, Receipt
from .text import json_kind

logger = logging.getLogger("vllm.staging_plugin")


def read_receipts(directory: Path, on_skip: Callable[[Path, str], None] | None = None) -> list[Receipt]:
    """Every complete receipt in the ``*.json`` files under ``directory`` (recursively, whatever their name;
    ``write_receipt``'s ``.tmp-*`` files are ignored), oldest first.

    Receipts gathered from many hosts include partial copies and foreign files: each JSON file that
    cannot be read, is not JSON, is of another schema, lacks fields or holds a field of the wrong type
    (:data:`FIELD_TYPES`) is passed to
    ``on_skip`` (default: one warning naming it) and left out, so one bad copy never hides the others.
    """
    skip = on_skip or _warn_skipped
    receipts: list[Receipt] = []
    for path in sorted(directory.rglob("*.json")):
        if path.name.startswith(".tmp-"):  # a receipt being written right now (write_receipt's temporary)
            continue
        data, problem = _load(path)
        if data is None:
            skip(path, problem)
        else:
            receipts.append(data)
    return sorted(receipts, key=lambda r: (r["created_unix"], r["pid"]))


def _load(path: Path) -> tuple[Receipt | None, str]:
    """The receipt in ``path``, or None and the reason it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(data, dict):
        return None, f"not a receipt of schema {SCHEMA} (a JSON {json_kind(data)}, not an object)"
    if data.get("schema") != SCHEMA:
        return None, f"not a receipt of schema {SCHEMA} (schema: {data.get('schema')!r})"
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        return None, f"incomplete receipt, lacks fields: {', '.join(missing)}"
    wrong = [key for key, fits in FIELD_TYPES.items() if key in data and not fits(data[key])]
    if wrong:
        return None, f"fields of the wrong type: {', '.join(wrong)}"
    return cast(Receipt, data), ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number_or_none(value: Any) -> bool:
    return value is None or _is_number(value)


FIELD_TYPES: dict[str, Callable[[Any], bool]] = {
    # what the readers compute with (sort, group, take medians of): a receipt holding anything else there
    # is skipped like an incomplete one, never a crash of the report
    "created_unix": _is_number,
    "pid": _is_number,
    "capture_sizes": lambda v: v is None or (isinstance(v, list) and all(_is_number(x) for x in v)),
    "capture_seconds": _number_or_none,
    "graph_memory_bytes": _number_or_none,
    "graph_pool_reserved_bytes": _number_or_none,
    "graph_pool_active_bytes": _number_or_none,
    "profiling_estimate_bytes": _number_or_none,
}


def _warn_skipped(path: Path, reason: str) -> None:
    logger.warning("vllm-staging-plugin: skipped %s: %s", path, reason)
