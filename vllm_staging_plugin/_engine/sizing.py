"""The sizing rule, pure functions over capture descriptors: a descriptor's ``num_tokens`` is the padded
batch it writes into the staging buffers, so they need the rows of the largest descriptor of any mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol


class Descriptor(Protocol):
    @property
    def num_tokens(self) -> int: ...


def staging_capacity(capture_descs: Mapping[Any, Iterable[Descriptor]]) -> int:
    """Rows the staging buffers need: the largest ``num_tokens``; 0 when nothing is captured."""
    return max((int(d.num_tokens) for descs in capture_descs.values() for d in descs), default=0)


CAPTURE_MODE_ORDER = ("PIECEWISE", "FULL")  # vLLM captures PIECEWISE first, then FULL


def capture_sequence(capture_descs: Mapping[Any, Sequence[Descriptor]]) -> dict[str, list[int]]:
    """``num_tokens`` per mode in capture order, keyed by mode name (receipts, CLI plan); a list that
    mixes the modes (an order policy across them) is keyed by its modes joined, as ``PIECEWISE+FULL``."""
    named = sorted(
        (mode_rank(m), _list_name(m, descs), [int(d.num_tokens) for d in descs])
        for m, descs in capture_descs.items()
    )
    return {name: tokens for _, name, tokens in named}


def captured_modes(capture_descs: Mapping[Any, Sequence[Descriptor]]) -> list[str]:
    """Each descriptor's own mode, in capture order (vLLM captures a descriptor in its ``cg_mode``)."""
    ordered = sorted(capture_descs.items(), key=lambda item: mode_rank(item[0]))
    return [mode_name(getattr(d, "cg_mode", mode)) for mode, descs in ordered for d in descs]


def _list_name(mode: Any, descs: Sequence[Descriptor]) -> str:
    modes = dict.fromkeys(getattr(d, "cg_mode", mode) for d in descs)
    return "+".join(mode_name(m) for m in modes) if len(modes) > 1 else mode_name(mode)


def mode_rank(mode: Any) -> int:
    """Where vLLM's capture loop takes ``mode`` (an enum member or its name): PIECEWISE, FULL, others."""
    name = mode_name(mode)
    return CAPTURE_MODE_ORDER.index(name) if name in CAPTURE_MODE_ORDER else len(CAPTURE_MODE_ORDER)


def mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode))
