"""The pre-flight's platform: vLLM's own ``CudaPlatform`` class, device queries answered for a declared GPU.

On a machine without a GPU, ``create_engine_config`` would resolve vLLM's "unspecified" platform, whose
empty device type it cannot build a config for, and vLLM's CUDA platform module does not import (its native
op library needs ``libcuda``). :func:`platform_for_check` therefore runs vLLM's ``CudaPlatform`` with only
its device queries answered; docs/preflight.md says exactly what is emulated and what is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .. import seams
from ..gpus import Gpu


def emulated_platform(gpu: Gpu) -> Any:
    """An instance of vLLM's ``CudaPlatform`` whose device queries answer for ``gpu`` (no CUDA calls)."""
    from vllm.platforms.interface import DeviceCapability

    base = seams.cuda_platform_class()

    class EmulatedCudaPlatform(base):  # type: ignore[valid-type, misc]
        """vLLM's CUDA platform; only the queries that would need a device are answered from ``gpu``."""

        emulated_gpu = gpu
        emulated_count = 1  # GPUs on this node; the pre-flight sets it from the deployment or --gpus

        @classmethod
        def device_count(cls) -> int:  # vLLM checks a parallel layout against the node's GPUs
            return cls.emulated_count

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return DeviceCapability(*gpu.capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return gpu.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return gpu.memory_bytes

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def import_kernels(cls) -> None:  # the kernel libraries need libcuda; config building uses none
            return None

    return EmulatedCudaPlatform()


def _machine_platform() -> Any:
    from vllm.platforms import current_platform

    return current_platform


def _needs_emulation(platform: Any) -> bool:
    """A GPU host's CUDA or ROCm platform is used as is; CPU-only machines resolve "unspecified" or "cpu"."""
    return not (platform.is_cuda_alike())


@contextlib.contextmanager
def platform_for_check(gpu: Gpu) -> Iterator[tuple[Any, bool]]:
    """Yield ``(platform, emulated)``: the machine's CUDA/ROCm platform, or the emulated CUDA one, bound as
    vLLM's ``current_platform`` for the block (``seams.platform_bound``) with the CUDA kernel library's
    capability questions answered (``seams.kernel_library_answers``)."""
    machine = _machine_platform()
    if not _needs_emulation(machine):
        yield machine, False
        return
    seams.import_under_machine_platform()
    emulated = emulated_platform(gpu)
    with seams.platform_bound(machine, emulated), seams.kernel_library_answers():
        yield emulated, True


def node_gpus(args: Any) -> int:
    """The GPUs one node of this deployment uses: each engine's world (TP x PP x prefill-context
    parallel) times the engines on this node (``--data-parallel-size-local``), else every engine's
    GPUs spread over ``--nnodes``. The emulated node has that many unless ``--gpus`` says otherwise."""
    world = 1
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size"):
        world *= max(1, int(getattr(args, name, 1) or 1))
    local = getattr(args, "data_parallel_size_local", None)
    if local is not None:
        return world * max(1, int(local))
    dp = max(1, int(getattr(args, "data_parallel_size", 1) or 1))
    nnodes = max(1, int(getattr(args, "nnodes", 1) or 1))
    return max(1, -(-world * dp // nnodes))


def platform_json(platform: Any, emulated: bool, gpu: Gpu) -> dict[str, Any]:
    if emulated:
        return {"name": "cuda", "emulated": True, "gpu": gpu.name, "capability": list(gpu.capability),
                "memory_bytes": gpu.memory_bytes, "gpus": type(platform).emulated_count}  # fmt: skip
    return {"name": str(platform.device_name), "emulated": False, "gpu": platform.get_device_name(),
            "capability": None, "memory_bytes": platform.get_device_total_memory(),
            "gpus": platform.device_count()}  # fmt: skip
