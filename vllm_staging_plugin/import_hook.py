"""Run a callback right after a module is first imported, without importing it ourselves.

``register()`` runs in every vLLM process (front end, engine core, workers) at plugin-loading time.
Importing ``cudagraph_utils`` there would pull torch and much of vLLM into processes that never build a
graph manager, and could resolve the platform re-entrantly. Instead the patch waits for vLLM to import
the module (``model_runner`` does, before any manager exists) and applies then.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _CallbackLoader(importlib.abc.Loader):
    """Delegates everything to the real loader and calls back after the module body ran."""

    def __init__(self, inner: importlib.abc.Loader, callback: Callback) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for inspect/linecache
        return getattr(self._inner, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, callback: Callback) -> None:
        self.fullname = fullname
        self.callback = callback
        self._resolving = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.fullname or self._resolving:
            return None
        self._resolving = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


def when_imported(fullname: str, callback: Callback) -> None:
    """Call ``callback(module)`` now if ``fullname`` is imported, else right after its import."""
    module = sys.modules.get(fullname)
    if module is not None:
        callback(module)
        return
    if not any(isinstance(f, PostImportHook) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportHook(fullname, callback))


def remove_hooks(fullname: str) -> None:
    sys.meta_path[:] = [
        f for f in sys.meta_path if not (isinstance(f, PostImportHook) and f.fullname == fullname)
    ]
