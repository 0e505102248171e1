"""What every child program uses: checks run one after the other, each recorded with its value or its
traceback and what vLLM's log handlers printed meanwhile, and reported at once as ``RESULT:<json>``."""

from __future__ import annotations

import io
import json
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

RESULTS: dict[str, dict[str, Any]] = {}
Check = Callable[[], Any]


def check(name: str) -> Callable[[Check], Check]:
    """Run the decorated function at once; record its JSON-able return value or its traceback, and what
    vLLM's log handlers (which the plugin's logger reaches) printed meanwhile."""

    def run(function: Check) -> Check:
        log = io.StringIO()
        handlers = [h for h in logging.getLogger("vllm").handlers if isinstance(h, logging.StreamHandler)]
        streams = [h.setStream(log) for h in handlers]
        try:
            RESULTS[name] = {"value": function(), "error": None}
        except BaseException:
            RESULTS[name] = {"value": None, "error": traceback.format_exc()}
        finally:
            for handler, stream in zip(handlers, streams, strict=True):
                handler.setStream(stream)
            RESULTS[name]["log"] = log.getvalue()
        return function

    return run


def frames_under(prefix: str, action: Callable[[], Any]) -> list[str]:
    """The names of the functions whose files lie under ``prefix`` that are called while ``action`` runs."""
    seen: list[str] = []

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(prefix):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        action()
    finally:
        sys.setprofile(None)
    return seen


def report(results: dict[str, Any] | None = None) -> None:
    """The one line the parent reads: ``results``, or every check's."""
    print("RESULT:" + json.dumps(RESULTS if results is None else results), flush=True)
