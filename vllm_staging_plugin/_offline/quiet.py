"""Keep the terminal for the answer: vLLM's INFO lines and the warnings every GPU-less machine prints go.

vLLM reads ``VLLM_LOGGING_LEVEL`` once, on import, so it is set for that import unless the operator set it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator

from .scoped import items

LEVEL_VARIABLE = "VLLM_LOGGING_LEVEL"
# (logger, start of the message): what vLLM and torch log on a CPU-only machine, whatever is checked
_NO_TRITON_KERNELS = "Failed to import Triton kernels"
CPU_ONLY = (
    ("vllm.platforms.interface", "Failed to import from vllm._C"),
    ("vllm.platforms.cpu", "Failed to import from vllm._C"),
    ("vllm.model_executor.layers.fused_moe.config", _NO_TRITON_KERNELS),
    ("vllm.model_executor.layers.quantization.mxfp4", _NO_TRITON_KERNELS),
    ("vllm.model_executor.layers.fused_moe.oracle.mxfp4", _NO_TRITON_KERNELS),
    ("vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe", _NO_TRITON_KERNELS),
    ("torch._library.triton", "Triton not available"),
)
# (logger, start of the message): failures the check reports itself, in one line with what to do
REPORTED = (
    ("vllm.model_executor.models.registry", "Error in inspecting model architecture"),
    ("vllm.model_executor.models.registry", "Error in loading model architecture"),
    ("vllm.transformers_utils.repo_utils", "%s: %s"),  # every with_retry line (config parsing, file lists)
)
EXPLAINED = (
    "note: messages about vllm._C and Triton are expected on a machine without a GPU (no CUDA kernels "
    "or Triton here); the check needs neither"
)


def _dropping(prefix: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: not str(record.msg).startswith(prefix)


@contextlib.contextmanager
def quiet_logs(verbose: bool) -> Iterator[None]:
    """Quiet vLLM for the block (WARNING and up, minus the CPU-only messages of :data:`CPU_ONLY` and the
    failures the check reports itself, :data:`REPORTED`);
    ``verbose`` changes nothing but says in one line why those messages appear."""
    if verbose:
        print(EXPLAINED, file=sys.stderr)
        yield
        return
    with contextlib.ExitStack() as stack:
        if LEVEL_VARIABLE not in os.environ:  # the operator's own level is kept
            stack.enter_context(items(os.environ, {LEVEL_VARIABLE: "WARNING"}))
            if "vllm" in sys.modules:  # configured already (in-process callers): lower it here
                vllm_logger = logging.getLogger("vllm")
                stack.callback(vllm_logger.setLevel, vllm_logger.level)
                vllm_logger.setLevel(logging.WARNING)
        for name, prefix in (*CPU_ONLY, *REPORTED):
            logger, dropped = logging.getLogger(name), _dropping(prefix)
            logger.addFilter(dropped)
            stack.callback(logger.removeFilter, dropped)
        yield
