"""The docs' terminal sessions run as typed: every ``console`` block of README.md and the operators' guide,
run from the checkout's root after the README's set-up, prints the lines the block shows, in that order
(a block may leave lines out). The blocks show vLLM 0.33.0's answers; each runs a pre-flight that imports
vLLM (about 20 s), so the test runs under the ``extended`` marker."""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
from childproc import clean_environment

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "operators-guide.md"]
BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


def sessions() -> list[tuple[str, str, list[str]]]:
    """(page, the command as typed, the lines shown after it) for each console block."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text()):
            lines = block.splitlines()
            assert lines[0].startswith("$ "), f"{page.name}: a console block starts with its `$ ` line"
            command = [lines[0][2:]]
            while command[-1].endswith("\\"):
                command.append(lines[len(command)])
            found.append((page.name, "\n".join(command), lines[len(command) :]))
    return found


def test_the_docs_have_sessions_and_each_calls_what_the_set_up_made() -> None:
    assert sessions()  # the README's K3 example at least
    for page, command, _ in sessions():
        assert command.startswith(".venv/bin/"), f"{page}: {command!r} is not found after the README's set-up"


@pytest.mark.extended
@pytest.mark.skipif(version("vllm") != "0.33.0", reason="the docs show vLLM 0.33.0's answers")
@pytest.mark.parametrize(("page", "command", "shown"), sessions(), ids=[page for page, _, _ in sessions()])
def test_each_session_prints_what_the_docs_show(page: str, command: str, shown: list[str]) -> None:
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=clean_environment({"HF_HUB_OFFLINE": "1"}))  # fmt: skip
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    at = 0
    for line in (line.rstrip() for line in shown):
        assert line in printed[at:], (
            f"{page}: not printed (after line {at}): {line!r}\n{done.stdout}{done.stderr}"
        )
        at = printed.index(line, at) + 1
