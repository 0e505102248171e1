"""The vLLM releases this repository tests against, in release order: one list for the compat matrix
(``lab/compat_matrix.py``, every release) and the atlas (``lab/stock_atlas.py``, the supported ones).
"""

from __future__ import annotations

RELEASES: tuple[str, ...] = (
    "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0",
    "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
    "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
    "0.34.0",
)  # fmt: skip
FIRST_SUPPORTED = "0.18.0"  # the first release with Model Runner V2's ModelCudaGraphManager
SUPPORTED: tuple[str, ...] = RELEASES[RELEASES.index(FIRST_SUPPORTED) :]


def span(text: str) -> tuple[str, ...]:
    """``"0.18.0"`` or ``"0.18.0-0.23.0"`` (inclusive, in release order) as the releases it names."""
    first, _, last = text.partition("-")
    if first not in RELEASES or (last or first) not in RELEASES:
        raise ValueError(f"unknown vLLM release in {text!r} (known: {RELEASES[0]}-{RELEASES[-1]})")
    lo, hi = RELEASES.index(first), RELEASES.index(last or first)
    if lo > hi:
        raise ValueError(f"release range {text!r} runs backwards")
    return RELEASES[lo : hi + 1]
