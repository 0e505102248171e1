"""Run the contract tests against any list of vLLM releases on a machine without a GPU.

For each release: download its wheel (no dependencies), overlay its Python files (compiled extensions do
not load without a GPU driver and the tests do not need them) on the environment of .ci/setup (vLLM
0.33.0's dependency set with torch 2.13.0+cpu), ask the plugin's own structure checks whether it would
patch, then run the release tests with that overlay first on PYTHONPATH:

  supported -> tests/test_contract_vllm.py, tests/test_contract_guarantees.py, tests/test_properties.py,
               tests/test_contract_replay_loop.py, tests/test_cli.py, tests/test_release_support.py,
               tests/test_seams.py
  refused   -> tests/test_release_support.py (the plugin leaves vLLM untouched, one warning)

  .venv/bin/python tools/compat_matrix.py 0.18.0 0.24.0 [--json rows.json]   # prints a markdown table
  .venv/bin/python tools/compat_matrix.py --all   # 0.14.0 ... 0.33.0
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from vllm_staging_plugin._offline.atlas.releases import RELEASES, span

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "compat"
ALL = list(RELEASES)
PACKAGES = ROOT / "tools" / "compat-packages.txt"
SUPPORTED_TESTS = [
    "tests/test_contract_vllm.py",
    "tests/test_contract_guarantees.py",
    "tests/test_properties.py",
    "tests/test_contract_replay_loop.py",
    "tests/test_cli.py",
    "tests/test_release_support.py",
    "tests/test_seams.py",
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
MISSING = re.compile(r"No module named '([\w.]+)'|requires \"([\w.-]+)\" to be installed")
PIN = re.compile(
    r"(?P<releases>\S+)\s+(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)"
    r"\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})"
)
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


def pins(version: str, path: Path | None = None) -> list[str]:
    """The pinned packages of tools/compat-packages.txt for ``version``, as hash-checked requirement lines."""
    path = path or PACKAGES
    out = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pin = PIN.fullmatch(line)
        if pin is None:
            raise ValueError(f"{path}:{number}: not 'RELEASES name==version --hash=sha256:HEX': {raw!r}")
        if version in span(pin["releases"]):
            out.append(f"{pin['name']}=={pin['version']} --hash=sha256:{pin['sha256']}")
    return out


def install_pins(version: str, deps: Path) -> list[str]:
    """Install exactly the release's pins into ``deps`` (no dependencies, hashes checked); return the
    installed distributions' names. A folder holding anything else is emptied first."""
    wanted = pins(version)
    record = deps / "pins.txt"
    if wanted and not (record.is_file() and record.read_text().splitlines() == wanted):
        if deps.is_dir():
            shutil.rmtree(deps)
        deps.mkdir(parents=True)
        requirements = deps.parent / f"pins-{version}.txt"
        requirements.write_text("\n".join(wanted) + "\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "--only-binary=:all:", "--target", str(deps), "-r", str(requirements)],
            check=True, capture_output=True,
        )  # fmt: skip
        record.write_text("\n".join(wanted) + "\n")
    elif not wanted and deps.is_dir():
        shutil.rmtree(deps)
    return sorted(p.name.split("-")[0] for p in deps.glob("*.dist-info")) if wanted else []


def release_env(version: str) -> tuple[dict[str, str], dict[str, object], str]:
    """PYTHONPATH overlay environment for ``version``, the plugin's verdict on it, and its torch pin.

    Packages the release imports that 0.33.0's dependency set lacks come only from the pinned list
    (tools/compat-packages.txt), installed without dependencies into a per-release folder on the same
    path; a module still missing is named in the verdict ("error"), and nothing is installed for it.
    Also used by tools/stock_atlas.py.
    """
    folder, torch = overlay(version)
    deps = CACHE / f"deps-{version}"
    extras = install_pins(version, deps)
    env = {"PYTHONPATH": f"{folder}:{deps}", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd=ROOT)
    line = next((x for x in probe.stdout.splitlines() if x.startswith("PROBE:")), None)
    result: dict[str, object] = (
        json.loads(line[6:]) if line else {"verdict": "error", "why": probe.stderr[-300:]}
    )
    missing = MISSING.search(str(result["why"])) if result["verdict"] == "error" else None
    if missing is not None:
        name = missing.group(1) or missing.group(2)
        listed = f"{PACKAGES.parent.name}/{PACKAGES.name}"
        result["why"] = f"missing module {name!r} (no package for it in {listed}): {result['why']}"
    result["extra_packages"] = extras
    return env, result, torch


def run_release(version: str) -> dict[str, object]:
    started = time.monotonic()
    env, result, torch = release_env(version)
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
