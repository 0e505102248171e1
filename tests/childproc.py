"""Fresh Python children that run several independent checks each, for the tests that need a new process.

The children are real modules (``tests/children/``, run with ``python -m children.NAME``). Importing vLLM
costs a child 10-20 s of CPU, so a test file starts as few children as it can: one child program runs
every check that needs a fresh process of that kind, one after the other, and reports them all at once
as ``RESULT:<json>`` on stdout (``children/harness.py``). A check that raises is recorded with its
traceback and does not stop the checks after it; each test then asserts on its own check's result
(:meth:`Checks.value`).

The suite's addopts give each pytest-xdist worker whole test files (``--dist loadscope``); under a mode
that splits a file across workers (``--dist load``, ``worksteal``) :func:`once_per_run` has the workers
share one child's results instead of starting a second child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent

TAIL = 3000
SHUFFLE_SEED = "99" if os.environ.get("PYTHONHASHSEED") != "99" else "1"  # the start-ups child's, not ours


def clean_environment(extra: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment without the plugin's variables and ``VLLM_PLUGINS`` (and ``drop``)."""
    prefixes = ("STAGING_PLUGIN", "VLLM_PLUGINS", *drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    return env | dict(extra or {})


def _with_children(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``tests/`` first on PYTHONPATH, so that ``python -m children.NAME`` finds the package."""
    path = [str(TESTS), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return dict(env) | {"PYTHONPATH": os.pathsep.join(path)}


def start(program: str, env: Mapping[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    """Start ``python -m children.PROGRAM`` (it runs its checks and prints their ``RESULT:`` line)."""
    return subprocess.Popen(
        [sys.executable, "-m", f"children.{program}"],
        env=_with_children(env),
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


class Checks:
    """One child's reported checks."""

    def __init__(self, results: dict[str, dict[str, Any]], output: str) -> None:
        self.results = results
        self.output = output

    def to_json(self) -> dict[str, Any]:
        return {"results": self.results, "output": self.output[-TAIL:]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checks:
        return cls(data["results"], data["output"])

    def value(self, name: str) -> Any:
        """The check's return value; fails the calling test with the check's traceback if it raised."""
        assert name in self.results, f"check {name!r} did not run:\n{self.output[-TAIL:]}"
        result = self.results[name]
        assert result["error"] is None, f"check {name!r} raised:\n{result['error']}\n{result['log'][-TAIL:]}"
        return result["value"]

    def log(self, name: str) -> str:
        """What vLLM's log handlers printed during the check."""
        self.value(name)
        return str(self.results[name]["log"])


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> Checks:
    """Wait for the child; it must exit 0 and report (a check's failure is reported, not an exit)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"child timed out after {timeout} s:\n{stdout[-TAIL:]}\n{stderr[-TAIL:]}"
        ) from None
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, stdout[-TAIL:] + stderr[-TAIL:]
    return Checks(json.loads(lines[-1].removeprefix("RESULT:")), stdout + stderr)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` (JSON-able) once per test run, shared by every xdist worker through the run's
    temporary root (``tmp_path_factory``'s base folder's parent under xdist, else the base folder)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    directory = (
        base.parent / "shared-children" if os.environ.get("PYTEST_XDIST_WORKER") else base / "children"
    )
    directory.mkdir(parents=True, exist_ok=True)
    saved = directory / f"{name}.json"
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits for the first one's child
        if saved.exists():
            return json.loads(saved.read_text())
        value = compute()
        saved.write_text(json.dumps(value))
        return value


def run_checks(program: str, env: Mapping[str, str], timeout: float = 400) -> Checks:
    return finish(start(program, env), timeout)


class EarlyChildren:
    """Children started when the run starts (``conftest.py``), before the tests are collected, so that
    their import of vLLM runs on the second core beside the collection's; the test module's fixture then
    finishes its child, or starts it then if it was not started early."""

    def __init__(self) -> None:
        self.started: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, program: str, env: Mapping[str, str]) -> None:
        self.started[name] = start(program, env)

    def finish(self, name: str, program: str, env: Callable[[], Mapping[str, str]]) -> Checks:
        proc = self.started.pop(name, None)
        return finish(proc if proc is not None else start(program, env()))

    def stop(self) -> None:
        """Those no test asked for (deselected): ended with the run."""
        for proc in self.started.values():
            proc.kill()
            proc.communicate()
        self.started.clear()


def start_ups_environment(site: Path, seed: str) -> dict[str, str]:
    """The start-ups child's environment (``test_subprocess.py``), with a third-party policy package
    installed in ``site`` through entry points."""
    (site / "my_policies.py").write_text((TESTS / "children" / "third_party_policies.py").read_text())
    dist = site / "my_policies-1.0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm_staging_plugin.order_policies]\nbroken = no_such_policy_module\nmine = my_policies\n"
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return clean_environment({"PYTHONPATH": path, "RANK": "1", "PYTHONHASHSEED": seed})


EARLY = EarlyChildren()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fork_together(
    program: str, envs: Sequence[Mapping[str, str]], preload: Sequence[str], timeout: float = 400
) -> list[dict[str, Any]]:
    """One rank of ``children.PROGRAM`` per environment, all forked at once (as vLLM forks its workers;
    children/fork_driver.py) from one process that imported ``preload`` (vLLM's modules) once: the ranks'
    environments may differ, their hash seed may not. Each rank prints ``RESULT:<json>``; returns their
    results in the order of ``envs``."""
    envs = [_with_children(e) for e in envs]
    driver_env = envs[0] | {"OMP_NUM_THREADS": "1"}  # no thread pool to inherit across the fork
    proc = subprocess.run(
        [sys.executable, "-m", "children.fork_driver", program, json.dumps(envs), ",".join(preload)],
        env=driver_env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("FORKED:")]
    assert proc.returncode == 0 and lines, proc.stdout[-TAIL:] + proc.stderr[-TAIL:]
    results = []
    for rank in json.loads(lines[-1].removeprefix("FORKED:")):
        found = [x for x in rank["stdout"].splitlines() if x.startswith("RESULT:")]
        assert rank["status"] == 0 and found, rank["stdout"][-TAIL:] + proc.stderr[-TAIL:]
        results.append(json.loads(found[-1].removeprefix("RESULT:")))
    return results
