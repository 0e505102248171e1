"""The pre-flight's arguments: the ``vllm serve`` words through vLLM's own parser and validation, and the
order to check, each refused in one line naming what was wrong."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import re
from collections.abc import Sequence

from .refusals import BadArguments

# The check's own options, which a user may put after `--` by mistake (vLLM's parser then refuses them).
CHECK_OPTIONS = ("--order", "--json", "--gpu", "--gpus", "-v", "--verbose")
PARSER_MODULE = "vllm.entrypoints.common.cli_args"  # `vllm serve`'s parser


def has_serve_parser() -> bool:
    """Whether the installed vLLM has the ``vllm serve`` parser the check builds on."""
    try:
        return importlib.util.find_spec(PARSER_MODULE) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


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
        text = _error_line(errors.getvalue()) or f"vllm serve exited with {exc.code}"
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


NOT_CONVERTED = re.compile(
    r"argument (\S+?): Value (.*) cannot be converted to <function loads at 0x[0-9a-f]+>\.?$"
)


def _error_line(printed: str) -> str | None:
    """argparse's ``error:`` line (not the usage), with what follows it on one line: a pydantic-validated
    option (``-cc``) says only "1 validation error for CompilationConfig" there and the cause below."""
    lines = printed.splitlines()
    at = [i for i, line in enumerate(lines) if "error:" in line]
    if not at:
        return None
    cause = [line.strip() for line in lines[at[-1] + 1 :] if line.strip() and "errors.pydantic" not in line]
    return ": ".join([_not_json(lines[at[-1]].strip()), *cause])


def _not_json(text: str) -> str:
    """argparse's ``Value ... cannot be converted to <function loads at 0x...>`` for a JSON option, as
    what is wrong with the JSON (json's own words) instead."""
    found = NOT_CONVERTED.search(text)
    if found is None:
        return text
    flag, value = found.groups()
    try:
        json.loads(value)
    except ValueError as exc:
        return f"vllm serve: error: argument {flag}: not valid JSON ({exc}): {value}"
    return text


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
