"""The one door to vLLM's and torch's privates for the engine: each is named here once, as a constant or an
accessor, and the offline seams import these names rather than spelling them again.

A release is accepted while one of :data:`SHAPES` holds (docs/compatibility.md gives each boundary); any
other structure leaves vLLM untouched. tests/test_private_doors.py keeps every other engine module out.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

CUDAGRAPH_MODULE = "vllm.v1.worker.gpu.cudagraph_utils"
MANAGER_CLASS = "ModelCudaGraphManager"


@dataclass(frozen=True)
class ReleaseShape:
    """One layout of ``ModelCudaGraphManager``, told apart by the constructor's leading parameters
    (releases that append parameters keep their shape)."""

    releases: str  # where it was read, for messages and docs
    init_prefix: tuple[str, ...]
    vllm_sizes_staging: bool  # vLLM's own capture() sizes the staging buffers by the largest descriptor


SHAPES = (
    ReleaseShape("0.18.0-0.33.0", ("vllm_config", "device", "cudagraph_mode", "decode_query_len"), False),
    # vllm/v1/worker/gpu/cudagraph_utils.py 0.34.0, ModelCudaGraphManager.capture: ``max_tokens`` over
    # ``_capture_descs`` and ``persistent_like`` for hidden, aux and intermediate buffers.
    ReleaseShape("0.34.0", ("vllm_config", "device", "cudagraph_mode", "decode_query_lens"), True),
)
# The manager's capture plan, mode -> descriptors in capture order (private; the staging fix reorders it).
CAPTURE_DESCS = "_capture_descs"
# The staging buffers: attribute -> value ModelCudaGraphManager.__init__ leaves before the first output.
HIDDEN_STATES = "hidden_states"
AUX_HIDDEN_STATES = "aux_hidden_states"
INTERMEDIATE_TENSORS = "intermediate_tensors"
STAGING_INITIAL: dict[str, Any] = {
    HIDDEN_STATES: None,
    AUX_HIDDEN_STATES: [],
    INTERMEDIATE_TENSORS: None,  # absent before 0.19.0: optional
}
OPTIONAL_STAGING = frozenset({INTERMEDIATE_TENSORS})
# Platforms whose graph manager is vLLM's own class; out-of-tree platforms (vllm-ascend's
# ModelAclGraphManager subclass, ...) manage their graphs differently. CPU and "unspecified" capture
# no graphs in production; they are allowed so the real class can be driven in tests and the CLI.
SUPPORTED_PLATFORMS = ("cuda", "rocm", "cpu", "unspecified")


# The profiling pass's mark: 0.29.0-0.34.0 set ``_max_full_descs_to_capture`` (an int) during vLLM's
# memory-profiling capture; upstream main after vllm-project/vllm#51700 sets ``_sample_full_descs`` (True).
# A module without ``profile_cudagraph_memory`` (0.18.0-0.28.x) has no profiling capture.
PROFILING_LIMIT = "_max_full_descs_to_capture"
PROFILING_SAMPLE = "_sample_full_descs"
PROFILING_ENTRY = "profile_cudagraph_memory"
# What a profiling receipt reads to recompute vLLM's graph-memory estimate (0.29.0-0.34.0).
PROFILING_DELTAS = "_capture_mem_samples"
PROFILING_EXTRAPOLATION = "_extrapolate_full_graph_memory"


class IncompatibleVllm(RuntimeError):
    """The installed vLLM lacks the structure the staging fix relies on."""


def manager_class(module: ModuleType) -> type:
    """Return ``ModelCudaGraphManager`` after checking the class-level structure."""
    cls = getattr(module, MANAGER_CLASS, None)
    if not isinstance(cls, type):
        raise IncompatibleVllm(f"{module.__name__}.{MANAGER_CLASS} is missing (vLLM < 0.18.0?)")
    for name in ("__init__", "capture"):
        if not callable(cls.__dict__.get(name)):
            raise IncompatibleVllm(f"{MANAGER_CLASS}.{name} is not defined on the class")
    release_shape(cls)
    return cls


def release_shape(cls: type) -> ReleaseShape:
    """The known shape ``cls``'s constructor has, or IncompatibleVllm naming what it takes instead."""
    params = tuple(inspect.signature(cls.__dict__["__init__"]).parameters)[1:]
    for shape in SHAPES:
        if params[: len(shape.init_prefix)] == shape.init_prefix:
            return shape
    expected = " or ".join(f"({', '.join(shape.init_prefix)})" for shape in SHAPES)
    raise IncompatibleVllm(
        f"{MANAGER_CLASS}.__init__ takes ({', '.join(params)}), expected it to start with {expected}"
    )


def capture_descs(manager: Any) -> dict[Any, list[Any]]:
    """The manager's capture plan, mode -> descriptors, as :func:`check_manager` found it."""
    return getattr(manager, CAPTURE_DESCS)  # type: ignore[no-any-return]


def check_manager(manager: Any) -> None:
    """Check a freshly built manager: descriptors present, staging attributes still empty."""
    descs = getattr(manager, CAPTURE_DESCS, None)
    if not isinstance(descs, Mapping):
        raise IncompatibleVllm(f"{MANAGER_CLASS}.{CAPTURE_DESCS} is missing or not a dict")
    for mode, items in descs.items():
        if not all(isinstance(getattr(d, "num_tokens", None), int) for d in items):
            raise IncompatibleVllm(f"capture descriptors for {mode} have no integer num_tokens")
    state = vars(manager)
    for name, initial in STAGING_INITIAL.items():
        if name not in state:
            if name in OPTIONAL_STAGING:
                continue
            raise IncompatibleVllm(f"{MANAGER_CLASS}.{name} is not set by __init__")
        if state[name] != initial or type(state[name]) is not type(initial):
            raise IncompatibleVllm(f"{MANAGER_CLASS}.{name} starts as {state[name]!r}, expected {initial!r}")
    if getattr(manager, "vllm_config", None) is None:  # the rank agreement reads its parallel layout
        raise IncompatibleVllm(f"{MANAGER_CLASS}.vllm_config is not set by __init__")


def platform_name() -> str:
    from vllm.platforms import current_platform

    enum = getattr(current_platform, "_enum", None)
    return str(getattr(enum, "name", type(current_platform).__name__)).lower()


def check_platform() -> None:
    name = platform_name()
    if name not in SUPPORTED_PLATFORMS:
        raise IncompatibleVllm(
            f"platform '{name}' is not one of {', '.join(SUPPORTED_PLATFORMS)}; out-of-tree "
            "platforms subclass the manager with their own graph handling"
        )


def installed_versions() -> dict[str, str | None]:
    """Versions of vLLM and torch as pip sees them (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for dist in ("vllm", "torch"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = None
    return found


def profiling_limit(manager: Any) -> int | None:
    """How many FULL descriptors vLLM's profiling pass captures (None outside that pass, or on a release
    whose profiling samples instead)."""
    limit = getattr(manager, PROFILING_LIMIT, None)
    return limit if isinstance(limit, int) else None


def default_store() -> Any:
    """The key-value store of torch's default process group (private in torch), for the rank agreement."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def profiling_deltas(manager: Any) -> list[int] | None:
    """The memory deltas vLLM's profiling pass collected on ``manager`` (None outside that pass)."""
    deltas = getattr(manager, PROFILING_DELTAS, None)
    return deltas if isinstance(deltas, list) else None


def full_graph_extrapolation() -> Callable[[list[int], int], int] | None:
    """vLLM's extrapolation of the sampled FULL graphs' memory to all of them (None where it has none)."""
    try:
        module = importlib.import_module(CUDAGRAPH_MODULE)
    except Exception:
        return None
    function = getattr(module, PROFILING_EXTRAPOLATION, None)
    return function if callable(function) else None


def profiling_pass(manager: Any) -> bool | None:
    """Whether this capture is vLLM's memory-profiling pass, which samples the largest FULL graphs and
    must keep vLLM's order; None when this vLLM marks it in no way the plugin knows."""
    state = vars(manager)
    if PROFILING_LIMIT in state:
        return state[PROFILING_LIMIT] is not None
    if isinstance(state.get(PROFILING_SAMPLE), bool):
        return bool(state[PROFILING_SAMPLE])
    module = sys.modules.get(CUDAGRAPH_MODULE)
    if module is not None and not hasattr(module, PROFILING_ENTRY):
        return False  # no profiling capture in this release
    return None
