"""Where a pre-flight's time goes: per phase wall seconds, reported in ``--json`` as ``seconds``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Phases:
    """Seconds per phase; a phase opened inside another is counted as its own, not as the outer one's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        self._open.append(name)
        try:
            yield
        finally:
            self._open.pop()
            spent = time.perf_counter() - started
            self.add(name, spent)
            if self._open:
                self.add(self._open[-1], -spent)

    def rounded(self) -> dict[str, float]:
        return {name: round(max(0.0, seconds), 3) for name, seconds in self.seconds.items()}
