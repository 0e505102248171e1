"""Sets of integers as compact range text ("1-7,9-15,20"): how the summary stores crashing max_num_seqs."""

from __future__ import annotations

from collections.abc import Sequence


def as_ranges(values: Sequence[int]) -> str:
    """Sorted integers as "1-7,9-15,20"."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def from_ranges(text: str) -> list[int]:
    """The integers of "1-7,9-15,20" (the inverse of :func:`as_ranges`)."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
