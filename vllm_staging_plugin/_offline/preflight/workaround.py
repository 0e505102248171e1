"""A way out without the plugin: the smallest grid change that makes stock vLLM boot, verified by replay.

Adding the largest FULL decode size to ``cudagraph_capture_sizes`` makes PIECEWISE capture that size first.
``verified`` is the whole check run again on the changed arguments, not this module's arithmetic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..text import first_line

# What one verification returns: stock booted, vLLM's capture plan, and the grid vLLM ended up with.
StockCheck = Callable[[Sequence[str]], tuple[bool, dict[str, list[int]], list[int]]]
ATTEMPTS = 8
COMPILATION_FLAGS = ("-cc", "--compilation-config", "--compilation_config")
GRID_FLAGS = ("--cudagraph-capture-sizes", "--cudagraph_capture_sizes")
TOP_FLAGS = ("--max-cudagraph-capture-size", "--max_cudagraph_capture_size")
SPECULATIVE_FLAGS = ("--speculative-config", "--speculative_config")


@dataclass
class Workaround:
    cudagraph_capture_sizes: list[int]
    verified: bool
    extra_graphs: int
    serve_arguments: list[str]
    nearby_widths: list[int] = field(default_factory=list)
    """Speculative token counts next to the operator's at which their own grid boots stock."""
    note: str | None = None

    @property
    def argument(self) -> str:
        return f"-cc '{json.dumps({'cudagraph_capture_sizes': self.cudagraph_capture_sizes})}'"

    def to_json(self) -> dict[str, Any]:
        return {
            "cudagraph_capture_sizes": self.cudagraph_capture_sizes,
            "verified": self.verified,
            "extra_graphs": self.extra_graphs,
            "argument": self.argument,
            "serve_arguments": self.serve_arguments,
            "nearby_widths": self.nearby_widths,
            "note": self.note,
        }


def graphs(plan: dict[str, list[int]]) -> int:
    return sum(len(tokens) for tokens in plan.values())


def widest(plan: dict[str, list[int]]) -> int:
    """The largest descriptor's ``num_tokens``: the rows every staging buffer needs (0: no graph)."""
    return max((n for tokens in plan.values() for n in tokens), default=0)


def find(
    argv: Sequence[str],
    sizes: Sequence[int],
    plan: dict[str, list[int]],
    stock_check: StockCheck,
    speculative_tokens: int,
    query_lengths: Sequence[int] = (),
) -> Workaround:
    """The cheapest verified grid: the operator's plus one size (the largest FULL descriptor, else that
    rounded up to a multiple of every decode query length, which no tier rounds further), else grown by
    the largest descriptor until stock boots (at most ATTEMPTS replays)."""
    capacity = widest(plan)
    common = math.lcm(*query_lengths) if query_lengths else 1
    single = dict.fromkeys([capacity, -(-capacity // common) * common])
    tried: tuple[list[int], dict[str, list[int]], list[str], str | None] | None = None
    for size in single:
        grid = sorted({*sizes, size})
        ok, current, words, note = _verify(argv, grid, stock_check)
        if ok:
            return _answer(argv, grid, words, current, plan, speculative_tokens, stock_check)
        tried = tried or (grid, current, words, note)
    assert tried is not None
    grid, current, words, note = tried
    for _ in range(ATTEMPTS):
        if note is not None:
            break
        grid = sorted({*grid, widest(current)})
        ok, current, words, note = _verify(argv, grid, stock_check)
        if ok:
            return _answer(argv, grid, words, current, plan, speculative_tokens, stock_check)
    return Workaround(grid, False, graphs(current) - graphs(plan), words, [], note or "no verified grid")


def _verify(
    argv: Sequence[str], grid: list[int], stock_check: StockCheck
) -> tuple[bool, dict[str, list[int]], list[str], str | None]:
    """Replay stock on ``argv`` with ``grid``: (boots, its plan, the arguments, why it cannot tell)."""
    words = with_grid(argv, grid)
    try:
        ok, current, used = stock_check(words)
    except Exception as exc:  # vLLM refused the new grid: say so, verified stays false
        return (
            False,
            {},
            words,
            f"vLLM refused the changed grid: {type(exc).__name__}: {first_line(str(exc))}",
        )
    if used != grid:
        return False, current, words, f"vLLM did not take the grid as given (it used {used})"
    return ok, current, words, None


def _answer(
    argv: Sequence[str],
    grid: list[int],
    words: list[str],
    current: dict[str, list[int]],
    plan: dict[str, list[int]],
    speculative_tokens: int,
    stock_check: StockCheck,
) -> Workaround:
    nearby = _nearby(argv, speculative_tokens, stock_check)
    return Workaround(grid, True, graphs(current) - graphs(plan), words, nearby)


def _nearby(argv: Sequence[str], tokens: int, stock_check: StockCheck) -> list[int]:
    """Widths one below and one above the operator's at which their own grid boots stock."""
    safe = []
    for width in (tokens - 1, tokens + 1):
        words = with_speculative_tokens(argv, width) if width >= 1 else None
        if words is None:
            continue
        try:
            if stock_check(words)[0]:
                safe.append(width)
        except Exception:  # a width vLLM refuses is not a way out
            continue
    return safe


def with_grid(argv: Sequence[str], grid: list[int]) -> list[str]:
    """``argv`` with its grid options replaced by ``cudagraph_capture_sizes = grid``.

    A JSON ``-cc``/``--compilation-config`` keeps its other keys and loses ``max_cudagraph_capture_size``
    (vLLM takes the top from the sizes); ``--cudagraph-capture-sizes`` and ``--max-cudagraph-capture-size``
    (and their dotted ``-cc.`` forms) are dropped. Without a JSON compilation config, one is appended.
    """
    out: list[str] = []
    placed = False
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=")
        if flag in GRID_FLAGS:  # nargs='+': its values run to the next option
            i += 1
            while not eq and i < len(words) and not words[i].startswith("-"):
                i += 1
            continue
        if flag in TOP_FLAGS or _dotted_grid_key(flag):
            i += 1 if eq else 2
            continue
        if flag in COMPILATION_FLAGS and i + (0 if eq else 1) < len(words):
            text = inline if eq else words[i + 1]
            config = _json_object(text)
            if config is not None:
                config.pop("max_cudagraph_capture_size", None)
                config["cudagraph_capture_sizes"] = grid
                out += [f"{flag}={json.dumps(config)}"] if eq else [flag, json.dumps(config)]
                placed = True
                i += 1 if eq else 2
                continue
        out.append(word)
        i += 1
    if not placed:
        out += ["-cc", json.dumps({"cudagraph_capture_sizes": grid})]
    return out


def with_speculative_tokens(argv: Sequence[str], tokens: int) -> list[str] | None:
    """``argv`` with ``num_speculative_tokens`` in its JSON ``--speculative-config`` set to ``tokens``
    (a dynamic schedule is left out of this: None), or None when there is no such JSON."""
    words = list(argv)
    for i, word in enumerate(words):
        flag, eq, inline = word.partition("=")
        if flag not in SPECULATIVE_FLAGS or (not eq and i + 1 >= len(words)):
            continue
        config = _json_object(inline if eq else words[i + 1])
        if config is None or "num_speculative_tokens_per_batch_size" in config:
            return None
        config["num_speculative_tokens"] = tokens
        if eq:
            return [*words[:i], f"{flag}={json.dumps(config)}", *words[i + 1 :]]
        return [*words[: i + 1], json.dumps(config), *words[i + 2 :]]
    return None


def _dotted_grid_key(flag: str) -> bool:
    head, dot, key = flag.partition(".")
    return (
        bool(dot)
        and head in COMPILATION_FLAGS
        and key.replace("-", "_") in ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
    )


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
