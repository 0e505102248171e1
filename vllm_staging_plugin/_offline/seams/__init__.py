"""The offline code's door into vLLM's privates (a private the engine touches too comes from
``_engine/compat.py``), one module per vLLM area: ``config``, ``manager`` (Model
Runner V2's CUDA-graph manager), ``kda`` (the Kimi KDA layers) and ``platform`` (CUDA on a machine without
it). Each function names the private it uses and what happens when vLLM changes it: most raise, and the
caller reports that the check could not be made. tests/test_seams.py runs each against the installed vLLM;
docs/compatibility.md ("The offline seams") lists the releases each was read on.
"""

from ..internal import SeamChanged
from .config import (
    config_failure,
    inspect_architecture,
    loads_drafter,
    model_class,
    model_import_error,
    proposer_class_path,
    split_capture_sizes,
)
from .kda import KdaMixedStep, fault_at_boot, kda_layer_class, kda_mixed_step
from .manager import (
    ManagerInputs,
    capture_arguments,
    capture_on_cpu,
    capture_plan,
    cpu_capture_edges,
    cudagraph_module,
    graph_pool_stub,
    manager_inputs,
    new_manager,
    replayed_plan,
)
from .platform import (
    KERNEL_QUERIES,
    cuda_platform_class,
    import_under_machine_platform,
    kernel_library_answers,
    platform_bound,
)

__all__ = [
    "KERNEL_QUERIES",
    "KdaMixedStep",
    "ManagerInputs",
    "SeamChanged",
    "capture_arguments",
    "capture_on_cpu",
    "capture_plan",
    "config_failure",
    "cpu_capture_edges",
    "cuda_platform_class",
    "cudagraph_module",
    "fault_at_boot",
    "graph_pool_stub",
    "import_under_machine_platform",
    "inspect_architecture",
    "kda_layer_class",
    "kda_mixed_step",
    "kernel_library_answers",
    "loads_drafter",
    "manager_inputs",
    "model_class",
    "model_import_error",
    "new_manager",
    "platform_bound",
    "proposer_class_path",
    "replayed_plan",
    "split_capture_sizes",
]
