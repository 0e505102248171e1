"""The crash family's condition as arithmetic over the user-facing settings, with no manager involved.

The atlas checks these against the real manager's outcomes (the summary's mismatch counts must be 0), and
tests/test_atlas_widths.py checks the recorded sweep against them, so they stay free of vLLM imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .space import Setting

FAMILY = "recoverssm-piecewise-cap"


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def predicted_crash(setting: Setting) -> bool:
    """The family's condition in the settings' terms, computed without the manager.

    recover-SSM on, FULL_AND_PIECEWISE, no varlen decode, and some capture size rounded up to a multiple
    of a decode query length q stays within max_num_seqs x decode_query_len, the largest capture size
    and max_num_seqs requests, yet exceeds the largest capture size within max_num_seqs x decode_query_len.
    """
    if not (setting["kda"] and setting["mode"] == "FULL_AND_PIECEWISE" and not setting["varlen"]):
        return False
    sizes, ms, dql = setting["sizes"], setting["max_num_seqs"], setting["decode_query_len"]
    bound = ms * dql
    queries = {t[2] + 1 for t in setting["schedule"]} if setting["schedule"] else {dql}
    largest_piecewise = max((s for s in sizes if s <= bound), default=0)
    full = [
        round_up(s, q)
        for s in sizes
        for q in queries
        if round_up(s, q) <= min(bound, max(sizes)) and round_up(s, q) // q <= ms
    ]
    return max(full, default=0) > largest_piecewise


def fixed_width_rule(sizes: Sequence[int], max_num_seqs: int, decode_query_len: int) -> bool:
    """The condition for a fixed width (no schedule), reduced: P, the largest capture size within
    max_num_seqs x decode_query_len, is neither the grid's largest size nor a multiple of decode_query_len
    (stock then allocates P rows and the first FULL descriptor, round_up(P, decode_query_len), crashes)."""
    p = max((s for s in sizes if s <= max_num_seqs * decode_query_len), default=0)
    return p != max(sizes) and p % decode_query_len != 0


def descriptor_crash(descs: tuple[tuple[str, tuple[Any, ...]], ...]) -> bool:
    """FULL_AND_PIECEWISE staging in vLLM's order, read off the descriptors: PIECEWISE is captured first and
    its largest size allocates the buffers; a larger FULL descriptor then crashes."""
    tops = {mode: max((d.num_tokens for d in ds), default=0) for mode, ds in descs}
    return tops.get("PIECEWISE", 0) > 0 and tops.get("FULL", 0) > tops["PIECEWISE"]


def family_setting(setting: Setting, pp: str) -> bool:
    """The operator table's configurations: where the family can live, at the default LoRA/DBO knobs."""
    return (
        setting["mode"] == "FULL_AND_PIECEWISE"
        and setting["kda"]
        and not setting["varlen"]
        and setting["lora"] is None
        and not setting["dbo"]
        and pp == "only"
    )
