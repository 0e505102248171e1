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
    # 0.34.0's GDN metadata builder imports it when built, and under emulated CUDA its Triton kernels' module
    # (ssd_chunk_scan) fails without Triton; imported here first it takes the machine's own branch
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
    is bound: imported while CUDA is emulated, they would load CUDA extensions this machine does not have.
    Internals: those module paths (0.33.0); a moved one raises ImportError and the pre-flight says
    it cannot check here."""
    for name in PLATFORM_BRANCHING_MODULES:
        importlib.import_module(name)


def cuda_platform_class() -> type:
    """vLLM's ``NonNvmlCudaPlatform`` class, its kernel libraries imported as empty modules where they
    cannot load. Privates: ``vllm.platforms.cuda`` and the module names in ``NATIVE_OP_MODULES``
    (0.32.0-0.33.0); a renamed kernel module makes the import fail as it would without this (ImportError).
    ``sys.modules`` and ``vllm.platforms`` are left as found: later imports of those modules fail as before.
    """
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
    ``torch.ops._C`` cannot (no CUDA build). Private: those functions of ``vllm._custom_ops`` (0.32.0-0.33.0);
    one vLLM no longer has is not answered, and the question, if still asked, fails as without this."""
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
    """For the block, ``platform`` is vLLM's ``current_platform`` everywhere: in ``vllm.platforms`` and in
    every loaded ``vllm.*`` module that bound ``machine`` when imported; and ``vllm.config.vllm.HAS_TRITON``
    reads True as on a CUDA host (vLLM's CUDA wheels require Triton), so vLLM picks the model runner it
    would pick there. After it, every binding of ``platform``, also in modules first imported during the
    block, is ``machine`` again. Privates: the module-level ``current_platform`` bindings and ``HAS_TRITON``
    (0.32.0-0.33.0); a module that stops binding it is simply not rebound."""
    import vllm.config.vllm as config_module
    import vllm.platforms

    # vllm.platforms binds current_platform only once resolved (else its module __getattr__ resolves it
    # lazily): attributes() puts back exactly that, bound or not
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
