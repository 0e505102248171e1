"""The sizing rule: the capacity over every descriptor kind, the capture sequence, a buffer's bytes."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FULL, PIECEWISE, Desc, descs

from vllm_staging_plugin._engine.sizing import (
    capture_sequence,
    captured_modes,
    staging_capacity,
)

GraphMode = enum.Enum("GraphMode", "PIECEWISE FULL")  # like vLLM's CUDAGraphMode: str() is not the name


def test_capacity_is_max_over_all_modes_lora_cases_and_dbo_twins() -> None:
    capture_descs = {
        PIECEWISE: descs(PIECEWISE, [1, 8, 64]) + descs(PIECEWISE, [96], num_active_loras=1),
        FULL: [*descs(FULL, [4, 32]), Desc(FULL, 128, num_ubatches=2)],
    }
    assert staging_capacity(capture_descs) == 128
    assert type(staging_capacity({FULL: [Desc(FULL, True)]})) is int  # an int, whatever num_tokens is


@pytest.mark.parametrize("capture_descs", [{}, {FULL: []}, {PIECEWISE: [], FULL: []}])
def test_capacity_is_zero_when_nothing_is_captured(capture_descs: dict[Any, Any]) -> None:
    assert staging_capacity(capture_descs) == 0


def test_capture_sequence_is_keyed_by_mode_name_piecewise_first_unknown_modes_last() -> None:
    sequence = capture_sequence(
        {"NEW_MODE": descs(FULL, [3]), FULL: descs(FULL, [2, 1]), GraphMode.PIECEWISE: descs(PIECEWISE, [4])}
    )
    assert list(sequence.items()) == [("PIECEWISE", [4]), ("FULL", [2, 1]), ("NEW_MODE", [3])]
    assert capture_sequence({}) == {}


def test_a_list_mixing_the_modes_is_named_by_its_modes_and_each_step_keeps_its_own() -> None:
    mixed = [Desc(FULL, 9), Desc(PIECEWISE, 8), Desc(FULL, 3)]  # an order across the modes, under one key
    assert capture_sequence({FULL: mixed}) == {"FULL+PIECEWISE": [9, 8, 3]}
    assert captured_modes({FULL: mixed}) == ["FULL", "PIECEWISE", "FULL"]
    vllms = {FULL: descs(FULL, [2]), PIECEWISE: descs(PIECEWISE, [4, 1])}  # vLLM's dict: FULL first
    assert captured_modes(vllms) == ["PIECEWISE", "PIECEWISE", "FULL"]  # captured PIECEWISE first
    bare = SimpleNamespace(num_tokens=4)  # a descriptor without cg_mode is its list's mode
    assert captured_modes({PIECEWISE: [bare]}) == ["PIECEWISE"]
    assert capture_sequence({PIECEWISE: [bare, Desc(FULL, 1)]}) == {"PIECEWISE+FULL": [4, 1]}
    assert captured_modes({}) == []
