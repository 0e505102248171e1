"""Where a pre-flight's time goes: per phase wall seconds, reported in ``--json`` as ``seconds``.

benchmarks/preflight_speed.py reads them; vLLM's model inspection (its registry's subprocess, cached per
architecture under VLLM_CACHE_ROOT) runs inside the configuration build and is counted on its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    @contextlib.contextmanager
    def inspection_counted(self) -> Iterator[None]:
        """Count vLLM's model-class inspection as ``inspect`` (and not as ``configure``) for the block."""
        try:
            from vllm.model_executor.models import registry
        except ImportError:
            yield
            return
        inner: Callable[..., Any] = registry._try_inspect_model_cls

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.add("inspect", spent)
                self.add("configure", -spent)

        registry._try_inspect_model_cls = timed
        try:
            yield
        finally:
            registry._try_inspect_model_cls = inner

    def rounded(self) -> dict[str, float]:
        return {name: round(max(0.0, seconds), 3) for name, seconds in self.seconds.items()}
