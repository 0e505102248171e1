"""Per-manager staging: the values vLLM stages, the set-only slot that grows vLLM's first short output, the
capture-time view and the allocation failure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fakes import FULL, PIECEWISE, build, config, descs, install_fake_module, policy_order
from stable import assert_says

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, staging
from vllm_staging_plugin._engine.settings import Settings
from vllm_staging_plugin._engine.staging import StagingError


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    return install_fake_module(monkeypatch)


# ---- the values vLLM stages ----------------------------------------------------------------------


def test_rows_and_emptiness_of_every_staging_value() -> None:
    t = torch.zeros(3, 2)
    assert staging.rows_of(torch.tensor(1.0)) is None and staging.rows_of(t) == 3
    assert staging.rows_of([]) is None and staging.rows_of([t, torch.zeros(5, 2)]) == 3
    assert staging.rows_of(None) is None and staging.rows_of(SimpleNamespace(tensors=[t])) is None
    assert staging.rows_of(SimpleNamespace(tensors={"h": t})) == 3
    assert staging._is_empty(None) and staging._is_empty([])
    assert not staging._is_empty([t]) and not staging._is_empty(t)


def test_presized_keeps_dtype_device_and_trailing_shape() -> None:
    t = torch.zeros(2, 3, 5, dtype=torch.float16)
    grown = staging.presized(t, 7)
    assert (grown.shape, grown.dtype, grown.device) == ((7, 3, 5), torch.float16, t.device)
    assert staging.presized(t, 2) is t and staging.presized(t, 1) is t  # already fits: vLLM's own tensor
    assert [x.shape[0] for x in staging.presized([t, t], 4)] == [4, 4]


def test_presized_passes_through_what_it_cannot_grow() -> None:
    scalar = torch.tensor(1.0)
    assert staging.presized(scalar, 4) is scalar  # 0-dim: nothing to grow
    assert staging.presized(torch.zeros(2), 4).shape == (4,)  # 1-dim grows
    assert staging.presized(None, 4) is None
    other = object()
    assert staging.presized(other, 4) is other
    tensors = {"h": torch.zeros(2, 3)}
    value = SimpleNamespace(tensors=tensors, tag=1)
    grown = staging.presized(value, 5)  # IntermediateTensors-like: a copy with grown tensors
    assert grown.tensors["h"].shape == (5, 3) and grown.tag == 1
    assert value.tensors is tensors and tensors["h"].shape == (2, 3)  # vLLM's own value is left as it was


def test_state_of_reads_only_the_plugins_state() -> None:
    assert staging.state_of(SimpleNamespace(_vllm_staging="not a state")) is None
    assert staging.state_of(SimpleNamespace()) is None
    state = staging.ManagerState(Settings(), capacity=4)
    assert staging.state_of(SimpleNamespace(_vllm_staging=state)) is state


def test_first_tokens_is_the_first_piecewise_descriptor_then_full() -> None:
    assert staging.first_tokens({FULL: descs(FULL, [2, 1]), PIECEWISE: descs(PIECEWISE, [8, 4])}) == 8
    assert staging.first_tokens({PIECEWISE: [], FULL: descs(FULL, [2, 1])}) == 2
    assert staging.first_tokens({"OTHER": descs(FULL, [9])}) is None and staging.first_tokens({}) is None


def test_the_staging_slot_only_intercepts_the_first_assignment() -> None:
    slot = staging._StagingSlot("hidden_states")
    assert not hasattr(slot, "__get__")  # set-only: reads never run plugin code
    owner = SimpleNamespace()
    slot.__set__(owner, torch.zeros(2, 3))  # no plugin state: stored as given
    assert owner.__dict__["hidden_states"].shape == (2, 3)
    del owner.__dict__["hidden_states"]
    state = staging.ManagerState(Settings(), capacity=8)
    owner.__dict__[staging.STATE_ATTR] = state
    slot.__set__(owner, torch.zeros(2, 3))  # vLLM's first, short output: grown
    assert owner.__dict__["hidden_states"].shape == (8, 3)
    later = torch.zeros(2, 3)
    slot.__set__(owner, later)  # a later assignment by vLLM itself: stored as given
    assert owner.__dict__["hidden_states"] is later and not state.vllm_sizes_staging


def test_the_staging_slot_notices_vllm_sizing_its_own_first_buffer() -> None:
    """vLLM's first buffer already holds the capacity although the first descriptor is smaller: kept, and
    the state says vLLM pre-sizes (the patch then stands down)."""
    slot = staging._StagingSlot("hidden_states")
    owner = SimpleNamespace()
    state = owner.__dict__[staging.STATE_ATTR] = staging.ManagerState(Settings(), capacity=8, first_tokens=2)
    own = torch.zeros(8, 3)
    slot.__set__(owner, own)
    assert owner.__dict__["hidden_states"] is own and state.vllm_sizes_staging
    exact = SimpleNamespace()
    state = exact.__dict__[staging.STATE_ATTR] = staging.ManagerState(Settings(), capacity=8, first_tokens=8)
    slot.__set__(exact, torch.zeros(8, 3))  # the largest descriptor came first: nothing to learn
    assert not state.vllm_sizes_staging


def test_the_capture_time_view_is_one_look_alike_subclass(
    fake_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[type] = []

    def capture(self: Any) -> list[int]:
        seen.append(type(self))
        return []

    cls = fake_module.ModelCudaGraphManager
    cls.capture = capture
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    build(cls).capture()
    first = build(cls)
    first.capture()
    assert seen[0] is seen[1] and seen[0] is not cls and issubclass(seen[0], cls)
    assert type(first) is cls  # vLLM's class again after the capture
    assert {name for name in vars(seen[0]) if isinstance(vars(seen[0])[name], staging._StagingSlot)} == set(
        compat.STAGING_INITIAL
    )
    sub = type("ModelCudaGraphManager", (cls,), {})  # an out-of-tree subclass: a view of its own
    build(sub).capture()
    assert seen[2] is not seen[0] and issubclass(seen[2], sub)
    assert (seen[0].__name__, seen[0].__qualname__, seen[0].__module__) == (
        cls.__name__,
        cls.__qualname__,
        cls.__module__,
    )


def test_a_view_has_no_slot_for_an_attribute_the_manager_lacks() -> None:
    """Before vLLM 0.19.0 there is no ``intermediate_tensors``: a set-only slot would answer its read."""
    cls = type("ModelCudaGraphManager", (), {})
    view = staging.capture_view(cls, ("hidden_states", "aux_hidden_states"))
    assert "intermediate_tensors" not in vars(view) and not hasattr(view(), "intermediate_tensors")


# ---- the allocation of the capacity-row buffer fails -------------------------------------------


@pytest.mark.parametrize(
    ("order", "advice"),
    [
        (
            "descending",
            [
                ". vLLM's own order starts with a smaller descriptor here (as recover-SSM with speculative "
                "decoding does: its PIECEWISE sizes stop below the largest FULL decode descriptor), so stock "
                "vLLM would crash",
            ],
        ),
        (
            "ascending",
            [
                "STAGING_PLUGIN_ORDER=ascending captures a 8-row descriptor first",
                "STAGING_PLUGIN_ORDER=descending vLLM's own first output",
            ],
        ),
    ],
)
def test_the_allocation_failure_message_names_the_buffer_the_rows_and_what_to_change(
    order: str, advice: list[str], fake_module: Any, monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    """PIECEWISE (captured first) tops out at 8 rows, FULL needs 16: even vLLM's own order starts short."""
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    mocker.patch.object(staging, "presized", side_effect=torch.OutOfMemoryError("CUDA out of memory"))
    cls = fake_module.ModelCudaGraphManager
    capture_descs = {PIECEWISE: descs(PIECEWISE, [8]), FULL: descs(FULL, [16])}
    manager = cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)
    with pytest.raises(StagingError) as caught:
        manager.capture()
    assert_says(
        str(caught.value),
        "vllm-staging-plugin: allocating hidden_states with 16 rows failed",
        "(OutOfMemoryError: CUDA out of memory)",
        "vLLM's own buffer has 8 rows",
        "needs 16",
        "cannot go on",
        *advice,
        end="free GPU memory (lower gpu_memory_utilization).",
    )
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    assert type(manager) is cls  # no half-swapped class left behind


@pytest.mark.parametrize("order", ["descending", "ascending", "max-first", "shuffle:1", "shuffle:3"])
def test_an_allocation_is_attempted_only_when_vllms_first_buffer_is_short(
    order: str, fake_module: Any, mocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    failing = mocker.patch.object(
        staging, "presized", side_effect=torch.OutOfMemoryError("CUDA out of memory")
    )
    cls = fake_module.ModelCudaGraphManager
    manager = build(cls, piecewise=[1, 2, 4, 8, 16], full=[1, 2, 3])
    first = policy_order(order, "PIECEWISE", manager._capture_descs[PIECEWISE])[0]
    if first.num_tokens == 16:  # largest first (descending, max-first, shuffle:3): capacity rows already
        manager.capture()
        assert failing.call_count == 0 and manager.hidden_states.shape == (16, 8)  # vLLM's own tensor
    else:
        with pytest.raises(StagingError, match=rf"allocating hidden_states with 16 rows failed.*{order}"):
            manager.capture()
        assert failing.call_count == 1
    assert type(manager) is cls  # back on vLLM's class after the capture, whatever happened


def test_first_tokens_reads_modes_by_name_whatever_their_type() -> None:
    import enum

    class GraphMode(enum.Enum):  # vLLM's CUDAGraphMode: str() of a member is not its name
        PIECEWISE = 1
        FULL = 2

    enum_keys = {GraphMode.FULL: descs(FULL, [9, 3]), GraphMode.PIECEWISE: descs(PIECEWISE, [8, 1])}
    assert staging.first_tokens(enum_keys) == 8
    assert staging.first_tokens({"FULL": descs(FULL, [9, 3])}) == 9  # a key without a name attribute
