"""PDL off for one boot of the study: ``vllm.platforms.cuda.CudaPlatform.is_arch_support_pdl`` returns False.

Loaded only when the ``pdl-off`` variant puts this folder first on PYTHONPATH (study.boot.variant_env), so
every process of that boot (front end, engine core, whether forked or spawned) runs it at start-up, before
vLLM is imported. It waits for ``vllm.platforms.cuda`` to be imported and patches the class then; each
patched process prints one ``study-shim: PDL off`` line, which the log analysis counts. Any sitecustomize
this one shadows is still run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "vllm.platforms.cuda"
HERE = os.path.dirname(os.path.abspath(__file__))


def _patch(module: ModuleType) -> None:
    def is_arch_support_pdl(cls: Any) -> bool:
        return False

    module.CudaPlatform.is_arch_support_pdl = classmethod(is_arch_support_pdl)  # type: ignore[attr-defined]
    print(f"study-shim: PDL off (is_arch_support_pdl -> False) pid {os.getpid()}", file=sys.stderr)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``TARGET`` through the other finders and patches it once its module has run."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once per process; the other finders do the finding
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this file shadows, if any (Python imports only the first one on sys.path)."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("STUDY_SHIM_PDL_OFF") == "1":
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _AfterImport())
_chain()
