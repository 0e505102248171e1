"""The pre-flight's configuration: vLLM's own ``vllm serve`` parser and ``create_engine_config``, with its
failures sorted into bad arguments and what this machine cannot check."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from collections.abc import Sequence
from typing import Any

from .. import seams
from ..text import first_line

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
        said = [line for line in errors.getvalue().splitlines() if "error:" in line]  # not the usage
        text = said[-1].strip() if said else f"vllm serve exited with {exc.code}"
        ours = [w for w in argv if w.split("=", 1)[0] in CHECK_OPTIONS]
        if "unrecognized arguments" in text and ours:
            text += f" ({' '.join(ours)}: options of the check go before `--`)"
        raise BadArguments(text) from None
    except Exception as exc:  # vLLM's own parser raised (a bad enum value in a JSON config: KeyError)
        raise BadArguments(f"{type(exc).__name__}: {exc}") from None
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what ServeSubcommand.cmd does
    try:
        validate_parsed_serve_args(args)
    except (ValueError, TypeError) as exc:
        raise BadArguments(f"{type(exc).__name__}: {exc}") from None
    return args


def _typo_of_a_folder(model: str) -> None:
    """A name that is no folder but close to one beside it is a mistyped folder (exit 2), not a hub name."""
    import difflib
    import os

    parent, name = os.path.split(os.path.expanduser(model))
    try:
        folders = [e.name for e in os.scandir(parent or ".") if e.is_dir()]
    except OSError:
        return
    close = difflib.get_close_matches(name, folders, n=1, cutoff=0.8)
    if close:
        guess = os.path.join(parent, close[0]) if parent else close[0]
        raise BadArguments(f"model {model!r}: no such folder; did you mean {guess!r}?")


def check_order(order: str, source: str = "--order") -> None:
    """A bad order (exit 2), named by where it came from: ``--order`` or STAGING_PLUGIN_ORDER."""
    from ..._engine.settings import DEFAULT_ORDER, ENV_ORDER, ConfigError, Settings

    if order == DEFAULT_ORDER:
        return
    from ..._engine.policies import PolicyRegistry

    try:
        PolicyRegistry.load().validate(Settings(order=order))
    except ConfigError as exc:
        text = str(exc)  # "STAGING_PLUGIN_ORDER='x': ...": name the flag instead when the flag gave it
        if source != ENV_ORDER:
            text = f"{source} {text.removeprefix(f'{ENV_ORDER}=')}"
        raise BadArguments(text) from None


def check_model(model: str, revision: str | None) -> None:
    """A missing or mistyped folder (exit 2), a hub name neither cached nor reachable (exit 3): one line."""
    _model_folder_exists(model)
    _hub_model_reachable(model, revision)


def check_model_early(argv: Sequence[str]) -> str | None:
    """:func:`check_model` before vLLM is imported (seconds sooner), for the usual form where the model
    comes first and no ``--revision`` is given; returns the model it checked, else None."""
    if not argv or argv[0].startswith("-") or any(w.startswith("--revision") for w in argv):
        return None
    check_model(argv[0], None)
    return argv[0]


def _model_folder_exists(model: str) -> None:
    """A model written as a path (``/``, ``./``, ``../``, ``~``) must be a folder: say so in one line.

    Without this, vLLM's hub client reports a missing folder as an invalid repository id.
    """
    import os

    if model.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(model)):
        what = "a file, not a model folder" if os.path.exists(os.path.expanduser(model)) else "no such folder"
        raise BadArguments(f"model {model!r}: {what} (a local model is a folder holding its config.json)")


# The check's own options, which a user may put after `--` by mistake (vLLM's parser then refuses them).
CHECK_OPTIONS = ("--order", "--json", "--gpu", "--gpus", "-v", "--verbose")
HUB_TIMEOUT = 3.0  # seconds to wait for the hub's address before saying it cannot be reached


def _hub_model_reachable(model: str, revision: str | None) -> None:
    """A hub name needs its config.json from the cache or the hub: when neither can give it, say so at
    once (exit 3) instead of letting the hub client retry for half a minute."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.path.isdir(os.path.expanduser(model)) or os.environ.get("VLLM_USE_MODELSCOPE", "").lower() in (
        "1", "true"):  # fmt: skip
        return
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import ENDPOINT, HF_HUB_OFFLINE
    except ImportError:
        return
    try:
        cached = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:  # not a valid repository id: vLLM's own message says so
        return
    if isinstance(cached, str):
        return
    _typo_of_a_folder(model)
    fix = (f"put its config.json in a folder and give that folder (./{model.rsplit('/', 1)[-1]}), or run "
           "where the hub is reachable")  # fmt: skip
    if HF_HUB_OFFLINE:
        raise CannotCheckHere(
            f"model {model!r} is not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE is "
            f"set (unset it to fetch the config): {fix}"
        )
    host = urlparse(ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_TIMEOUT).close()
    except OSError as exc:
        raise CannotCheckHere(
            f"model {model!r} is not a local folder and the hub ({host}) cannot be reached from this machine "
            f"({exc}): {fix}"
        ) from None


def inspect_model_classes(model: str) -> None:
    """Have vLLM's registry inspect the model's architectures (a subprocess the first time, then its
    cache), so the configuration build that follows finds them cached. Local folders only; a hub
    model is inspected inside the configuration build."""
    path = os.path.join(os.path.expanduser(model), "config.json")
    try:
        with open(path) as f:
            architectures = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return
    for architecture in architectures:
        if isinstance(architecture, str):
            seams.inspect_architecture(architecture)


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
        kind, text = seams.config_failure(exc)
        if kind == "kernel-library":
            raise CannotCheckHere(
                f"building the configuration asks vLLM's CUDA kernel library, which this machine does not "
                f"have ({first_line(text)}); {GPU_HOST}"
            ) from exc
        if kind == "inspection":
            raise CannotCheckHere(
                f"vLLM cannot inspect the model class on this machine ({first_line(text)}); {GPU_HOST}"
            ) from exc
        if kind == "unknown-architecture":
            raise BadArguments(
                f"{condense(text)}: vLLM {_vllm_version()} does not know this architecture (check "
                "`architectures` in config.json and the vLLM version)"
            ) from exc
        raise BadArguments(condense(text)) from exc


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
