"""The GPUs the pre-flight can emulate on a machine without one (``check --gpu``): light, so that the command
line's ``--help`` needs neither torch nor vLLM."""

from __future__ import annotations

from dataclasses import dataclass

from .text import MIB


@dataclass(frozen=True)
class Gpu:
    """What the emulated CUDA platform answers for ``torch.cuda``'s device queries."""

    name: str
    capability: tuple[int, int]
    memory_bytes: int


# Values as torch.cuda reports them on these parts. vLLM reads the memory and name to pick its default
# max_num_seqs / max_num_batched_tokens, and the capability for dtype and kernel defaults.
GPUS = {
    "h200": Gpu("NVIDIA H200", (9, 0), 143771 * MIB),
    "h100": Gpu("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB),
    "a100": Gpu("NVIDIA A100-SXM4-80GB", (8, 0), 81920 * MIB),
    "l40s": Gpu("NVIDIA L40S", (8, 9), 46068 * MIB),
    "b200": Gpu("NVIDIA B200", (10, 0), 183359 * MIB),
}
