"""The offline code's door into vLLM's private internals, one module per vLLM area: ``config`` (the capture
grid vLLM derives, the model class it resolves, what its failures mean, which drafter names it loads as
a model), ``manager`` (Model Runner V2's
CUDA-graph manager: how the runner builds it, what it hands it, its capture on CPU), ``kda`` (the Kimi
KDA layers' state index) and ``platform`` (the CUDA platform on a machine without CUDA). Each function
names the private it uses, the releases it was read on, and what happens when vLLM changes it;
tests/test_seams.py runs each against the installed vLLM, and CI against every release it covers.

A changed private makes most seams raise (``SeamChanged``, or vLLM's own AttributeError / ImportError) or
return "does not apply", and the caller reports that the check could not be made. Four degrade instead,
each saying how in its docstring: ``config_failure`` (a changed sentence reads as vLLM's own refusal,
exit 2), ``manager_inputs`` (the auxiliary-buffer count falls back to the draft's layer ids, or 3),
``capability_family`` (a renamed method is no longer asked: the derived ceiling stays 512, which
tests/test_seams.py's per-release pin catches) and ``proposer_class_path`` (a missing rule reads every
dotted drafter name as a model, as 0.34.0 does). No other offline module reaches a vLLM private or
rebinds a vLLM global.
"""

from ..internal import SeamChanged
from .config import (
    capability_family,
    config_failure,
    derive_capture_sizes,
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
    manager_features,
    manager_inputs,
    new_manager,
    replayed_plan,
)
from .platform import (
    KERNEL_QUERIES,
    PLATFORM_BRANCHING_MODULES,
    cuda_platform_class,
    import_under_machine_platform,
    kernel_library_answers,
    platform_bound,
)

__all__ = [
    "KERNEL_QUERIES",
    "PLATFORM_BRANCHING_MODULES",
    "KdaMixedStep",
    "ManagerInputs",
    "SeamChanged",
    "capability_family",
    "capture_arguments",
    "capture_on_cpu",
    "capture_plan",
    "config_failure",
    "cpu_capture_edges",
    "cuda_platform_class",
    "cudagraph_module",
    "derive_capture_sizes",
    "fault_at_boot",
    "graph_pool_stub",
    "import_under_machine_platform",
    "inspect_architecture",
    "kda_layer_class",
    "kda_mixed_step",
    "kernel_library_answers",
    "loads_drafter",
    "manager_features",
    "manager_inputs",
    "model_class",
    "model_import_error",
    "new_manager",
    "platform_bound",
    "proposer_class_path",
    "replayed_plan",
    "split_capture_sizes",
]
