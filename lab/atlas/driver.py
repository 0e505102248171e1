"""Runs the search on several releases: one worker process per release (its own vLLM, an older one as its
Python files overlaid on the installed environment), a few at a time, the long full search first.

The worker prints one line, :data:`PREFIX` then the row as JSON (:func:`worker_line`); how a worker is
started and how an older release's environment is built are the caller's (``lab/stock_atlas.py`` and
``atlas.overlay.release_env``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PREFIX = "ATLAS:"
Row = dict[str, Any]
ReleaseEnv = Callable[[str], tuple[Mapping[str, str], Mapping[str, object], str]]
"""``overlay.release_env``, paths bound: (environment, the plugin's verdict, torch pin) of a release."""


def worker_line(row: Row) -> str:
    return PREFIX + json.dumps(row)


def run_release(
    version: str,
    scope: str,
    *,
    installed: str,
    memo: bool,
    with_sweep: bool,
    worker: Sequence[str],
    release_env: ReleaseEnv,
    cwd: Path,
) -> Row:
    """One release's row: ``worker`` (a command line) plus the scope and flags, run in ``version``'s
    environment (the current one for the installed release); an error row if it does not run."""
    command = [*worker, scope, *([] if memo else ["--no-memo"])]
    command += [] if with_sweep else ["--no-sweep"]
    env = None
    if version != installed:
        overlay, probe, _ = release_env(version)
        if probe["verdict"] != "supported":
            return {"release": version, "error": f"plugin verdict {probe['verdict']}: {probe['why']}"}
        env = dict(overlay)
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    line = next((x for x in done.stdout.splitlines() if x.startswith(PREFIX)), None)
    if line is None:
        return {"release": version, "error": done.stderr[-600:]}
    row: Row = json.loads(line[len(PREFIX) :])
    return row


def run_releases(
    releases: Sequence[str],
    scope_of: Callable[[str], str],
    jobs: int,
    run: Callable[[str, str], Row],
) -> Iterator[Row]:
    """``run(release, scope)`` for every release, ``jobs`` at a time, the full searches started first;
    rows come back in the order of ``releases``, each as soon as it and those before it are done."""
    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        first = sorted(releases, key=lambda r: scope_of(r) != "full")
        submitted = {r: pool.submit(run, r, scope_of(r)) for r in first}
        for release in releases:
            yield submitted[release].result()
