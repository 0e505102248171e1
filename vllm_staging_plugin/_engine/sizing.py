"""The sizing rule: pure functions over capture descriptors, no vLLM import.

A descriptor's ``num_tokens`` is the padded batch it writes into the staging buffers, so the buffers
need as many rows as the largest descriptor of any mode (PIECEWISE, FULL, LoRA cases, DBO twins).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Protocol

_NUM_TOKENS = attrgetter("num_tokens")


class Descriptor(Protocol):
    @property
    def num_tokens(self) -> int: ...


def staging_capacity(capture_descs: Mapping[Any, Iterable[Descriptor]]) -> int:
    """Rows the staging buffers need: the largest ``num_tokens``; 0 when nothing is captured.

    ``map``/``chain`` rather than a generator: the capture wrapper calls this once per capture, and it runs
    no Python frame per descriptor (the footprint test counts them).
    """
    return int(max(map(_NUM_TOKENS, chain.from_iterable(capture_descs.values())), default=0))


CAPTURE_MODE_ORDER = ("PIECEWISE", "FULL")  # vLLM captures PIECEWISE first, then FULL


def capture_sequence(capture_descs: Mapping[Any, Sequence[Descriptor]]) -> dict[str, list[int]]:
    """``num_tokens`` per mode in capture order, keyed by mode name (receipts, CLI plan)."""
    named = {_mode_name(mode): [int(d.num_tokens) for d in descs] for mode, descs in capture_descs.items()}
    rank = {name: i for i, name in enumerate(CAPTURE_MODE_ORDER)}
    return dict(sorted(named.items(), key=lambda item: rank.get(item[0], len(rank))))


def staging_bytes(rows: int, trailing_shape: Sequence[int], element_size: int) -> int:
    """Bytes of one buffer of ``rows`` rows: rows x prod(trailing dims) x element size."""
    size = rows * element_size
    for dim in trailing_shape:
        size *= int(dim)
    return size


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode))
