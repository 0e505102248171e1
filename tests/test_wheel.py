"""What a `pip install` user has: the wheel's contents, and its commands run from a clean virtual environment
with no checkout beside it. Every message and help text names only what the wheel holds (a command, a
variable), never a file of this repository; the fixes to vLLM ship inside it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from vllm_staging_plugin._offline import vllm_patches

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vllm_staging_plugin"
REPOSITORY_FILE = re.compile(r"\b(docs|lab|tests)/[\w./-]+|\b[\w-]+\.md\b")


def strings_outside_docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_message_of_the_package_names_a_file_of_this_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, value in strings_outside_docstrings(path)
        if (match := REPOSITORY_FILE.search(value))
    ]
    assert found == []
    assert REPOSITORY_FILE.search("see docs/stock-crashes.md") and REPOSITORY_FILE.search(
        "lab/upstream/x.patch"
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the sources (setuptools writes build/ beside what it builds)."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "LICENSE", "docs/package-description.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "-w", str(out), str(source)], check=True, capture_output=True)
    (built,) = out.glob("vllm_staging_plugin-*.whl")
    return built


def test_the_wheel_holds_the_package_and_its_patches_and_nothing_of_the_repository(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    folders = {name.rsplit("/", 1)[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert folders == {
        "vllm_staging_plugin",
        "vllm_staging_plugin/_engine",
        "vllm_staging_plugin/_offline",
        "vllm_staging_plugin/_offline/cpu_replay",
        "vllm_staging_plugin/_offline/preflight",
        "vllm_staging_plugin/_offline/seams",
        "vllm_staging_plugin/patches",
    }
    assert [n for n in names if not n.endswith(".py") and ".dist-info/" not in n] == [
        "vllm_staging_plugin/py.typed",
        "vllm_staging_plugin/patches/kda-spec-state-slots.patch",
        "vllm_staging_plugin/patches/presize-staging-buffers.patch",
    ]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "vllm_staging_plugin = vllm_staging_plugin:register"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )


CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import vllm_staging_plugin
    from vllm_staging_plugin._offline.cli import main
    out = {"file": vllm_staging_plugin.__file__, "runs": []}
    for argv in json.loads(sys.argv[1]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
        out["runs"].append([code, stdout.getvalue(), stderr.getvalue()])
    print(json.dumps(out))
    """
)


@pytest.mark.subprocess
@pytest.mark.extended  # a venv made and the wheel installed: about 2 s; .ci/package checks the wheel too
def test_from_a_clean_venv_the_commands_and_the_patches_work(wheel: Path, tmp_path: Path) -> None:
    """A venv with the wheel installed (vLLM, torch and pluggy seen from this environment's site-packages,
    as a deployment's are), run in an empty folder: help texts name no repository file, each patch
    prints and the printed kda diff applies to a vLLM tree with ``patch -p1``, and ``--version`` comes from
    the metadata."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own
    # a vLLM tree of the two files the patches change, found first on the path
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    real = vllm_patches.vllm_root()
    targets = [
        patch.path for name in vllm_patches.PATCHES for patch in vllm_patches.parse(vllm_patches.text(name))
    ]
    for target in targets:
        (fake / target).parent.mkdir(parents=True, exist_ok=True)
        (fake / target).write_bytes((real / target).read_bytes())
    work = tmp_path / "empty"
    work.mkdir()
    argvs = [
        ["--help"], ["check", "--help"], ["report", "--help"], ["patch", "--help"], ["patch", "presize"],
        ["patch", "kda"],
    ]  # fmt: skip
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(fake)}
    done = subprocess.run(
        [python, "-c", CHILD, json.dumps(argvs)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["file"] == f"{site}/vllm_staging_plugin/__init__.py"  # the wheel's copy, not the checkout
    helps, presize, kda_diff = result["runs"][:4], *result["runs"][4:]
    for code, text, _ in helps:
        assert code == 0 and REPOSITORY_FILE.search(text) is None, text
    assert "patch     print a fix to vLLM itself" in helps[0][1]
    assert presize == [0, vllm_patches.text("presize"), ""]  # the tree here hides vLLM: no replay, no note
    assert kda_diff == [0, vllm_patches.text("kda"), ""]
    kda = fake / "vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py"
    subprocess.run(
        ["patch", "-p1", "-s", "--fuzz=0", "-d", str(fake)], input=kda_diff[1], text=True, check=True
    )
    assert kda.read_bytes() != (real / kda.relative_to(fake)).read_bytes()  # the help's `patch -p1` line
    version = subprocess.run(
        [venv / "bin" / "vllm-staging-plugin", "--version"], cwd=work, env=env, capture_output=True, text=True
    )
    assert version.stdout.strip() == "0.1.0"


@pytest.mark.subprocess
@pytest.mark.extended  # a venv made and the wheel installed: about 3 s
def test_without_torch_or_vllm_every_command_answers(wheel: Path, tmp_path: Path) -> None:
    """The wheel in a venv holding only it and pluggy (what `pip install vllm-staging-plugin` gives: vLLM
    and torch are the operator's): help, version and report work; every command that needs vLLM says in
    one line what to install (exit 3), one JSON object with --json; a patch still prints."""
    import pluggy

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    shutil.copytree(Path(pluggy.__file__).parent, Path(site) / "pluggy")
    work = tmp_path / "empty"
    work.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}

    def run(*argv: str) -> tuple[int, str, str]:
        done = subprocess.run([venv / "bin" / "vllm-staging-plugin", *argv], cwd=work, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        return done.returncode, done.stdout, done.stderr

    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    code, out, err = run("--help")
    assert code == 0 and "commands:" in out and err == ""
    assert run("--version")[:2] == (0, "0.1.0\n")
    install = "vLLM and torch are not installed here: pip install vllm=="
    for argv in ([], ["check", "--order", "ascending"], ["check", "--", "./model"]):
        code, out, err = run(*argv)
        assert code == 3 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"vllm-staging-plugin check: cannot check on this machine: {install}0.34.0")
    code, out, err = run("check", "--json", "--", "./model")
    said = json.loads(out)
    assert code == said["exit_code"] == 3 and said["error"] == "cannot check on this machine" and err == ""
    assert said["message"].startswith(install)
    assert run("patch", "presize") == (0, vllm_patches.text("presize"), "")
    receipts = ROOT / "docs" / "data" / "h200-2026-11-29" / "receipts"
    golden = (ROOT / "tests" / "report-h200.golden").read_text().rstrip("\n")
    assert run("report", str(receipts))[:2] == (0, golden + "\n")
    assert run("report", str(tmp_path / "missing"))[0] == 2
