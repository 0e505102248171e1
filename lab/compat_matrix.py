"""Run the contract tests against any list of vLLM releases on a machine without a GPU.

For each release: build its overlay (lab/atlas/overlay.py: its Python files,
without the compiled extensions, over the environment of .ci/setup, vLLM 0.33.0's dependency set with
torch 2.13.0+cpu, plus its pinned packages), ask the plugin's own structure check whether it would
patch, then run the release tests with that overlay first on PYTHONPATH:

  supported -> tests/test_contract_vllm.py, tests/test_contract_guarantees.py, tests/test_properties.py,
               tests/test_contract_replay_loop.py, tests/test_cli.py, tests/test_release_support.py,
               tests/test_seams.py, tests/test_contract_kda_fix.py, tests/test_vllm_patches.py
  refused   -> tests/test_release_support.py (the plugin leaves vLLM untouched, one warning)

then, for each bundled vLLM patch whose span names the release (vllm_patches.PATCHES), its two upstream
arms with the same overlay: lab/upstream/run-patched.sh (the regression test passes patched) and
lab/upstream/run-stock.sh (it fails on the stock release the way the patch fixes).

  .venv/bin/python lab/compat_matrix.py 0.18.0 0.24.0 [--json rows.json]   # prints a markdown table
  .venv/bin/python lab/compat_matrix.py --all   # 0.14.0 ... 0.34.0

A release answered otherwise than expected (supported from 0.18.0 on, refused before) fails with its
tests not run; a release lab/atlas/releases.py does not list is refused with one line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from atlas import overlay
from atlas.releases import RELEASES, SUPPORTED, span

from vllm_staging_plugin._offline.vllm_patches import PATCHES

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "compat"
ALL = list(RELEASES)
PACKAGES = ROOT / "lab" / "compat-packages.txt"
SUPPORTED_TESTS = [
    "tests/test_contract_vllm.py",
    "tests/test_contract_guarantees.py",
    "tests/test_properties.py",
    "tests/test_contract_replay_loop.py",
    "tests/test_cli.py",
    "tests/test_release_support.py",
    "tests/test_seams.py",
    "tests/test_contract_kda_fix.py",
    "tests/test_vllm_patches.py",
]
REFUSED_TESTS = ["tests/test_release_support.py"]
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors)")


def release_env(version: str) -> tuple[dict[str, str], dict[str, object], str]:
    """:func:`overlay.release_env` with this repository's cache and pinned list (lab/stock_atlas.py too)."""
    return overlay.release_env(version, CACHE, PACKAGES, ROOT)


def expected_verdict(version: str) -> str:
    """What the plugin must answer on a release this repository knows (lab/atlas/releases.py)."""
    return "supported" if version in SUPPORTED else "refused"


def run_release(version: str) -> dict[str, object]:
    started = time.monotonic()
    if version not in ALL:
        raise SystemExit(
            f"unknown vLLM release {version!r}; known: {ALL[0]}-{ALL[-1]} (lab/atlas/releases.py)"
        )
    env, result, torch = release_env(version)
    expected = expected_verdict(version)
    if result["verdict"] not in ("error", expected):  # neither what it supports nor what it refuses: loud
        result.update(release=version, torch=torch, rc=1, passed=0, failed=0, skipped=0,
                      tests=f"not run: the plugin answered {result['verdict']!r}, expected {expected!r}",
                      seconds=round(time.monotonic() - started, 1))  # fmt: skip
        return result
    if result["verdict"] == "error":  # the release does not import here: no tests to run, and a failure
        result.update(release=version, torch=torch, tests="not run: the probe failed", rc=1, passed=0,
                      failed=0, skipped=0, seconds=round(time.monotonic() - started, 1))  # fmt: skip
        return result
    tests = SUPPORTED_TESTS if result["verdict"] == "supported" else REFUSED_TESTS
    pytest = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    tail = pytest.stdout.strip().splitlines()[-1] if pytest.stdout.strip() else pytest.stderr[-200:]
    counts = {kind: int(n) for n, kind in SUMMARY.findall(tail)}
    result.update(
        release=version, torch=torch, tests=tail, rc=pytest.returncode,
        passed=counts.get("passed", 0), failed=counts.get("failed", 0) + counts.get("error", 0)
        + counts.get("errors", 0), skipped=counts.get("skipped", 0),
    )  # fmt: skip
    failures = [x for x in pytest.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))][:10]
    arms = [name for name, patch in PATCHES.items() if version in span(patch.releases)]
    for name in arms:
        for arm in ("run-patched.sh", "run-stock.sh"):
            run = subprocess.run(
                ["bash", f"lab/upstream/{arm}", name], env={**env, "PYTHON": sys.executable},
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            if run.returncode:
                result["rc"] = run.returncode
                lines = (run.stdout + run.stderr).strip().splitlines()
                failures.append(f"lab/upstream/{arm} {name}: {lines[-1] if lines else 'no output'}")
    result["arms"] = ", ".join(arms) or "none"
    result["seconds"] = round(time.monotonic() - started, 1)
    if failures:
        result["failures"] = failures
    return result


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| release | torch pin | plugin | why | tests (this release's overlay) | patch arms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        why = str(r["why"]).replace("|", "\\|")
        if r.get("extra_packages"):
            why += f" (test env + {', '.join(r['extra_packages'])})"  # type: ignore[arg-type]
        arms = r.get("arms", "none")
        lines.append(f"| {r['release']} | {r['torch']} | {r['verdict']} | {why} | {r['tests']} | {arms} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("releases", nargs="*")
    parser.add_argument("--all", action="store_true", help=f"every release {ALL[0]}-{ALL[-1]}")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args()
    releases = ALL if args.all else args.releases
    rows = []
    for version in releases:
        row = run_release(version)
        rows.append(row)
        print(
            f"{version:<8} {row['verdict']:<9} rc={row['rc']} {row['tests']}; patch arms: "
            f"{row.get('arms', 'none')} ({row['seconds']}s) {row['why']}"
        )
        for failure in row.get("failures", []):  # type: ignore[attr-defined]
            print(f"    {failure}")
    print()
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    # A supported release must pass all its tests; a refused one must pass the refusal test.
    return 1 if any(r["rc"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
