"""The atlas's configuration space: the searched grids, searches and knobs, and the settings they expand to.

A setting is a plain dict (its ``repr`` and keys are what the summary records); :func:`replay_config`
turns one, at a pipeline position, into the ``ReplayConfig`` the CPU replay runs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import probes

if TYPE_CHECKING:
    from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

Setting = dict[str, Any]
Schedule = tuple[tuple[int, int, int], ...]

MODES = ("FULL", "FULL_DECODE_ONLY", "PIECEWISE", "FULL_AND_PIECEWISE")
CUSTOM_GRIDS: dict[str, tuple[int, ...]] = {
    "cc=[1,2,4,8,16]": (1, 2, 4, 8, 16),
    "cc=[1..8]": tuple(range(1, 9)),
    "cc=[1,2,4,...,512]": tuple(2**i for i in range(10)),
    "cc=[8,24,40]": (8, 24, 40),
}
WIDE_GRIDS: dict[str, tuple[int, ...]] = {  # the widths search adds these
    "cc=[1,2,4,...,1024]": tuple(2**i for i in range(11)),
    "cc=[8,16,...,512]": tuple(range(8, 513, 8)),
}
GRIDS = {**CUSTOM_GRIDS, **WIDE_GRIDS}
MAX_GRIDS = (16, 512)  # operator-set max_cudagraph_capture_size; vLLM derives the grid below it
LORA_CASES = [0, 1, 2, 3]  # get_lora_capture_cases for max_loras=2 with cudagraph_specialize_lora
DBO_THRESHOLD = 2  # the smallest dbo_decode_token_threshold vLLM accepts: twins at every eligible size
PP = {"only": (True, True), "first-of-2": (True, False), "last-of-2": (False, True)}  # (first, last)
HIDDEN = 8  # staging rows decide the crash; a small hidden size keeps the replay fast


@dataclass(frozen=True)
class Search:
    """One search: the values of each dimension (grids by name; the derived ones per ceiling)."""

    max_num_seqs: tuple[int, ...]
    speculative_tokens: tuple[int, ...]
    pp: tuple[str, ...]
    modes: tuple[str, ...] = MODES
    max_grids: tuple[int, ...] = MAX_GRIDS
    grids: tuple[str, ...] = tuple(CUSTOM_GRIDS)  # operator-set cudagraph_capture_sizes, names in GRIDS
    derived_ceilings: tuple[int, ...] = (512,)  # vLLM's default ceiling: 512, 1024 on data-centre Blackwell
    lora_and_dbo: bool = True  # False: LoRA capture cases and DBO at their defaults only (none, off)


SEARCHES = {
    "full": Search((1, 2, 3, 4, 8, 32, 256), (0, 1, 2, 4), ("only", "first-of-2", "last-of-2")),
    "subset": Search((1, 4, 8, 256), (0, 2, 4), ("only", "first-of-2")),
    "widths": Search(
        (1, 2, 4, 6, 8, 16, 32, 48, 64, 128, 256, 512),
        tuple(range(1, 11)),
        ("only",),
        modes=("FULL_AND_PIECEWISE",),
        max_grids=(16, 256, 512, 1024),
        grids=tuple(GRIDS),
        derived_ceilings=(512, 1024),
        lora_and_dbo=False,
    ),
}
SWEEP_MAX_NUM_SEQS = tuple(range(1, 513))  # widths: the family's settings at every max_num_seqs, unreplayed
SPOTLIGHT: dict[str, Any] = {
    "name": "Kimi-K3",
    "max_num_seqs": 48,
    "num_speculative_tokens": 8,
    "grid": "cc=[1,2,4,...,512]",
}


def tapered(max_num_seqs: int, n: int) -> Schedule:
    """A dense schedule: n draft tokens up to half the batch, 1 above (vLLM's (start, end, tokens))."""
    half = max_num_seqs // 2
    return ((1, half, n), (half + 1, max_num_seqs, 1))


def derived_name(ceiling: int) -> str:
    return f"derived-{ceiling}" if ceiling != 512 else "derived"


def grid_names(search: Search) -> list[str]:
    derived = [derived_name(c) for c in search.derived_ceilings]
    return [*derived, *(f"max={m}" for m in search.max_grids), *search.grids]


@contextlib.contextmanager
def platform_ceiling(ceiling: int) -> Iterator[None]:
    """vLLM's derived-grid ceiling is 1024 on data-centre Blackwell (capability family 100), else 512:
    answer that question as such a GPU would, only for the block (vLLM's ``_set_cudagraph_sizes`` asks it)."""
    if ceiling == 512:
        yield
        return

    with probes.capability_family(100):
        yield


def settings(search: Search, feats: dict[str, bool], skipped: list[str]) -> Iterator[Setting]:
    """Every searched setting except the pipeline position (which does not change the descriptors).

    A vLLM-derived grid the release cannot derive is left out, and the first such failure is noted in
    ``skipped``.
    """

    derived_ok = True
    for ms, n in itertools.product(search.max_num_seqs, search.speculative_tokens):
        schedules: list[Schedule | None] = [None]
        if feats["dense_schedule"] and n >= 2 and ms >= 2:
            schedules.append(tapered(ms, n))
        for schedule in schedules:
            grids: dict[str, tuple[int, ...]] = {}
            derived = [(derived_name(c), None, c) for c in search.derived_ceilings]
            for name, limit, ceiling in [*derived, *((f"max={m}", m, 512) for m in search.max_grids)]:
                try:
                    with platform_ceiling(ceiling):
                        grids[name] = tuple(probes.derived_capture_sizes(ms, n, schedule, limit))
                except Exception as exc:
                    if derived_ok:
                        skipped.append(f"vLLM-derived grids: {type(exc).__name__}: {exc}"[:200])
                    derived_ok = False
            grids.update({name: GRIDS[name] for name in search.grids})
            knobs = itertools.product(
                search.modes,
                [False, True] if feats["varlen_decode"] and n else [False],
                [None, LORA_CASES] if feats["lora_capture_cases"] and search.lora_and_dbo else [None],
                [False, True] if feats["dbo"] and search.lora_and_dbo else [False],
                [False, True] if feats["kda_recoverssm"] and n else [False],
            )
            for (mode, varlen, lora, dbo, kda), (grid, sizes) in itertools.product(knobs, grids.items()):
                yield {
                    "mode": mode, "grid": grid, "sizes": sizes, "max_num_seqs": ms, "decode_query_len": n + 1,
                    "schedule": schedule, "varlen": varlen, "lora": lora, "dbo": dbo, "kda": kda,
                }  # fmt: skip


def replay_config(setting: Setting, pp: str) -> ReplayConfig:
    """The CPU replay's configuration for ``setting`` at pipeline position ``pp`` (a key of :data:`PP`)."""

    first, last = PP[pp]
    return probes.KnobbedReplay(
        mode=setting["mode"], sizes=setting["sizes"], max_num_seqs=setting["max_num_seqs"],
        decode_query_len=setting["decode_query_len"], hidden_size=HIDDEN, lora_capture_cases=setting["lora"],
        use_kda_recoverssm=setting["kda"], varlen_decode=setting["varlen"], dbo=setting["dbo"],
        dbo_decode_token_threshold=DBO_THRESHOLD, speculative_schedule=setting["schedule"],
        first_pp_rank=first, last_pp_rank=last,
        pipeline_parallel_size=1 if pp == "only" else 2,
    )  # fmt: skip
