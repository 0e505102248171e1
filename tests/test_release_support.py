"""Per-release verdict against the installed vLLM (any release; see lab/compat_matrix.py).

Supported: register() patches the real class. Refused: vLLM is left untouched with exactly one warning.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from wrappers import is_patched

pytest.importorskip("vllm")

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat

pytestmark = pytest.mark.contract


def _module_or_reason() -> Any:
    try:
        module = importlib.import_module(compat.CUDAGRAPH_MODULE)
        compat.manager_class(module)
    except compat.IncompatibleVllm as exc:
        return str(exc)
    except ImportError as exc:
        return f"{compat.CUDAGRAPH_MODULE} does not import: {exc}"
    return module


SUPPORT = _module_or_reason()


@pytest.mark.skipif(isinstance(SUPPORT, str), reason=f"release refused: {SUPPORT}")
def test_supported_release_is_patched(plugin_log: Any) -> None:
    vllm_staging_plugin.register()
    assert is_patched(SUPPORT.ModelCudaGraphManager)
    assert plugin_log.warnings == []


@pytest.mark.skipif(not isinstance(SUPPORT, str), reason="release supported")
def test_refused_release_is_left_untouched_with_one_warning(plugin_log: Any) -> None:
    module = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
    before = {name: dict(vars(obj)) for name, obj in vars(module).items() if isinstance(obj, type)}
    vllm_staging_plugin.register()
    vllm_staging_plugin.register()
    after = {name: dict(vars(obj)) for name, obj in vars(module).items() if isinstance(obj, type)}
    assert before == after  # no class of vLLM's module changed
    assert len(plugin_log.warnings) == 1 and "vllm-staging-plugin is inactive" in plugin_log.warnings[0]


@pytest.mark.skipif(not isinstance(SUPPORT, str), reason="release supported")
def test_refused_release_strict_mode_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    with pytest.raises(compat.IncompatibleVllm, match="strict mode"):
        vllm_staging_plugin.register()
