"""Run the contract tests against any list of vLLM releases on a machine without a GPU.

For each release: download its wheel (no dependencies), overlay its Python files (compiled extensions do
not load without a GPU driver and the tests do not need them) on the environment of .ci/setup (vLLM
0.33.0's dependency set with torch 2.13.0+cpu), ask the plugin's own structure checks whether it would
patch, then run the release tests with that overlay first on PYTHONPATH:

  supported -> tests/test_contract_vllm.py, tests/test_contract_guarantees.py, tests/test_properties.py,
               tests/test_contract_replay_loop.py, tests/test_cli.py, tests/test_release_support.py
  refused   -> tests/test_release_support.py (the plugin leaves vLLM untouched, one warning)

  .venv/bin/python tools/compat_matrix.py 0.18.0 0.24.0 [--json rows.json]   # prints a markdown table
  .venv/bin/python tools/compat_matrix.py --all   # 0.14.0 ... 0.33.0
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "compat"
ALL = [
    "0.14.0",
    "0.14.1",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
]
SUPPORTED_TESTS = [
    "tests/test_contract_vllm.py",
    "tests/test_contract_guarantees.py",
    "tests/test_properties.py",
    "tests/test_contract_replay_loop.py",
    "tests/test_cli.py",
    "tests/test_release_support.py",
]
REFUSED_TESTS = ["tests/test_release_support.py"]
PROBE = """
import json
from vllm_staging_plugin._engine import compat
out = {"version": compat.installed_versions()["vllm"]}
try:
    import importlib
    module = importlib.import_module(compat.CUDAGRAPH_MODULE)
    compat.manager_class(module)
    out["verdict"], out["why"] = "supported", "structure present"
except compat.IncompatibleVllm as exc:
    out["verdict"], out["why"] = "refused", str(exc)
except Exception as exc:
    out["verdict"], out["why"] = "error", f"{type(exc).__name__}: {exc}"
print("PROBE:" + json.dumps(out))
"""
MISSING = re.compile(r"No module named '([\w]+)|requires \"([\w-]+)\" to be installed")
PACKAGE_OF = {
    "rpds": "rpds-py",
    "yaml": "pyyaml",
    "google": "protobuf",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
}
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors)")


def overlay(version: str) -> tuple[Path, str]:
    """The release's Python files, extracted once; returns (folder, torch requirement)."""
    target = CACHE / f"vllm-{version}"
    wheels = CACHE / "wheels"
    if not (target / "vllm").is_dir():
        wheels.mkdir(parents=True, exist_ok=True)
        found = list(wheels.glob(f"vllm-{version}-*.whl"))
        if not found:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.11", "-d", str(wheels), f"vllm=={version}"],
                check=True, capture_output=True,
            )  # fmt: skip
            found = list(wheels.glob(f"vllm-{version}-*.whl"))
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(target, [n for n in wheel.namelist() if not n.endswith(".so")])
    metadata = next(target.glob("vllm-*.dist-info/METADATA")).read_text()
    torch = re.search(r"^Requires-Dist: (torch\s*[=<>!~][^;\n]*)", metadata, re.M)
    return target, torch.group(1).replace(" ", "") if torch else "?"


def release_env(version: str) -> tuple[dict[str, str], dict[str, object], str]:
    """PYTHONPATH overlay environment for ``version``, the plugin's verdict on it, and its torch pin.

    Packages the release imports that 0.33.0's dependency set lacks are installed (no deps) into a
    per-release folder on the same path. Also used by tools/stock_atlas.py.
    """
    folder, torch = overlay(version)
    deps = CACHE / f"deps-{version}"
    env = {"PYTHONPATH": f"{folder}:{deps}", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    extras: list[str] = []
    for _ in range(8):  # older releases import packages 0.33.0's dependency set lacks: add them, no deps
        probe = subprocess.run(
            [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd=ROOT
        )
        line = next((x for x in probe.stdout.splitlines() if x.startswith("PROBE:")), None)
        result: dict[str, object] = (
            json.loads(line[6:]) if line else {"verdict": "error", "why": probe.stderr[-300:]}
        )
        missing = MISSING.search(str(result["why"])) if result["verdict"] == "error" else None
        if missing is None:
            break
        name = missing.group(1) or missing.group(2)
        package = PACKAGE_OF.get(name, name)
        extras.append(package)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps), package],
            check=True,
            capture_output=True,
        )
    result["extra_packages"] = (
        sorted(p.name.split("-")[0] for p in deps.glob("*.dist-info")) if deps.is_dir() else extras
    )
    return env, result, torch


def run_release(version: str) -> dict[str, object]:
    started = time.monotonic()
    env, result, torch = release_env(version)
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
        seconds=round(time.monotonic() - started, 1),
    )  # fmt: skip
    if pytest.returncode:
        result["failures"] = [x for x in pytest.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))][:10]
    return result


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| release | torch pin | plugin | why | tests (this release's overlay) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        why = str(r["why"]).replace("|", "\\|")
        if r.get("extra_packages"):
            why += f" (test env + {', '.join(r['extra_packages'])})"  # type: ignore[arg-type]
        lines.append(f"| {r['release']} | {r['torch']} | {r['verdict']} | {why} | {r['tests']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("releases", nargs="*")
    parser.add_argument("--all", action="store_true", help="every release 0.14.0-0.33.0")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args()
    releases = ALL if args.all else args.releases
    rows = []
    for version in releases:
        row = run_release(version)
        rows.append(row)
        print(
            f"{version:<8} {row['verdict']:<9} rc={row['rc']} {row['tests']} ({row['seconds']}s) {row['why']}"
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
