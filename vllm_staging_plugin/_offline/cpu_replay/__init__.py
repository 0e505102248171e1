"""Drive the real installed ``ModelCudaGraphManager.capture`` staging code on a machine without a GPU.

Only the CUDA-specific edges are stubbed (the PP group, the graph pool, attention-input preparation,
the forward context and the base class's ``torch.cuda.graph`` loop, replaced by a loop that runs each
descriptor's warm-up and capture forwards in the stored order; ``tests/test_contract_replay_loop.py`` pins
that loop to vLLM's own on every supported release). ``store_capture_output`` -- the code that crashes --
is vLLM's own. Used by the CLI's main job, the pre-flight, the atlas and the contract tests.

The package: ``config`` (what is replayed, and vLLM's config for it), ``stand_ins`` (what the runner would
hand ``capture()``), ``run`` (the replay, stock or patched); vLLM's privates through ``_offline/seams``.
"""

from .config import (
    DEFAULT_SIZES,
    ReplayConfig,
    default_sizes,
    derived_capture_sizes,
    make_vllm_config,
    speculative_config,
)
from .run import (
    PATCHED,
    ReplayResult,
    arm_settings,
    buffers_hold,
    build_manager,
    cpu_stubs,
    features,
    replay,
    run_capture,
    stock_or_patched,
    vllm_sizes_staging,
)
from .stand_ins import UbatchRunner

__all__ = [
    "DEFAULT_SIZES",
    "PATCHED",
    "ReplayConfig",
    "ReplayResult",
    "UbatchRunner",
    "arm_settings",
    "buffers_hold",
    "build_manager",
    "cpu_stubs",
    "default_sizes",
    "derived_capture_sizes",
    "features",
    "make_vllm_config",
    "replay",
    "run_capture",
    "speculative_config",
    "stock_or_patched",
    "vllm_sizes_staging",
]  # fmt: skip
