"""Shared fixtures. vLLM's logger does not propagate, so log assertions attach their own handler."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_ENV = [k for k in os.environ if k.startswith("STAGING_PLUGIN")]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]

    @property
    def warnings(self) -> list[str]:
        return self.at(logging.WARNING)


@pytest.fixture(autouse=True)
def clean_plugin_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with no plugin variables set and a fresh one-warning-per-process budget."""
    for key in list(os.environ):
        if key.startswith("STAGING_PLUGIN"):
            monkeypatch.delenv(key)
    from vllm_staging_plugin import patch

    monkeypatch.setattr(patch, "_state", {"warned": False, "announced": False})
    yield
    cls = getattr(sys.modules.get("vllm.v1.worker.gpu.cudagraph_utils"), "ModelCudaGraphManager", None)
    if isinstance(cls, type):  # no test may leak a patched class into the next one
        patch.unpatch(cls)
    from vllm_staging_plugin.import_hook import remove_hooks

    remove_hooks("vllm.v1.worker.gpu.cudagraph_utils")
    from vllm_staging_plugin import runner_guard

    remove_hooks(runner_guard.V1_RUNNER_MODULE)
    runner_guard.unguard(sys.modules.get(runner_guard.V1_RUNNER_MODULE))


@pytest.fixture
def plugin_log() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("vllm.staging_plugin")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)
