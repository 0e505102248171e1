"""The pre-flight's platform: vLLM's own ``CudaPlatform`` class, device queries answered for a declared GPU.

Without a GPU vLLM would resolve its "unspecified" platform, which cannot build a config; docs/preflight.md
says what is emulated.
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


@contextlib.contextmanager
def platform_for_check(gpu: Gpu) -> Iterator[tuple[Any, bool]]:
    """Yield ``(platform, emulated)``: the machine's CUDA/ROCm platform, or the emulated CUDA one, bound as
    vLLM's ``current_platform`` for the block (``seams.platform_bound``) with the CUDA kernel library's
    capability questions answered (``seams.kernel_library_answers``)."""
    from vllm.platforms import current_platform as machine

    if machine.is_cuda_alike():  # a GPU host's CUDA or ROCm platform is used as is
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
        return {
            "name": "cuda",
            "emulated": True,
            "gpu": gpu.name,
            "capability": list(gpu.capability),
            "memory_bytes": gpu.memory_bytes,
            "gpus": type(platform).emulated_count,
        }
    return {
        "name": str(platform.device_name),
        "emulated": False,
        "gpu": platform.get_device_name(),
        "capability": None,
        "memory_bytes": platform.get_device_total_memory(),
        "gpus": platform.device_count(),
    }
