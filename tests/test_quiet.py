"""quiet_logs: what it sets for the check's own vLLM import, what it leaves to the operator, what it drops.

The console-script tests in test_cli_inputs.py show the result in fresh processes (quiet by default,
everything with ``-v``); these pin each branch, in this process, on real loggers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")
from vllm_staging_plugin._offline.quiet import CPU_ONLY, EXPLAINED, LEVEL_VARIABLE, quiet_logs

VLLM = logging.getLogger("vllm")


@pytest.fixture
def vllm_level() -> Iterator[int]:
    """The "vllm" logger's level, restored after the test whatever it does."""
    level = VLLM.level
    VLLM.setLevel(logging.INFO)
    yield logging.INFO
    VLLM.setLevel(level)


def dropped(name: str, message: str) -> bool:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)
    return not logging.getLogger(name).filter(record)


@pytest.mark.parametrize("imported", [True, False], ids=["vllm-imported", "vllm-not-imported"])
def test_by_default_the_check_runs_at_warning_and_the_process_gets_its_state_back(
    imported: bool, monkeypatch: pytest.MonkeyPatch, vllm_level: int, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(LEVEL_VARIABLE, raising=False)
    if not imported:
        monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with quiet_logs(verbose=False):
        assert os.environ[LEVEL_VARIABLE] == "WARNING"  # for vLLM's import and its inspection subprocess
        # vLLM configured before (an in-process caller): lowered here; else its import reads the variable
        assert VLLM.level == (logging.WARNING if imported else vllm_level)
        assert all(dropped(name, prefix + ": details") for name, prefix in CPU_ONLY)
        assert not dropped("vllm.platforms.cpu", "any other warning")
    assert LEVEL_VARIABLE not in os.environ and VLLM.level == vllm_level
    assert not any(dropped(name, prefix) for name, prefix in CPU_ONLY)
    assert capsys.readouterr().err == ""


def test_the_operators_own_level_is_kept(monkeypatch: pytest.MonkeyPatch, vllm_level: int) -> None:
    monkeypatch.setenv(LEVEL_VARIABLE, "INFO")
    with quiet_logs(verbose=False):
        assert os.environ[LEVEL_VARIABLE] == "INFO" and VLLM.level == vllm_level
        assert all(dropped(name, prefix) for name, prefix in CPU_ONLY)  # the CPU-only lines still go
    assert os.environ[LEVEL_VARIABLE] == "INFO" and VLLM.level == vllm_level


def test_verbose_changes_nothing_and_says_why_the_messages_come(
    monkeypatch: pytest.MonkeyPatch, vllm_level: int, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(LEVEL_VARIABLE, raising=False)
    with quiet_logs(verbose=True):
        assert LEVEL_VARIABLE not in os.environ and VLLM.level == vllm_level
        assert not any(dropped(name, prefix) for name, prefix in CPU_ONLY)
    assert capsys.readouterr().err == EXPLAINED + "\n"
