"""The pre-flight's configuration: the model classes inspected, then vLLM's own ``create_engine_config``
as the API server calls it, its failures sorted into bad arguments and what this machine cannot check."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from ..._engine.compat import installed_versions
from .. import seams
from ..text import first_line
from .missing import missing_behind, missing_module
from .refusals import GPU_HOST, BadArguments, CannotCheckHere


def inspect_model_classes(model: str) -> None:
    """Have vLLM's registry inspect the model's architectures (a subprocess the first time, then its
    cache), so the configuration build that follows finds them cached. Local folders only; a hub
    model is inspected inside the configuration build."""
    for architecture in _architectures(_config(model)):
        seams.inspect_architecture(architecture)


def create_engine_config(args: argparse.Namespace, argv: Sequence[str] = ()) -> Any:
    """``AsyncEngineArgs.from_cli_args(args).create_engine_config`` as the API server calls it; ``argv``:
    the operator's words, so that a refusal names the options they gave."""
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
            missing = missing_behind(exc, _architectures(_config(str(args.model))))
            if missing is not None:
                raise CannotCheckHere(f"vLLM cannot inspect the model class: {missing.advice}") from exc
            raise CannotCheckHere(
                f"vLLM cannot inspect the model class on this machine ({first_line(text)}); {GPU_HOST}"
            ) from exc
        if kind == "unknown-architecture":
            raise BadArguments(f"{condense(text)}: {_unknown()}") from exc
        if kind == "unknown-model-type":
            config = _config(str(args.model))
            raise BadArguments(
                f"ModelConfig: model type {config.get('model_type', '?')!r} (architectures "
                f"{_architectures(config)}) is not one Transformers knows: {_unknown()}"
            ) from exc
        raise BadArguments(_validation_errors(exc, argv) or condense(text)) from exc


_UNKNOWN_TAIL = "does not know this architecture (check `architectures` in config.json and the vLLM version)"


def _unknown() -> str:
    return f"vLLM {installed_versions()['vllm'] or '?'} {_UNKNOWN_TAIL}"


def _validation_errors(exc: BaseException, argv: Sequence[str]) -> str | None:
    """Every error of a pydantic refusal in one line, the options the operator gave first and named as
    given (``--max-num-seqs``): pydantic reports a field vLLM derived from one (``max_num_batched_tokens``)
    beside it. None when the refusal is no pydantic validation of fields."""
    found: Any = next(
        (e for e in (exc, exc.__cause__, exc.__context__) if callable(getattr(e, "errors", None))), None
    )
    try:
        errors = list(found.errors()) if found is not None else []
    except Exception:
        return None
    fields = [(".".join(map(str, e.get("loc") or ())), str(e.get("msg", ""))) for e in errors]
    if not fields or not all(field for field, _ in fields):
        return None  # a model-level "Value error, ..." sentence: condense() keeps vLLM's own words
    given = {w[2:].split("=", 1)[0].replace("-", "_") for w in argv if w.startswith("--")}
    ordered = sorted(fields, key=lambda item: item[0] not in given)
    said = [
        f"{field} (--{field.replace('_', '-')}) {msg}" if field in given else f"{field} {msg}"
        for field, msg in ordered
    ]
    return f"{getattr(found, 'title', type(found).__name__)}: {'; '.join(said)}"


def _config(model: str) -> dict[str, Any]:
    """The model folder's config.json, or nothing where there is none to read."""
    path = os.path.join(os.path.expanduser(model), "config.json")
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _architectures(config: dict[str, Any]) -> list[str]:
    return [a for a in config.get("architectures") or [] if isinstance(a, str)]


def condense(text: str) -> str:
    """One line from a vLLM refusal: a pydantic ValidationError's own ``Value error, ...`` sentence with
    the class named, without pydantic's input dump and help link; any other text's lines joined."""
    import re

    found = re.search(r"validation errors? for (\w+)\s+(?:Value error, )?(.*?)(?:\s*\[type=|$)", text, re.S)
    if found:
        return f"{found.group(1)}: {' '.join(found.group(2).split())}"
    return " ".join(text.split())
