"""The pre-flight's configuration: vLLM's own ``vllm serve`` parser and ``create_engine_config``, then the
inputs Model Runner V2 would give ``ModelCudaGraphManager``."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_HOST = "run the check on the GPU host, where vLLM's own CUDA platform answers"


class BadArguments(Exception):
    """vLLM rejected the ``vllm serve`` arguments; the message is vLLM's own."""


class CannotCheckHere(Exception):
    """vLLM itself cannot inspect this configuration on this machine."""


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
    _model_folder_exists(str(args.model))
    return args


def _model_folder_exists(model: str) -> None:
    """A model written as a path (``/``, ``./``, ``../``, ``~``) must be a folder: say so in one line.

    Without this, vLLM's hub client reports a missing folder as an invalid repository id.
    """
    import os

    if model.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(model)):
        what = "a file, not a model folder" if os.path.exists(os.path.expanduser(model)) else "no such folder"
        raise BadArguments(f"model {model!r}: {what} (a local model is a folder holding its config.json)")


def create_engine_config(args: argparse.Namespace) -> Any:
    """``AsyncEngineArgs.from_cli_args(args).create_engine_config`` as the API server calls it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
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
