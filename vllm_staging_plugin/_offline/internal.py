"""An error of the plugin's own (a bug, or a vLLM private that changed under a seam): its own exit code,
one line saying what broke and where, and the traceback only under ``-v``.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from .exits import Exit, say_error
from .text import first_line

PACKAGE = Path(__file__).resolve().parent.parent
REPORT = "please report it with this line, `vllm-staging-plugin --version` and `pip show vllm`"


class SeamChanged(Exception):
    """The installed vLLM no longer has a private a seam relies on; the message names it."""


def is_internal(exc: BaseException) -> bool:
    """A seam found a vLLM private changed, or the innermost frame is the plugin's own code."""
    if isinstance(exc, SeamChanged):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(PACKAGE)


def where(exc: BaseException) -> str:
    """``module:line in function`` of the innermost frame inside the plugin."""
    inside = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if Path(f.filename).resolve().is_relative_to(PACKAGE)
    ]
    if not inside:
        return "outside the plugin"
    frame = inside[-1]
    module = Path(frame.filename).resolve().relative_to(PACKAGE.parent).with_suffix("")
    return f"{'.'.join(module.parts)}:{frame.lineno} in {frame.name}"


def describe(exc: BaseException) -> str:
    """The one line: what broke, where, and what to do."""
    what = (
        "a vLLM private the plugin reads changed"
        if isinstance(exc, SeamChanged)
        else "a bug in the plugin, or a vLLM change it does not know"
    )
    return (
        f"internal error ({what}): {type(exc).__name__}: {first_line(str(exc))} "
        f"(at {where(exc)}); {REPORT} (-v prints the traceback)"
    )


def traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def fail(exc: BaseException, prog: str, verbose: bool, as_json: bool) -> int:
    """Say it (``prog: <the one line>`` on stderr, or one JSON object on stdout), the traceback first
    under ``-v``; returns :attr:`Exit.INTERNAL`."""
    if verbose:
        print(traceback_text(exc), file=sys.stderr, end="")
    return say_error(prog, Exit.INTERNAL, "internal error", describe(exc), as_json, labelled=False)
