"""Shared fixtures. vLLM's logger does not propagate, so log assertions attach their own handler."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest


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
    """Every test starts with no plugin variables set and ends with the process as it found it."""
    for key in list(os.environ):
        if key.startswith("STAGING_PLUGIN"):
            monkeypatch.delenv(key)
    yield
    import vllm_staging_plugin
    from vllm_staging_plugin._engine.import_hook import PostImportHook
    from vllm_staging_plugin._engine.wrapping import is_plugin_wrapper

    vllm_staging_plugin.unregister()  # no test may leak a wrapped class, a hook or the Ray variable
    assert not [f for f in sys.meta_path if isinstance(f, PostImportHook)]
    module = sys.modules.get("vllm.v1.worker.gpu.cudagraph_utils")
    cls = getattr(module, "ModelCudaGraphManager", None)
    assert cls is None or not any(is_plugin_wrapper(cls.__dict__.get(n)) for n in ("__init__", "capture"))


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
