"""``vllm-staging-plugin check -- <vllm serve arguments>``: would this configuration boot, stock and patched?

The arguments go through vLLM's own ``vllm serve`` parser and ``AsyncEngineArgs.create_engine_config``, so
the ``VllmConfig`` is vLLM's. The real ``ModelCudaGraphManager`` is then built from it, the way Model Runner
V2's ``initialize_kv_cache`` builds it, and :mod:`.cpu_replay` runs its real ``capture()`` staging code
(``store_capture_output``) on CPU tensors: stock in vLLM's own order, then with the plugin patched in the
chosen order. Nothing is captured and no GPU memory is touched.

On a machine without a GPU, ``create_engine_config`` would resolve vLLM's "unspecified" platform, whose
empty device type it cannot build a config for, and vLLM's CUDA platform module does not import (its
native op library needs ``libcuda``). :func:`emulated_cuda` therefore runs vLLM's own ``CudaPlatform``
class with only its device queries answered for a declared GPU; see docs/preflight.md for exactly what
is emulated and what is not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .settings import (
    ENV_DISABLE,
    ENV_ORDER,
    ENV_PRESIZE,
    ENV_RECEIPTS_DIR,
    ENV_STRICT,
    ConfigError,
    Settings,
    scoped_environ,
)

EXIT_BOOTS, EXIT_FAILS, EXIT_BAD_ARGUMENTS, EXIT_CANNOT_CHECK_HERE = 0, 1, 2, 3
MIB = 1024 * 1024
GPU_HOST = "run the check on the GPU host, where vLLM's own CUDA platform answers"


@dataclass(frozen=True)
class Gpu:
    """What the emulated CUDA platform answers for ``torch.cuda``'s device queries."""

    name: str
    capability: tuple[int, int]
    memory_bytes: int

    def describe(self) -> str:
        major, minor = self.capability
        return f"{self.name}, sm_{major}{minor}, {self.memory_bytes / 1024**3:.1f} GiB"


# Values as torch.cuda reports them on these parts. vLLM reads the memory and name to pick its default
# max_num_seqs / max_num_batched_tokens, and the capability for dtype and kernel defaults.
GPUS = {
    "h200": Gpu("NVIDIA H200", (9, 0), 143771 * MIB),
    "h100": Gpu("NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB),
    "a100": Gpu("NVIDIA A100-SXM4-80GB", (8, 0), 81920 * MIB),
    "l40s": Gpu("NVIDIA L40S", (8, 9), 46068 * MIB),
    "b200": Gpu("NVIDIA B200", (10, 0), 183359 * MIB),
}


class BadArguments(Exception):
    """vLLM rejected the ``vllm serve`` arguments; the message is vLLM's own."""


class CannotCheckHere(Exception):
    """vLLM itself cannot inspect this configuration on this machine."""


# ---------------------------------------------------------------------------------------------------------
# Platform: vLLM's own CUDA platform class, device queries answered for a declared GPU.


def _native_op_modules() -> tuple[str, ...]:
    """The modules ``vllm/platforms/cuda.py`` imports only to register CUDA kernels (they need libcuda)."""
    return ("vllm._C_stable_libtorch", "vllm._qutlass_C")


def _cuda_platform_class() -> type:
    """vLLM's ``CudaPlatform`` class, importing its kernel libraries as empty modules if they cannot load."""
    saved = {name: sys.modules.get(name) for name in (*_native_op_modules(), "vllm.platforms.cuda")}
    try:
        import vllm.platforms.cuda as cuda

        return cuda.NonNvmlCudaPlatform  # type: ignore[no-any-return]
    except ImportError:
        pass
    for name in _native_op_modules():
        sys.modules[name] = types.ModuleType(name)  # registers no ops; config building calls none
    try:
        sys.modules.pop("vllm.platforms.cuda", None)
        import vllm.platforms.cuda as cuda

        return cuda.NonNvmlCudaPlatform  # type: ignore[no-any-return]
    finally:  # leave the process as it was: later imports of these modules fail as before
        import vllm.platforms

        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        if saved["vllm.platforms.cuda"] is None and "cuda" in vars(vllm.platforms):
            delattr(vllm.platforms, "cuda")


def emulated_platform(gpu: Gpu) -> Any:
    """An instance of vLLM's ``CudaPlatform`` whose device queries answer for ``gpu`` (no CUDA calls)."""
    from vllm.platforms.interface import DeviceCapability

    base = _cuda_platform_class()

    class EmulatedCudaPlatform(base):  # type: ignore[valid-type, misc]
        """vLLM's CUDA platform; only the queries that would need a device are answered from ``gpu``."""

        emulated_gpu = gpu

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


def _preimport() -> None:
    """Import, under the machine's own platform, the vLLM modules the check uses.

    Many vLLM modules branch on the platform when first imported (CUDA-only kernels); importing them
    while the CUDA platform is emulated would load CUDA extensions this machine does not have.
    """
    # Imported for their side effect (module state built under the machine's platform).
    import vllm.config.vllm
    import vllm.distributed.ec_transfer
    import vllm.engine.arg_utils
    import vllm.entrypoints.common.cli_args
    import vllm.model_executor.model_loader.weight_utils
    import vllm.model_executor.models.config
    import vllm.model_executor.models.registry
    import vllm.v1.executor.uniproc_executor
    import vllm.v1.worker.gpu.cudagraph_utils
    import vllm.v1.worker.gpu.lora_utils
    import vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils  # noqa: F401


@contextlib.contextmanager
def platform_for_check(gpu: Gpu) -> Iterator[tuple[Any, bool]]:
    """Yield ``(platform, emulated)``: the machine's CUDA/ROCm platform, or the emulated CUDA one.

    vLLM modules bind ``current_platform`` when imported; while emulating, every loaded ``vllm.*``
    module's binding (and ``vllm.platforms``' own) points at the emulated platform, and is put back after.
    ``vllm.config.vllm.HAS_TRITON`` reads True as on a CUDA host (vLLM's CUDA wheels require Triton), so
    vLLM picks the model runner it would pick there.
    """
    import vllm.platforms

    machine = _machine_platform()
    if not _needs_emulation(machine):
        yield machine, False
        return
    _preimport()
    emulated = emulated_platform(gpu)
    import vllm.config.vllm as config_module

    had_triton = config_module.HAS_TRITON
    vllm.platforms.current_platform = emulated
    config_module.HAS_TRITON = True
    try:
        for module in list(sys.modules.values()):
            if _binds(module, machine):
                setattr(module, "current_platform", emulated)  # noqa: B010
        yield emulated, True
    finally:
        vllm.platforms.current_platform = machine
        config_module.HAS_TRITON = had_triton
        for module in list(sys.modules.values()):  # also modules first imported during the check
            if _binds(module, emulated):
                setattr(module, "current_platform", machine)  # noqa: B010


def _binds(module: Any, platform: Any) -> bool:
    name = getattr(module, "__name__", "")
    return (
        isinstance(name, str)
        and name.startswith("vllm.")
        and name != "vllm.platforms"
        and vars(module).get("current_platform") is platform
    )


# ---------------------------------------------------------------------------------------------------------
# vLLM's own argument parsing and configuration.


def parse_serve_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """Parse as ``vllm serve`` does: vLLM's parser, positional model over ``--model``, its validation."""
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(
        FlexibleArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    )
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args: argparse.Namespace = parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            raise
        raise BadArguments(errors.getvalue().strip() or f"vllm serve exited with {exc.code}") from None
    except Exception as exc:  # vLLM's own parser raised (a bad enum value in a JSON config: KeyError)
        raise BadArguments(f"{type(exc).__name__}: {exc}") from None
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what ServeSubcommand.cmd does
    try:
        validate_parsed_serve_args(args)
    except (ValueError, TypeError) as exc:
        raise BadArguments(f"{type(exc).__name__}: {exc}") from None
    return args


def create_engine_config(args: argparse.Namespace) -> Any:
    """``AsyncEngineArgs.from_cli_args(args).create_engine_config`` as the API server calls it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except ImportError as exc:
        raise CannotCheckHere(
            f"building the configuration imports a module this machine cannot load ({type(exc).__name__}: "
            f"{exc}); {GPU_HOST}"
        ) from exc
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if "failed to be inspected" in text:
            raise CannotCheckHere(
                f"vLLM cannot inspect the model class on this machine ({_first_line(text)}); {GPU_HOST}"
            ) from exc
        raise BadArguments(text) from exc


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if "validation error" not in line and "errors.pydantic" not in line]
    return (useful or lines or [text])[0]


@dataclass
class ManagerInputs:
    """What Model Runner V2 passes to ``ModelCudaGraphManager`` and what the staging copy writes."""

    cudagraph_mode: str
    decode_query_len: int
    lora_capture_cases: list[int]
    varlen_decode: bool
    hidden_size: int
    dtype: Any
    aux_layers: int
    dbo: bool = False
    notes: list[str] = field(default_factory=list)


def manager_inputs(vllm_config: Any) -> ManagerInputs:
    """Mirror ``GPUModelRunner`` (MRv2) ``load_model``/``initialize_kv_cache`` up to the manager's birth.

    Parts that need the loaded model or its attention backends are taken at their usual values and
    listed in ``notes``.
    """
    import vllm.envs as envs
    from vllm.config.compilation import CompilationMode
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import requires_aux_hidden_states

    notes: list[str] = []
    # decode_query_len = num_speculative_steps + model_state.num_new_sampled_tokens_per_step (1 for
    # every ModelState in 0.33.0 except the diffusion-Gemma one).
    decode_query_len = int(vllm_config.num_speculative_tokens) + 1
    compilation = vllm_config.compilation_config
    piecewise = bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH) or compilation.mode == CompilationMode.VLLM_COMPILE
    mode = compilation.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS,
        None,
        decode_query_len,
        use_v2_model_runner=True,
        kv_cache_config=None,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
        is_profiling=False,
        piecewise_capture_available=piecewise,
    )
    notes.append(
        "attention backends assumed to support every CUDA-graph mode (vLLM downgrades the mode at "
        "boot when the loaded backends do not)"
    )
    lora_cases = [0]
    if vllm_config.lora_config:
        lora_cases = list(get_lora_capture_cases(vllm_config.lora_config, compilation))
    spec = vllm_config.speculative_config
    varlen = bool(spec is not None and getattr(spec, "enable_adaptive_verification", False))
    aux_layers = 0
    if spec is not None and requires_aux_hidden_states(spec):
        aux_layers = _aux_layer_count(spec)
        notes.append(f"{aux_layers} auxiliary hidden-state buffers (the draft's layer ids, else vLLM's 3)")
    dbo = bool(getattr(vllm_config.parallel_config, "enable_dbo", False))
    if dbo:
        from . import cpu_replay

        if not hasattr(cpu_replay, "_FakeUbatchRunner"):
            raise CannotCheckHere("dual-batch overlap (--enable-dbo) is not replayed by this plugin version")
    model_config = vllm_config.model_config
    return ManagerInputs(
        dbo=dbo,
        cudagraph_mode=str(mode.name),
        decode_query_len=decode_query_len,
        lora_capture_cases=lora_cases,
        varlen_decode=varlen,
        hidden_size=int(model_config.get_hidden_size()),
        dtype=model_config.dtype,
        aux_layers=aux_layers,
        notes=notes,
    )


def _aux_layer_count(spec: Any) -> int:
    draft = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    for source in (draft, getattr(draft, "eagle_config", None)):
        ids = source.get("eagle_aux_hidden_state_layer_ids") if isinstance(source, dict) else None
        ids = ids or getattr(source, "eagle_aux_hidden_state_layer_ids", None)
        if ids:
            return len(ids)
    return 3


# ---------------------------------------------------------------------------------------------------------
# The replays.


@dataclass
class Arm:
    ok: bool
    error: str | None
    sequence: dict[str, list[int]]
    buffers: dict[str, dict[str, Any]]
    allocated_by: str | None = None
    failed_at: str | None = None


@dataclass
class Preflight:
    vllm_version: str | None
    torch_version: str | None
    platform: dict[str, Any]
    model: str
    architecture: str | None
    cudagraph_mode: str
    capture_sizes: list[int]
    max_num_seqs: int
    decode_query_len: int
    use_kda_recoverssm: bool
    hidden_size: int
    dtype: str
    capacity: int
    sequence: dict[str, list[int]]
    stock: Arm
    plugin: Arm
    order: str
    notes: list[str]

    @property
    def plugin_boots(self) -> bool:
        return self.plugin.ok and all(b["rows"] >= self.capacity for b in self.plugin.buffers.values())

    @property
    def identical_to_stock(self) -> bool | None:
        if not self.stock.ok or self.order != "descending":
            return None
        return self.stock.buffers == self.plugin.buffers

    @property
    def staging_bytes(self) -> int:
        return sum(int(b["bytes"]) for b in self.plugin.buffers.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin_version": __version__,
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "platform": self.platform,
            "model": self.model,
            "architecture": self.architecture,
            "cudagraph_mode": self.cudagraph_mode,
            "capture_sizes": self.capture_sizes,
            "max_num_seqs": self.max_num_seqs,
            "decode_query_len": self.decode_query_len,
            "use_kda_recoverssm": self.use_kda_recoverssm,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "capacity": self.capacity,
            "sequence": self.sequence,
            "stock": _arm_json(self.stock),
            "plugin": {**_arm_json(self.plugin), "ok": self.plugin_boots, "order": self.order},
            "staging_bytes": self.staging_bytes,
            "identical_to_stock": self.identical_to_stock,
            "notes": self.notes,
        }


def _arm_json(arm: Arm) -> dict[str, Any]:
    return {
        "ok": arm.ok,
        "error": arm.error,
        "allocated_by": arm.allocated_by,
        "failed_at": arm.failed_at,
        "captured": arm.sequence,
        "buffers": arm.buffers,
    }


def _describe(mode: Any, desc: Any) -> str:
    parts = [f"{getattr(mode, 'name', mode)} num_tokens={desc.num_tokens}"]
    if getattr(desc, "uniform_token_count", None):
        parts.append(f"uniform decode {desc.num_reqs} x {desc.uniform_token_count}")
    if getattr(desc, "num_active_loras", 0):
        parts.append(f"{desc.num_active_loras} LoRAs")
    if getattr(desc, "num_ubatches", 1) > 1:
        parts.append(f"{desc.num_ubatches} micro-batches")
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Undo what building the config writes to ``os.environ`` (vLLM sets VLLM_USE_BREAKABLE_CUDAGRAPH)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@contextlib.contextmanager
def _logs_to_stderr() -> Iterator[None]:
    """Keep stdout for the report (one JSON object with --json): vLLM logs to stdout by default."""
    import logging

    moved = [h for h in logging.getLogger("vllm").handlers
             if isinstance(h, logging.StreamHandler) and h.stream is sys.stdout]  # fmt: skip
    for handler in moved:
        handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # handlers vLLM configures meanwhile bind stderr
            yield
    finally:
        for handler in moved:
            handler.setStream(sys.stdout)


@contextlib.contextmanager
def _plugin_environment(order: str) -> Iterator[None]:
    """The plugin's variables for the patched arm: the chosen order, pre-sizing on, strict, no receipts.

    Strict, so a plugin that would refuse this vLLM raises instead of silently leaving it stock.
    """
    values = {ENV_ORDER: order, ENV_PRESIZE: "on", ENV_STRICT: "1", ENV_DISABLE: "0", ENV_RECEIPTS_DIR: None}
    with scoped_environ(values):
        yield


def _replay_arm(vllm_config: Any, inputs: ManagerInputs, patched: bool) -> tuple[Arm, dict[str, list[int]]]:
    """One real capture() of a manager built from ``vllm_config``; returns the arm and vLLM's plan."""
    import torch

    from . import cpu_replay
    from .sizing import CAPTURE_MODE_ORDER, capture_sequence

    cfg = cpu_replay.ReplayConfig(
        mode=inputs.cudagraph_mode,
        sizes=list(vllm_config.compilation_config.cudagraph_capture_sizes or []),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        decode_query_len=inputs.decode_query_len,
        hidden_size=inputs.hidden_size,
        dtype=inputs.dtype,
        aux_layers=inputs.aux_layers,
        lora_capture_cases=inputs.lora_capture_cases,
    )
    kwargs: dict[str, Any] = {}
    if inputs.dbo:  # vLLM's own _maybe_ubatch_twin adds the micro-batch twins; the runner is a stand-in
        cfg.dbo = True
        kwargs["ubatch_runner"] = cpu_replay._FakeUbatchRunner()
    from vllm.config.compilation import CUDAGraphMode

    with cpu_replay.cpu_stubs(cfg) as cu, cpu_replay.stock_or_patched(patched):
        manager = cu.ModelCudaGraphManager(
            vllm_config,
            torch.device("cpu"),
            CUDAGraphMode[inputs.cudagraph_mode],
            decode_query_len=inputs.decode_query_len,
            lora_capture_cases=inputs.lora_capture_cases,
            varlen_decode=inputs.varlen_decode,
            **kwargs,
        )
        by_name = {getattr(mode, "name", str(mode)): mode for mode in manager._capture_descs}
        flat = [(by_name[name], d) for name in CAPTURE_MODE_ORDER if name in by_name
                for d in manager._capture_descs[by_name[name]]]  # fmt: skip
        plan = capture_sequence(manager._capture_descs)  # vLLM's own order, before any policy
        result = cpu_replay.run_capture(manager, cfg)
    ran = _ran(result.forwards, flat)
    arm = Arm(ok=result.ok, error=result.error, sequence=_by_mode(ran), buffers=result.buffers)
    if ran:
        arm.allocated_by = _describe(*ran[0])  # store_capture_output allocates from the first output
        if not result.ok:
            arm.failed_at = _describe(*ran[-1])  # the descriptor whose forward raised
    return arm, plan


def _ran(forwards: list[int], flat: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The descriptors in the order the capture ran them (an order policy permutes within each mode).

    Each descriptor runs two forwards (warm-up, capture); the k-th descriptor of a mode is matched by
    its ``num_tokens`` among that mode's descriptors not yet taken.
    """
    ran: list[tuple[Any, Any]] = []
    left = list(flat)
    for n in forwards[::2]:
        mode = left[0][0]  # modes are captured one after the other, PIECEWISE first
        match = next((i for i, (m, d) in enumerate(left) if m is mode and d.num_tokens == n), 0)
        ran.append(left.pop(match))
    return ran


def _by_mode(ran: list[tuple[Any, Any]]) -> dict[str, list[int]]:
    captured: dict[str, list[int]] = {}
    for mode, desc in ran:
        captured.setdefault(str(getattr(mode, "name", mode)), []).append(int(desc.num_tokens))
    return captured


def run(argv: Sequence[str], order: str = "descending", gpu: Gpu = GPUS["h200"]) -> Preflight:
    """Parse, configure, build the manager and replay both arms. Raises BadArguments / CannotCheckHere."""
    from . import compat
    from .policies import validate_order

    try:
        validate_order(Settings(order=order))
    except ConfigError as exc:
        raise BadArguments(f"--order: {exc}") from None
    versions = compat.installed_versions()
    if versions["vllm"] is None:
        raise CannotCheckHere("vLLM is not installed in this environment")
    with _environment_kept(), platform_for_check(gpu) as (platform, emulated):
        # the parser's defaults build a DeviceConfig too, so it runs on the check's platform
        args = parse_serve_arguments(argv)
        vllm_config = create_engine_config(args)
        if not vllm_config.use_v2_model_runner:
            raise CannotCheckHere(
                "vLLM picks Model Runner V1 for this configuration: it has no ModelCudaGraphManager, so "
                "neither the plugin nor this check applies"
            )
        try:
            compat.manager_class(cpu_replay_module())
        except compat.IncompatibleVllm as exc:
            raise CannotCheckHere(f"this vLLM has no supported manager: {exc}") from exc
        inputs = manager_inputs(vllm_config)
        stock, plan = _replay_arm(vllm_config, inputs, patched=False)
        with _plugin_environment(order):
            plugin, _ = _replay_arm(vllm_config, inputs, patched=True)
    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    notes = list(inputs.notes)
    if not any(plan.values()):
        notes.append("no CUDA graph is captured (cudagraph mode NONE or no sizes): no staging buffer exists")
    if parallel.pipeline_parallel_size > 1:
        notes.append("replayed as the last pipeline rank (hidden_states); other ranks stage "
                     "intermediate_tensors with the same rows")  # fmt: skip
    compilation = vllm_config.compilation_config
    return Preflight(
        vllm_version=versions["vllm"],
        torch_version=versions["torch"],
        platform=_platform_json(platform, emulated, gpu),
        model=str(model_config.model),
        architecture=getattr(model_config, "architecture", None),
        cudagraph_mode=inputs.cudagraph_mode,
        capture_sizes=sorted(compilation.cudagraph_capture_sizes or []),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        decode_query_len=inputs.decode_query_len,
        use_kda_recoverssm=bool(getattr(vllm_config.cache_config, "use_kda_recoverssm", False)),
        hidden_size=inputs.hidden_size,
        dtype=str(inputs.dtype).removeprefix("torch."),
        capacity=max((n for tokens in plan.values() for n in tokens), default=0),
        sequence=plan,
        stock=stock,
        plugin=plugin,
        order=order,
        notes=notes,
    )


def cpu_replay_module() -> types.ModuleType:
    from .cpu_replay import cudagraph_module

    return cudagraph_module()


def _platform_json(platform: Any, emulated: bool, gpu: Gpu) -> dict[str, Any]:
    if emulated:
        return {"name": "cuda", "emulated": True, "gpu": gpu.name, "capability": list(gpu.capability),
                "memory_bytes": gpu.memory_bytes}  # fmt: skip
    return {"name": str(platform.device_name), "emulated": False, "gpu": platform.get_device_name(),
            "capability": None, "memory_bytes": platform.get_device_total_memory()}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Output.


def _tokens(values: Sequence[int]) -> str:
    return ", ".join(map(str, values)) if len(values) <= 12 else (
        ", ".join(map(str, values[:5])) + ", ..., " + ", ".join(map(str, values[-5:])))  # fmt: skip


def _buffers(buffers: dict[str, dict[str, Any]]) -> str:
    if not buffers:
        return "none allocated"
    return "; ".join(
        f"{n} {b['shape']} {b['dtype']} = {b['bytes'] / MIB:.2f} MiB" for n, b in buffers.items()
    )


def render(result: Preflight) -> str:
    """The human-readable report."""
    p = result.platform
    platform = f"{p['name']} ({p['gpu']})"
    if p["emulated"]:
        major, minor = p["capability"]
        platform = (f"emulated CUDA: vLLM's CudaPlatform, device queries answered for {p['gpu']}, "
                    f"sm_{major}{minor}, {p['memory_bytes'] / 1024**3:.1f} GiB (no GPU here)")  # fmt: skip
    lines = [
        f"vllm-staging-plugin {__version__} pre-flight: vllm {result.vllm_version or 'not installed'}, "
        f"torch {result.torch_version or 'not installed'}",
        f"platform: {platform}",
        f"model: {result.model} ({result.architecture}), hidden {result.hidden_size} {result.dtype}",
        f"config: {result.cudagraph_mode}, capture sizes {_tokens(result.capture_sizes)}, max_num_seqs "
        f"{result.max_num_seqs}, decode_query_len {result.decode_query_len}"
        + (", KDA recover-SSM on" if result.use_kda_recoverssm else ""),
        "",
        "capture plan (vLLM's own order):",
    ]
    for mode, tokens in result.sequence.items():
        lines.append(f"  {mode:<10} {len(tokens):>3} descriptors, num_tokens {_tokens(tokens)}")
    lines.append(f"  capacity   {result.capacity} rows")
    lines.append(f"  staging    {_buffers(result.plugin.buffers)} (total {result.staging_bytes} bytes)")
    lines.append("")
    stock = result.stock
    if stock.ok:
        lines.append(f"stock vLLM: boots ({_buffers(stock.buffers)})")
    else:
        lines.append("stock vLLM: crashes at capture")
        lines.append(f"  allocated by  {stock.allocated_by}")
        lines.append(f"  did not fit   {stock.failed_at}")
        lines.append(f"  vLLM's error  {stock.error}")
    if result.plugin_boots:
        same = result.identical_to_stock
        extra = "; buffers identical to stock" if same else ""
        lines.append(f"with the plugin (order {result.order}): boots, {result.capacity}-row buffers{extra}")
    else:
        why = result.plugin.error or f"buffers hold fewer than {result.capacity} rows"
        lines.append(f"with the plugin (order {result.order}): does NOT boot: {why}")
    if result.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def main(serve_argv: Sequence[str], order: str | None, as_json: bool, gpu_name: str = "h200") -> int:
    """Run the pre-flight and print it; the exit code says whether the plugin boots the configuration."""
    order = order or os.environ.get(ENV_ORDER, "").strip() or "descending"
    try:
        with _logs_to_stderr():
            result = run(serve_argv, order, GPUS[gpu_name])
    except BadArguments as exc:
        return _fail(EXIT_BAD_ARGUMENTS, "bad arguments", str(exc), as_json)
    except CannotCheckHere as exc:
        return _fail(EXIT_CANNOT_CHECK_HERE, "cannot check on this machine", str(exc), as_json)
    code = EXIT_BOOTS if result.plugin_boots else EXIT_FAILS
    if as_json:
        print(json.dumps({**result.to_json(), "exit_code": code}, indent=1))
    else:
        print(render(result))
    return code


def _fail(code: int, what: str, message: str, as_json: bool) -> int:
    if as_json:
        print(
            json.dumps({"plugin_version": __version__, "exit_code": code, "error": what, "message": message})
        )
    else:
        print(f"vllm-staging-plugin check: {what}:\n{message}", file=sys.stderr)
    return code
