"""The post-import hook that defers the patch until vLLM imports cudagraph_utils."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_staging_plugin._engine.import_hook import PostImportHook, when_imported

MISSING = "hookpkg.missing"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pkg = tmp_path / "hookpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n\ndef answer():\n    return VALUE + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hookpkg.target"
    for hook in [f for f in sys.meta_path if isinstance(f, PostImportHook)]:
        hook.remove()
    for name in ("hookpkg.target", "hookpkg"):
        sys.modules.pop(name, None)


def hooked() -> list[str]:
    return [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]


def test_callback_runs_once_after_the_module_body(package: str) -> None:
    seen: list[int] = []

    def callback(module: ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE = 1

    hook = when_imported(package, callback)
    assert hook is not None and hooked() == [package] and sys.meta_path[0] is hook
    import hookpkg.target as target

    assert seen == [41] and target.answer() == 2
    assert hooked() == []  # it left sys.meta_path when it fired
    assert "return VALUE + 1" in inspect.getsource(target.answer)  # loader delegation keeps inspect working


def test_already_imported_module_is_handled_at_once(package: str) -> None:
    import hookpkg.target  # noqa: F401

    seen: list[str] = []
    assert when_imported(package, lambda m: seen.append(m.__name__)) is None
    assert seen == [package] and hooked() == []


def test_a_hook_leaves_sys_meta_path_even_when_its_callback_raises(package: str) -> None:
    def broken(module: ModuleType) -> None:
        raise RuntimeError("callback failed")

    when_imported(package, broken)
    with pytest.raises(RuntimeError, match="callback failed"):
        importlib.import_module(package)
    assert hooked() == []


def test_a_probe_before_the_import_does_not_disarm_the_hook(package: str) -> None:
    """Code that probes with importlib.util.find_spec (vLLM does, for optional modules) before the real
    import must not use up the hook."""
    seen: list[str] = []
    when_imported(package, lambda m: seen.append(m.__name__))
    assert importlib.util.find_spec(package) is not None
    assert importlib.util.find_spec(package) is not None
    importlib.import_module(package)
    assert seen == [package]


def test_a_hooked_module_that_does_not_exist_still_raises_module_not_found(package: str) -> None:
    when_imported(MISSING, lambda m: None)
    with pytest.raises(ModuleNotFoundError, match=r"hookpkg\.missing"):
        importlib.import_module(MISSING)


def test_the_hooked_loader_answers_like_the_real_one(package: str) -> None:
    """inspect, linecache, pkgutil and coverage tools ask the loader more than exec_module."""
    when_imported(package, lambda m: None)
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.loader is not None
    loader: Any = spec.loader
    assert loader.get_filename(package).endswith("target.py") and loader.is_package(package) is False
    assert loader.get_source(package) == "VALUE = 41\n\ndef answer():\n    return VALUE + 1\n"


class _Claimer:
    """Another meta-path finder (an editable install, another plugin's hook) that can load the module."""

    def __init__(self, fullname: str) -> None:
        self.fullname = fullname

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        return importlib.machinery.PathFinder.find_spec(fullname, path) if fullname == self.fullname else None


def test_the_hook_goes_ahead_of_finders_already_installed(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "meta_path", [_Claimer(package), *sys.meta_path])
    seen: list[str] = []
    when_imported(package, lambda m: seen.append(m.__name__))
    importlib.import_module(package)
    assert seen == [package]


def test_removing_one_hook_keeps_the_others(package: str) -> None:
    when_imported(package, lambda m: None)
    hook = when_imported(MISSING, lambda m: None)
    assert hook is not None
    hook.remove()
    hook.remove()  # twice: nothing more goes
    assert hooked() == [package]


def test_two_callers_hooks_for_one_module_both_fire_once(package: str) -> None:
    """Each caller owns its hook: the second does not replace or reuse the first, and both run."""
    seen: list[str] = []
    first = when_imported(package, lambda m: seen.append("first"))
    second = when_imported(package, lambda m: seen.append("second"))
    assert first is not None and second is not None and first is not second
    importlib.import_module(package)
    assert sorted(seen) == ["first", "second"] and hooked() == []


def test_a_removed_hook_does_not_fire_and_the_other_still_does(package: str) -> None:
    seen: list[str] = []
    first = when_imported(package, lambda m: seen.append("first"))
    second = when_imported(package, lambda m: seen.append("second"))
    assert first is not None and second is not None
    second.remove()
    importlib.import_module(package)
    assert seen == ["first"]
