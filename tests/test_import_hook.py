"""The post-import hook that defers the patch until vLLM imports cudagraph_utils."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vllm_staging_plugin._engine.import_hook import PostImportHook, remove_hooks, when_imported


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "hookpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n\ndef answer():\n    return VALUE + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hookpkg.target"
    remove_hooks("hookpkg.target")
    for name in ("hookpkg.target", "hookpkg"):
        sys.modules.pop(name, None)


def test_callback_runs_once_after_the_module_body(package: str) -> None:
    seen: list[int] = []

    def callback(module: ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE = 1

    when_imported(package, callback)
    when_imported(package, callback)  # a second register() does not add a second hook
    assert sum(isinstance(f, PostImportHook) and f.fullname == package for f in sys.meta_path) == 1
    import hookpkg.target as target

    assert seen == [41] and target.answer() == 2
    assert "return VALUE + 1" in inspect.getsource(target.answer)  # loader delegation keeps inspect working


def test_already_imported_module_is_handled_at_once(package: str) -> None:
    import hookpkg.target  # noqa: F401

    seen: list[str] = []
    when_imported(package, lambda m: seen.append(m.__name__))
    assert seen == [package]
    assert not any(isinstance(f, PostImportHook) and f.fullname == package for f in sys.meta_path)
