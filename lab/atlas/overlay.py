"""An older vLLM release's Python files overlaid on this environment, for the compat matrix's tests and the
atlas's worker processes: its wheel downloaded without dependencies and extracted without compiled files
or C++/CUDA sources (extensions need a GPU driver; nothing run here loads or builds them), only the pinned
packages it needs installed (lab/compat-packages.txt: exact versions and wheel hashes), and the plugin's
own structure check asked whether it would patch. A development tool: nothing in vLLM's processes
imports it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .releases import span

PROBE = "atlas.probe"  # run with python -m in the overlaid environment, lab/ last on its path
TOOLS = Path(__file__).resolve().parent.parent
NATIVE_SOURCES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".inl"}
MISSING = re.compile(r"No module named '([\w.]+)'|requires \"([\w.-]+)\" to be installed")
PIN = re.compile(
    r"(?P<releases>\S+)\s+(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)"
    r"\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})"
)


def overlay(version: str, cache: Path) -> tuple[Path, str]:
    """The release's Python files, extracted once under ``cache``; returns (folder, torch requirement).

    The wheel is downloaded to a temporary folder and dropped once read: kept, seven releases' wheels
    would take 2.3 GB of a CI machine's disk. Compiled files (extensions, the vllm-rs binary: ELF) and
    C++/CUDA sources stay in the wheel: nothing run here loads or builds them (0.32.0: 191 MB -> 58 MB).
    """
    target = cache / f"vllm-{version}"
    if not (target / "vllm").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as download:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                 "--only-binary=:all:", "--python-version", "3.11", "-d", download, f"vllm=={version}"],
                check=True, capture_output=True,
            )  # fmt: skip
            with zipfile.ZipFile(next(Path(download).glob(f"vllm-{version}-*.whl"))) as wheel:
                wheel.extractall(target, [n for n in wheel.namelist() if _readable(wheel, n)])
    metadata = next(target.glob("vllm-*.dist-info/METADATA")).read_text()
    torch = re.search(r"^Requires-Dist: (torch\s*[=<>!~][^;\n]*)", metadata, re.M)
    return target, torch.group(1).replace(" ", "") if torch else "?"


def _readable(wheel: zipfile.ZipFile, name: str) -> bool:
    """Whether the overlay keeps ``name``: anything but C++/CUDA sources and ELF files."""
    if name.endswith("/"):
        return True
    if Path(name).suffix in NATIVE_SOURCES:
        return False
    with wheel.open(name) as member:
        return member.read(4) != b"\x7fELF"


def pins(version: str, path: Path) -> list[str]:
    """The pinned packages of ``path`` (lab/compat-packages.txt) for ``version``, as hash-checked
    requirement lines."""
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


def install_pins(version: str, deps: Path, packages: Path) -> list[str]:
    """Install exactly the release's pins of ``packages`` into ``deps`` (no dependencies, hashes
    checked); return the installed distributions' names. A folder holding anything else is emptied first."""
    wanted = pins(version, packages)
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


def release_env(
    version: str, cache: Path, packages: Path, cwd: Path
) -> tuple[dict[str, str], dict[str, object], str]:
    """PYTHONPATH overlay environment for ``version``, the plugin's verdict on it, and its torch pin.

    Packages the release imports that 0.33.0's dependency set lacks come only from the pinned list
    ``packages``, installed without dependencies into a per-release folder under ``cache`` on the same
    path; a module still missing is named in the verdict ("error"), and nothing is installed for it.
    The verdict comes from a child process run in ``cwd`` (the repository, whose package it imports).
    """
    folder, torch = overlay(version, cache)
    deps = cache / f"deps-{version}"
    extras = install_pins(version, deps, packages)
    env = {"PYTHONPATH": f"{folder}:{deps}:{TOOLS}", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    probe = subprocess.run([sys.executable, "-m", PROBE], env=env, capture_output=True, text=True, cwd=cwd)
    line = next((x for x in probe.stdout.splitlines() if x.startswith("PROBE:")), None)
    result: dict[str, object] = (
        json.loads(line[6:]) if line else {"verdict": "error", "why": probe.stderr[-300:]}
    )
    missing = MISSING.search(str(result["why"])) if result["verdict"] == "error" else None
    if missing is not None:
        name = missing.group(1) or missing.group(2)
        listed = f"{packages.parent.name}/{packages.name}"
        result["why"] = f"missing module {name!r} (no package for it in {listed}): {result['why']}"
    result["extra_packages"] = extras
    return env, result, torch
