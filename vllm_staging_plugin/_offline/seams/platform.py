"""Seams into vLLM's platform layer: its CUDA platform class on a machine without CUDA, the capability
questions its config code asks the CUDA kernel library, and the ``current_platform`` every vLLM module binds.
The pre-flight's emulated GPU (``preflight/platform.py``) is built on these."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..scoped import attributes, items

# The modules vllm/platforms/cuda.py imports only to register CUDA kernels (they need libcuda).
NATIVE_OP_MODULES = ("vllm._C_stable_libtorch", "vllm._qutlass_C")
# How vLLM's CUDA build (CUDA 12.8+) answers the CUTLASS capability questions of quantized checkpoints'
# config code: FP8 from sm_89, block FP8 from sm_90, FP4 from sm_100.
KERNEL_QUERIES: dict[str, Callable[[int], bool]] = {
    "cutlass_scaled_mm_supports_fp8": lambda capability: capability >= 89,
    "cutlass_scaled_mm_supports_block_fp8": lambda capability: capability >= 90,
    "cutlass_scaled_mm_supports_fp4": lambda capability: capability >= 100,
}


# The vLLM modules the pre-flight uses that branch on the platform when first imported (CUDA-only kernels).
PLATFORM_BRANCHING_MODULES = (
    "vllm.config.vllm",
    "vllm.distributed.ec_transfer",
    "vllm.engine.arg_utils",
    "vllm.entrypoints.common.cli_args",
    # the GDN metadata builder imports it; under emulated CUDA its Triton kernels' module fails without Triton
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "vllm.model_executor.model_loader.weight_utils",
    "vllm.model_executor.models.config",
    "vllm.model_executor.models.registry",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.lora_utils",
    "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
)


def import_under_machine_platform() -> None:
    """Import ``PLATFORM_BRANCHING_MODULES`` under the machine's own platform, before an emulated CUDA one
    is bound (under it they would load CUDA extensions). A moved one raises ImportError: cannot check here."""
    for name in PLATFORM_BRANCHING_MODULES:
        importlib.import_module(name)


def cuda_platform_class() -> type:
    """vLLM's ``NonNvmlCudaPlatform`` class, its kernel libraries imported as empty modules where they
    cannot load (``NATIVE_OP_MODULES``; renamed, the import fails as without this). ``sys.modules`` and
    ``vllm.platforms`` are left as found."""
    try:
        import vllm.platforms.cuda as cuda

        return cuda.NonNvmlCudaPlatform  # type: ignore[no-any-return]
    except ImportError:
        pass
    import vllm.platforms

    had_cuda = "cuda" in vars(vllm.platforms)
    stand_ins = {name: types.ModuleType(name) for name in NATIVE_OP_MODULES}  # register no ops
    try:
        with items(sys.modules, {**stand_ins, "vllm.platforms.cuda": None}):
            import vllm.platforms.cuda as cuda

            return cuda.NonNvmlCudaPlatform  # type: ignore[no-any-return]
    finally:
        if not had_cuda and "cuda" in vars(vllm.platforms):
            delattr(vllm.platforms, "cuda")


@contextlib.contextmanager
def kernel_library_answers() -> Iterator[None]:
    """For the block, ``vllm._custom_ops`` answers the questions of ``KERNEL_QUERIES`` that this machine's
    ``torch.ops._C`` cannot; one vLLM no longer has is not answered."""
    import torch
    import vllm._custom_ops as ops

    answers = {
        name: fn
        for name, fn in KERNEL_QUERIES.items()
        if not hasattr(torch.ops._C, name) and hasattr(ops, name)
    }
    with attributes(ops, answers):
        yield


@contextlib.contextmanager
def platform_bound(machine: Any, platform: Any) -> Iterator[None]:
    """For the block, ``platform`` is vLLM's ``current_platform`` in every ``vllm.*`` module that bound
    ``machine``, and ``HAS_TRITON`` is True as on a CUDA host (so vLLM picks the runner it would there).
    After it, every binding of ``platform``, also in modules imported meanwhile, is ``machine`` again."""
    import vllm.config.vllm as config_module
    import vllm.platforms

    # vllm.platforms binds current_platform only once resolved: attributes() puts back that, bound or not
    try:
        with (
            attributes(vllm.platforms, {"current_platform": platform}),
            attributes(config_module, {"HAS_TRITON": True}),
        ):
            _rebind(machine, platform)
            yield
    finally:
        _rebind(platform, machine)


def _rebind(old: Any, new: Any) -> None:
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if (
            isinstance(name, str)
            and name.startswith("vllm.")
            and name != "vllm.platforms"
            and vars(module).get("current_platform") is old
        ):
            setattr(module, "current_platform", new)  # noqa: B010
