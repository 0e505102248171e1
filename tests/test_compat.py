"""What the patch relies on in vLLM, checked by structure: the exact refusals, the platform, the versions."""

from __future__ import annotations

import sys
import types
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import fresh_class, make_module
from stable import assert_says

from vllm_staging_plugin._engine import compat


def _init(self: Any, config: Any, uses_mrope: bool, device: Any) -> None: ...


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (None, "vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager is missing (vLLM < 0.18.0?)"),
        ({"capture": lambda self: None}, "ModelCudaGraphManager.__init__ is not defined on the class"),
        ({"__init__": _init}, "ModelCudaGraphManager.capture is not defined on the class"),
        (
            {"__init__": _init, "capture": "not callable"},
            "ModelCudaGraphManager.capture is not defined on the class",
        ),
        (
            {"__init__": _init, "capture": lambda self: None},
            "ModelCudaGraphManager.__init__ takes (config, uses_mrope, device), expected it to start with "
            "(vllm_config, device, cudagraph_mode, decode_query_len) or "
            "(vllm_config, device, cudagraph_mode, decode_query_lens)",
        ),
    ],
    ids=["class missing", "no __init__", "no capture", "capture not callable", "signature changed"],
)
def test_the_structure_refusals_word_for_word(members: dict[str, Any] | None, message: str) -> None:
    module = make_module(None if members is None else type("ModelCudaGraphManager", (), members))
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.manager_class(module)
    assert str(caught.value) == message


def test_trailing_init_parameters_are_accepted() -> None:
    """Releases append parameters (lora_capture_cases, varlen_decode, ubatch_runner): still supported."""
    cls = fresh_class()
    assert compat.manager_class(make_module(cls)) is cls

    def longer(self: Any, vllm_config: Any, device: Any, cudagraph_mode: Any, decode_query_len: int,
               lora_capture_cases: Any = None, ubatch_runner: Any = None) -> None: ...  # fmt: skip

    cls = fresh_class(__init__=longer)
    assert compat.manager_class(make_module(cls)) is cls


def _manager(**state: Any) -> Any:
    initial = {"_capture_descs": {}, "hidden_states": None, "aux_hidden_states": [],
               "vllm_config": SimpleNamespace()}  # fmt: skip
    return SimpleNamespace(**(initial | state))


def test_check_manager_accepts_vllms_initial_state_with_or_without_intermediate_tensors() -> None:
    compat.check_manager(_manager())  # before vLLM 0.19.0: no intermediate_tensors
    compat.check_manager(_manager(intermediate_tensors=None))


@pytest.mark.parametrize(
    ("manager", "message"),
    [
        (SimpleNamespace(), "ModelCudaGraphManager._capture_descs is missing or not a dict"),
        (_manager(_capture_descs=[[]]), "ModelCudaGraphManager._capture_descs is missing or not a dict"),
        (
            _manager(_capture_descs={"FULL": [SimpleNamespace(num_tokens=True)]}),
            None,  # a bool is an int: accepted
        ),
        (
            _manager(_capture_descs={"FULL": [SimpleNamespace(num_tokens="4")]}),
            "capture descriptors for FULL have no integer num_tokens",
        ),
        (
            SimpleNamespace(_capture_descs={}, aux_hidden_states=[]),
            "ModelCudaGraphManager.hidden_states is not set by __init__",
        ),
        (
            SimpleNamespace(_capture_descs={}, hidden_states=None),
            "ModelCudaGraphManager.aux_hidden_states is not set by __init__",
        ),
        (_manager(aux_hidden_states=()), "ModelCudaGraphManager.aux_hidden_states starts as (), expected []"),
        (
            _manager(intermediate_tensors=0),
            "ModelCudaGraphManager.intermediate_tensors starts as 0, expected None",
        ),
        (_manager(vllm_config=None), "ModelCudaGraphManager.vllm_config is not set by __init__"),
        (
            SimpleNamespace(_capture_descs={}, hidden_states=None, aux_hidden_states=[]),
            "ModelCudaGraphManager.vllm_config is not set by __init__",
        ),
    ],
    ids=[
        "no descriptors",
        "descriptors a list",
        "bool tokens",
        "str tokens",
        "no hidden_states",
        "no aux_hidden_states",
        "aux a tuple",
        "intermediate_tensors set",
        "vllm_config None",
        "no vllm_config",
    ],
)
def test_check_manager_refusals_word_for_word(manager: Any, message: str | None) -> None:
    if message is None:
        compat.check_manager(manager)
        return
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.check_manager(manager)
    assert str(caught.value) == message


def test_platform_name_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    platforms = pytest.importorskip("vllm.platforms")

    class OotPlatform:
        pass

    monkeypatch.setattr(platforms, "current_platform", SimpleNamespace(_enum=SimpleNamespace(name="CUDA")))
    assert compat.platform_name() == "cuda"
    compat.check_platform()
    monkeypatch.setattr(platforms, "current_platform", OotPlatform())
    assert compat.platform_name() == "ootplatform"
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.check_platform()
    assert_says(
        str(caught.value),
        "platform 'ootplatform' is not one of cuda, rocm, cpu, unspecified",
        "out-of-tree platforms",
    )


def test_installed_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compat.installed_versions() == {
        "vllm": metadata.version("vllm"),
        "torch": metadata.version("torch"),
    }

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert compat.installed_versions() == {"vllm": None, "torch": None}


# ---- the profiling pass's mark: 0.29.0-0.33.0, upstream main, a release without a profiling capture ----
# Upstream main's shape as read in vllm/v1/worker/gpu/cudagraph_utils.py, the public code index's newest
# copy (after vllm-project/vllm#51700; the index names no commit): CudaGraphManager.__init__ sets
# ``self._sample_full_descs = False`` (no ``_max_full_descs_to_capture``); profile_cudagraph_memory sets
# it True on the manager it profiles.


@pytest.mark.parametrize(
    ("state", "module_has_profiling", "expected"),
    [
        ({"_max_full_descs_to_capture": None}, True, False),  # 0.29.0-0.33.0, the real capture
        ({"_max_full_descs_to_capture": 2}, True, True),  # 0.29.0-0.33.0, vLLM's profiling capture
        ({"_sample_full_descs": False}, True, False),  # upstream main, the real capture
        ({"_sample_full_descs": True}, True, True),  # upstream main, the profiling capture
        ({}, False, False),  # no profile_cudagraph_memory in the module: no profiling capture at all
        ({}, True, None),  # profiling exists but is marked some other way: cannot tell
        ({"_sample_full_descs": 1}, True, None),  # not main's bool: not recognized either
    ],
    ids=[
        "0.33-capture",
        "0.33-profiling",
        "main-capture",
        "main-profiling",
        "no-profiling",
        "unknown",
        "not-a-bool",
    ],
)
def test_the_profiling_pass_is_recognized_in_each_shape(
    monkeypatch: pytest.MonkeyPatch, state: dict[str, Any], module_has_profiling: bool, expected: bool | None
) -> None:
    module = types.ModuleType(compat.CUDAGRAPH_MODULE)
    if module_has_profiling:
        module.profile_cudagraph_memory = lambda runner: 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, compat.CUDAGRAPH_MODULE, module)
    assert compat.profiling_pass(SimpleNamespace(**state)) is expected


@pytest.mark.parametrize(("deltas", "read"), [([3, 1], [3, 1]), (None, None), ("3, 1", None), ((3, 1), None)])
def test_the_profiling_deltas_are_read_only_as_vllms_list(deltas: Any, read: Any) -> None:
    assert compat.profiling_deltas(SimpleNamespace(_capture_mem_samples=deltas)) == read
    assert compat.profiling_deltas(SimpleNamespace()) is None  # outside vLLM's profiling pass


@pytest.mark.parametrize("value", ["absent", 5, None])
def test_no_extrapolation_where_the_module_has_no_callable_one(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType(compat.CUDAGRAPH_MODULE)
    if value != "absent":
        setattr(module, compat.PROFILING_EXTRAPOLATION, value)
    monkeypatch.setitem(sys.modules, compat.CUDAGRAPH_MODULE, module)
    assert compat.full_graph_extrapolation() is None
    setattr(module, compat.PROFILING_EXTRAPOLATION, len)
    assert compat.full_graph_extrapolation() is len
