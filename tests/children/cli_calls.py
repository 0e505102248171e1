"""The CLI's ``main`` called in one process for each case of ``CALLS`` (JSON: name, argv, variables), as
the console script calls it; tests/test_cli_inputs.py reads what each printed and returned, and whether
vLLM or torch was imported by then. The hub variables are read when ``huggingface_hub`` is imported, so
each call sets the constants they become."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from children.harness import check, report
from vllm_staging_plugin._offline.cli import main as cli_main


def _offline(value: str) -> bool:
    return value == "1"


HUB: dict[str, tuple[str, Callable[[str], Any]]] = {
    "HF_HUB_OFFLINE": ("HF_HUB_OFFLINE", _offline),
    "HF_ENDPOINT": ("ENDPOINT", str),
}


def call(words: list[str], variables: dict[str, str]) -> dict[str, Any]:
    import huggingface_hub.constants as hub

    saved, constants = dict(os.environ), {name: getattr(hub, name) for name, _ in HUB.values()}
    os.environ.update(variables)
    for variable, (name, value) in HUB.items():
        if variable in variables:
            setattr(hub, name, value(variables[variable]))
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(words)  # what the console script runs: sys.exit(main())
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for name, value in constants.items():
            setattr(hub, name, value)
    return {
        "code": code,
        "out": out.getvalue(),
        "err": err.getvalue(),
        "vllm": "vllm" in sys.modules,
        "torch": "torch" in sys.modules,
    }


def main() -> None:
    for name, words, variables in json.loads(os.environ["CALLS"]):
        check(name)(functools.partial(call, words, variables))
    report()


if __name__ == "__main__":
    main()
