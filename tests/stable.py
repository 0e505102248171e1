"""Operator-facing messages are tested by their stable parts, the way operators grep and act on them.

The first part opens the message (the plugin's name and the sentence's key phrase); the others are the
values, variables and advice it names, in order; ``end`` is how it ends, where that is a fact. The prose
between them is free to change without touching a test.
"""

from __future__ import annotations


def assert_says(message: str, opening: str, *parts: str, end: str | None = None) -> None:
    assert message.startswith(opening), f"{message!r} does not open with {opening!r}"
    at = len(opening)
    for part in parts:
        found = message.find(part, at)
        assert found >= 0, f"{message!r} lacks {part!r} after its first {at} characters"
        at = found + len(part)
    if end is not None:
        assert message.endswith(end) and len(message) - len(end) >= at, f"{message!r} does not end {end!r}"
