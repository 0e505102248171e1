"""The command's exit codes, one table for every command, and the one way an error is said: a line on
stderr, or with ``--json`` one object on stdout."""

from __future__ import annotations

import json
import sys
from enum import IntEnum


class Exit(IntEnum):
    """What each command's exit code means (the ``--help`` epilogs say it per command)."""

    OK = 0  # check: the plugin boots it / would patch this vLLM; report and patch: done
    # does not boot even with the plugin; would not patch; a bundled patch does not fit; no receipt
    FAILS = 1
    BAD_INPUT = 2  # a bad argument, path, file or STAGING_PLUGIN_* value
    CANNOT_CHECK = 3  # this machine cannot answer: what to install, or where to run the check
    WILL_NOT_SERVE = 4  # it boots with the plugin, but vLLM's shared KDA layer faults while serving
    NOT_ANSWERED = 5  # a question that could change the verdict was not answered here
    INTERNAL = 70  # a bug in the plugin, or a vLLM change it does not know (sysexits' EX_SOFTWARE)


def say_error(prog: str, code: Exit, what: str, message: str, as_json: bool, labelled: bool = True) -> int:
    """``prog: what: message`` on stderr (``labelled=False``: ``prog: message``), or one JSON object on
    stdout with ``--json``; returns the exit code."""
    if as_json:
        from .. import __version__

        said = {"plugin_version": __version__, "exit_code": int(code), "error": what, "message": message}
        print(json.dumps(said))
    else:
        print(f"{prog}: {what}: {message}" if labelled else f"{prog}: {message}", file=sys.stderr)
    return int(code)
