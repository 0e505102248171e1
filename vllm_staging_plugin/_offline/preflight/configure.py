"""The pre-flight's configuration: the model classes inspected, then vLLM's own ``create_engine_config``
as the API server calls it, its failures sorted into bad arguments and what this machine cannot check."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .. import seams
from ..text import first_line
from .missing import missing_behind, missing_module
from .refusals import GPU_HOST, BadArguments, CannotCheckHere


def inspect_model_classes(model: str) -> None:
    """Have vLLM's registry inspect the model's architectures (a subprocess the first time, then its
    cache), so the configuration build that follows finds them cached. Local folders only; a hub
    model is inspected inside the configuration build."""
    for architecture in _architectures(model):
        seams.inspect_architecture(architecture)


def create_engine_config(args: argparse.Namespace) -> Any:
    """``AsyncEngineArgs.from_cli_args(args).create_engine_config`` as the API server calls it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
        return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except ImportError as exc:
        missing = missing_module(exc)
        if missing is not None:
            raise CannotCheckHere(f"building the configuration failed: {missing.advice}") from exc
        raise CannotCheckHere(
            f"building the configuration imports a module this machine cannot load ({type(exc).__name__}: "
            f"{exc}); {GPU_HOST}"
        ) from exc
    except Exception as exc:
        kind, text = seams.config_failure(exc)
        if kind == "kernel-library":
            raise CannotCheckHere(
                f"building the configuration asks vLLM's CUDA kernel library, which this machine does not "
                f"have ({first_line(text)}); {GPU_HOST}"
            ) from exc
        if kind == "inspection":
            missing = missing_behind(exc, _architectures(str(args.model)))
            if missing is not None:
                raise CannotCheckHere(f"vLLM cannot inspect the model class: {missing.advice}") from exc
            raise CannotCheckHere(
                f"vLLM cannot inspect the model class on this machine ({first_line(text)}); {GPU_HOST}"
            ) from exc
        if kind == "unknown-architecture":
            raise BadArguments(
                f"{condense(text)}: vLLM {_vllm_version()} does not know this architecture (check "
                "`architectures` in config.json and the vLLM version)"
            ) from exc
        raise BadArguments(condense(text)) from exc


def _architectures(model: str) -> list[str]:
    path = os.path.join(os.path.expanduser(model), "config.json")
    try:
        with open(path) as f:
            found = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [a for a in found if isinstance(a, str)]


def condense(text: str) -> str:
    """One line from a vLLM refusal: a pydantic ValidationError's own ``Value error, ...`` sentence with
    the class named, without pydantic's input dump and help link; any other text's lines joined."""
    import re

    found = re.search(r"validation errors? for (\w+)\s+(?:Value error, )?(.*?)(?:\s*\[type=|$)", text, re.S)
    if found:
        return f"{found.group(1)}: {' '.join(found.group(2).split())}"
    return " ".join(text.split())


def _vllm_version() -> str:
    from ..._engine import compat

    return compat.installed_versions()["vllm"] or "?"
