"""Shared fixtures. vLLM's logger does not propagate, so log assertions attach their own handler.

The run keeps vLLM's cache in a folder of its own (``VLLM_CACHE_ROOT``, set before any worker or child
starts, so every process of the run shares it). ``model_inspection_cache`` fills vLLM's model-class
inspection cache there once, in-process: otherwise each process that meets an architecture first starts
vLLM's inspection subprocess, which imports vLLM again (10-20 s of CPU). The console-script test of a
first check starts from an empty cache of its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from childproc import EARLY, SHUFFLE_SEED, once_per_run, start_ups_environment
from configs import ARCHITECTURES
from fakes import patched_copy
from wrappers import is_patched

CACHE_VARIABLE = "VLLM_CACHE_ROOT"
_cache_key = pytest.StashKey[str | None]()  # the variable's value before the run


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or the only process): before any worker
        config.stash[_cache_key] = os.environ.get(CACHE_VARIABLE)
        os.environ[CACHE_VARIABLE] = tempfile.mkdtemp(prefix="vllm-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _cache_key in config.stash:
        shutil.rmtree(os.environ[CACHE_VARIABLE], ignore_errors=True)
        before = config.stash[_cache_key]
        if before is None:
            os.environ.pop(CACHE_VARIABLE)
        else:
            os.environ[CACHE_VARIABLE] = before


def _inspect_here() -> list[str]:
    """vLLM's own ``inspect_model_cls`` for each architecture the tests' models name, run in this process
    (as its subprocess would run it, on this machine's platform) so that vLLM writes its cache files.
    One this vLLM cannot inspect here is left to vLLM's own path (its subprocess); one it lacks, to its
    refusal."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return []
    inspected = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_run_in_subprocess", lambda fn: fn(), raising=False)
        for architecture in ARCHITECTURES:
            entry = registry.ModelRegistry.models.get(architecture)
            try:
                entry.inspect_model_cls()
            except Exception:  # absent here (None) or not importable: vLLM's own path decides
                continue
            inspected.append(architecture)
    return inspected


@pytest.fixture(scope="session")
def model_inspection_cache(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """For the tests that check a model: its architecture's inspection is in the run's cache already.
    Returns the architectures inspected."""
    inspected: list[str] = once_per_run(tmp_path_factory, "model-inspection", _inspect_here)
    return inspected


@pytest.fixture
def kda_fixed_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """vLLM 0.33.0 with the bundled kda-spec-state-slots.patch: vLLM's kimi_gdn_linear_attn.py patched
    (``fakes.patched_copy``), and its layer class put where vLLM's Kimi model module finds it (undone after
    the test)."""
    from vllm.model_executor.custom_op import op_registry
    from vllm.model_executor.layers.mamba.gdn import kimi_gdn_linear_attn as stock
    from vllm.models.kimi_k3.nvidia import model

    patch = Path(__file__).resolve().parents[1] / "vllm_staging_plugin/patches/kda-spec-state-slots.patch"
    monkeypatch.delitem(op_registry, stock.KimiGatedDeltaNetAttention.name)  # registered again by the copy
    module = patched_copy(stock, patch, tmp_path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(model, "KimiLinearGatedDeltaNetAttention", module.KimiGatedDeltaNetAttention)
    return module


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

    vllm_staging_plugin.unregister()  # no test may leak a wrapped class, a hook or the Ray variable
    assert not [f for f in sys.meta_path if isinstance(f, PostImportHook)]
    module = sys.modules.get("vllm.v1.worker.gpu.cudagraph_utils")
    cls = getattr(module, "ModelCudaGraphManager", None)
    assert not is_patched(cls)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub: a model that is not a local folder or in the cache is refused at once."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


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


EARLY_FILES = {"test_subprocess.py"}  # whose child starts with the run (childproc.EarlyChildren)


def _will_run(config: pytest.Config, path: Path) -> bool:
    """Whether the command line names ``path`` or a folder above it (no argument: the test paths)."""
    args = [a.split("::")[0] for a in config.args] or ["tests"]
    targets = [Path(config.invocation_params.dir, a).resolve() for a in args]
    return any(t == path or t in path.parents for t in targets)


def pytest_sessionstart(session: pytest.Session) -> None:
    """In one process (no xdist), start the start-ups child now: its import of vLLM runs beside the
    collection's. Under xdist, each worker starts it where its first test needs it."""
    config = session.config
    if os.environ.get("PYTEST_XDIST_WORKER") or config.option.collectonly or hasattr(config, "workerinput"):
        return
    if not _will_run(config, Path(__file__).parent / "test_subprocess.py"):
        return
    site = Path(tempfile.mkdtemp(prefix="policy-site-"))
    config.add_cleanup(lambda: shutil.rmtree(site, ignore_errors=True))
    config.add_cleanup(EARLY.stop)
    EARLY.start("test_subprocess", "start_ups", start_ups_environment(site, SHUFFLE_SEED))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, test files with ``subprocess``-marked tests go first (xdist hands out whole files, in
    this order), so that their children share the cores with the in-process tests rather than run last and
    alone. In one process, the files whose children start early go last: their children ran meanwhile."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        starting = {item.path for item in items if item.get_closest_marker("subprocess")}
        items.sort(key=lambda item: item.path not in starting)
        return
    items.sort(key=lambda item: item.path.name in EARLY_FILES)
