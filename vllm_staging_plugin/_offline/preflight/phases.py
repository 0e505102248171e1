"""Where a pre-flight's time goes: per phase wall seconds, reported in ``--json`` as ``seconds``.

benchmarks/preflight_speed.py reads them. vLLM's model inspection (its registry's subprocess, cached per
architecture under VLLM_CACHE_ROOT) is run on its own before the configuration build and counted as
``inspect``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


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

    def rounded(self) -> dict[str, float]:
        return {name: round(max(0.0, seconds), 3) for name, seconds in self.seconds.items()}
