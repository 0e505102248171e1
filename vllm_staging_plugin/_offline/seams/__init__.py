"""The offline code's door into vLLM's private internals, one module per vLLM area: ``config`` (the capture
grid vLLM derives, the model class it resolves, what its failures mean), ``manager`` (Model Runner V2's
CUDA-graph manager and what the runner hands it), ``kda`` (the Kimi KDA layers' state index) and
``platform`` (the CUDA platform on a machine without CUDA). Each function names the private it uses, the
releases it was read on, and what happens when vLLM changes it; tests/test_seams.py runs each against the
installed vLLM, and CI against every release it covers.

A changed private makes a seam raise (``SeamChanged``, or vLLM's own AttributeError / ImportError), or
return "does not apply", never a wrong answer: the caller reports that the check could not be made. No
other offline module reaches a vLLM private or rebinds a vLLM global.
"""

from .changed import SeamChanged
from .config import capability_family, config_failure, derive_capture_sizes, inspect_architecture, model_class
from .kda import KdaMixedStep, kda_layer_class, kda_mixed_step
from .manager import (
    ManagerInputs,
    capture_plan,
    cpu_capture_edges,
    graph_pool_stub,
    manager_features,
    manager_inputs,
)
from .platform import KERNEL_QUERIES, cuda_platform_class, kernel_library_answers, platform_bound

__all__ = [
    "KERNEL_QUERIES", "KdaMixedStep", "ManagerInputs", "SeamChanged", "capability_family", "capture_plan",
    "config_failure", "cpu_capture_edges", "cuda_platform_class", "derive_capture_sizes", "graph_pool_stub",
    "inspect_architecture", "kda_layer_class", "kda_mixed_step", "kernel_library_answers",
    "manager_features", "manager_inputs", "model_class", "platform_bound",
]  # fmt: skip
