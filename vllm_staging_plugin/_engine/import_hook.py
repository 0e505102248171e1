"""Run a callback right after a module is first imported, without importing it ourselves.

Importing vLLM's modules in ``register()`` would pull torch into processes that never build a graph manager
and could resolve the platform re-entrantly. A hook leaves ``sys.meta_path`` as soon as it fires.
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

    def __init__(self, inner: importlib.abc.Loader, hook: PostImportHook) -> None:
        self._inner = inner
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._hook.fire(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for inspect/linecache
        return getattr(self._inner, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, callback: Callback) -> None:
        self.fullname = fullname
        self.callback = callback
        self._asking = 0  # our own find_spec calls in progress: importlib asks this finder again

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.fullname or self._asking:
            return None
        self._asking += 1
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._asking -= 1
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def fire(self, module: ModuleType) -> None:
        """Leave ``sys.meta_path`` first (even if the callback raises), then call back once."""
        self.remove()
        self.callback(module)

    def remove(self) -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]


def when_imported(fullname: str, callback: Callback) -> PostImportHook | None:
    """Call ``callback(module)`` now if ``fullname`` is imported, else right after its import; returns the
    hook left waiting (None when the callback already ran), which the caller removes if it should not fire.
    Hooks of several callers for one module all fire, each wrapping the loader the next one found."""
    module = sys.modules.get(fullname)
    if module is not None:
        callback(module)
        return None
    hook = PostImportHook(fullname, callback)
    sys.meta_path.insert(0, hook)
    return hook
