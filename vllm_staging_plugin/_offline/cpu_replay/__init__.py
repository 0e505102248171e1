"""Drive the real installed ``ModelCudaGraphManager.capture`` staging code on a machine without a GPU.

Only the CUDA edges are stubbed; ``store_capture_output``, the code that crashes, is vLLM's own, and
``tests/test_contract_replay_loop.py`` pins the stand-in capture loop to vLLM's.
"""

from .config import (
    DEFAULT_SIZES,
    ReplayConfig,
    default_sizes,
    make_vllm_config,
)
from .run import (
    PATCHED,
    ReplayResult,
    arm_settings,
    build_manager,
    cpu_stubs,
    replay,
    run_capture,
    stock_or_patched,
    vllm_sizes_staging,
)

__all__ = [
    "DEFAULT_SIZES",
    "PATCHED",
    "ReplayConfig",
    "ReplayResult",
    "arm_settings",
    "build_manager",
    "cpu_stubs",
    "default_sizes",
    "make_vllm_config",
    "replay",
    "run_capture",
    "stock_or_patched",
    "vllm_sizes_staging",
]
