"""How the operator's tools print values: one place for MiB, shortened token lists, buffer lines and the
JSON kind of a value that should have been an object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MIB = 1024 * 1024


def first_line(text: str) -> str:
    """The first line of an error that says something: blank lines and pydantic's own header and link
    lines are skipped (``1 validation error for ...``, ``For further information visit ...``)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if "validation error" not in line and "errors.pydantic" not in line]
    return (useful or lines or [text.strip()])[0]


def shorten(values: Sequence[int], keep: int = 5) -> str:
    """``1, 2, 4`` in full up to ``2 * keep + 2`` values, else the first and last ``keep`` around ``...``."""
    if len(values) <= 2 * keep + 2:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[:keep])) + ", ..., " + ", ".join(map(str, values[-keep:]))


def describe_buffers(buffers: Mapping[str, Mapping[str, Any]]) -> str:
    """``hidden_states [512, 4096] bfloat16 = 4.00 MiB; ...`` (``none allocated`` when empty)."""
    if not buffers:
        return "none allocated"
    return "; ".join(
        f"{name} {b['shape']} {b['dtype']} = {b['bytes'] / MIB:.2f} MiB" for name, b in buffers.items()
    )


JSON_KINDS: dict[type, str] = {
    list: "list",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
    type(None): "null",
}


def json_kind(value: object) -> str:
    """What JSON calls ``value`` (as ``json.loads`` returned it): ``list``, ``string``, ``number``, ..."""
    return JSON_KINDS.get(type(value), type(value).__name__)
