"""Read receipts back: every complete receipt under a directory, the bad ones named and skipped.

The schema is the engine's (:class:`vllm_staging_plugin._engine.receipts.Receipt`); this module runs on the
operator's machine only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from .._engine.receipts import REQUIRED_FIELDS, SCHEMA, Receipt

logger = logging.getLogger("vllm.staging_plugin")

Skip = Callable[[Path, str], None]
"""Told about each JSON file that is not a receipt: its path and why."""


def read_receipts(directory: Path, on_skip: Skip | None = None) -> list[Receipt]:
    """Every complete receipt in the ``*.json`` files under ``directory`` (recursively, whatever their name;
    ``write_receipt``'s ``.tmp-*`` files are ignored), oldest first.

    Receipts gathered from many hosts include partial copies and foreign files: each JSON file that
    cannot be read, is not JSON, is of another schema or lacks fields is passed to
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
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
        return None, f"not a receipt of schema {SCHEMA} (schema: {schema!r})"
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        return None, f"incomplete receipt, lacks fields: {', '.join(missing)}"
    if not all(_is_number(data[key]) for key in ("created_unix", "pid")):
        return None, "created_unix or pid is not a number"
    return cast(Receipt, data), ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _warn_skipped(path: Path, reason: str) -> None:
    logger.warning("vllm-staging-plugin: skipped %s: %s", path, reason)
