"""The two fixes to vLLM itself that ship inside the package (``presize`` and ``kda``), as text.

Each is a unified diff against vLLM 0.33.0, for ``patch -p1`` in the folder holding ``vllm/`` (the plugin
never edits another package's files). :func:`plan` reads the installed files to say whether it fits.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class BundledPatch:
    """One shipped patch: its file under ``patches/``, what it does, and the vLLM releases it is for (a
    span of consecutive releases, first-last)."""

    file: str
    summary: str
    releases: str


PATCHES = {
    "presize": BundledPatch(
        "presize-staging-buffers.patch",
        "size vLLM's CUDA-graph staging buffers by the largest capture descriptor, as the plugin does "
        "from outside",
        "0.30.0-0.33.0",  # why these spans: docs/compatibility.md
    ),
    "kda": BundledPatch(
        "kda-spec-state-slots.patch",
        "keep a state slot per speculative token in Kimi-Linear's shared KDA layer under --use-replayssm, "
        "as the plugin does from outside",
        "0.29.0-0.34.0",
    ),
}
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


class PatchError(Exception):
    """The installed vLLM's files cannot be read (or no vLLM is installed)."""


@dataclass
class Hunk:
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    path: str  # relative to the folder holding vllm/, e.g. vllm/v1/worker/gpu/cudagraph_utils.py
    hunks: list[Hunk] = field(default_factory=list)


def releases_of(name: str) -> str:
    """The clause every refusal of the patch ends with: which releases it is for."""
    return f"the {name} patch is for vLLM {PATCHES[name].releases}"


def text(name: str) -> str:
    """The patch's text as shipped."""
    return (resources.files("vllm_staging_plugin") / "patches" / PATCHES[name].file).read_text()


def parse(diff: str) -> list[FilePatch]:
    """A unified diff's files and hunks (``a/`` and ``b/`` prefixes dropped)."""
    files: list[FilePatch] = []
    hunk: Hunk | None = None
    for line in diff.splitlines():
        if line.startswith("--- "):
            hunk = None
        elif line.startswith("+++ "):
            files.append(FilePatch(line[4:].split("\t")[0].removeprefix("b/")))
        elif HUNK.match(line):
            hunk = Hunk()
            files[-1].hunks.append(hunk)
        elif hunk is not None and line[:1] in (" ", "-", "+", ""):  # "" : an empty context line
            body = line[1:]
            if line[:1] != "+":
                hunk.old.append(body)
            if line[:1] != "-":
                hunk.new.append(body)
    if not files or not all(f.hunks for f in files):
        raise PatchError("not a unified diff with hunks")
    return files


def _matches(lines: list[str], hunks: list[Hunk], reverse: bool) -> bool:
    """Whether every hunk (or its undoing) is found exactly, in order, in ``lines``."""
    at = 0
    for hunk in hunks:
        old = hunk.new if reverse else hunk.old
        start = next(
            (i for i in range(at, len(lines) - len(old) + 1) if lines[i : i + len(old)] == old), None
        )
        if start is None:
            return False
        at = start + len(old)
    return True


def vllm_root() -> Path:
    """The folder that holds the installed ``vllm`` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("no vLLM is installed in this Python environment")
    return Path(next(iter(spec.submodule_search_locations))).parent


def plan(name: str, root: Path | None = None) -> dict[Path, str]:
    """Each file the patch changes under ``root`` (the installed vLLM's), and whether the patch
    ``applies`` there, is ``already`` applied, or ``does not fit``."""
    base = vllm_root() if root is None else root
    files: dict[Path, str] = {}
    for patch in parse(text(name)):
        path = base / patch.path
        try:
            lines = path.read_text().split("\n")
        except FileNotFoundError:
            raise PatchError(f"this vLLM has no {patch.path} ({releases_of(name)})") from None
        except OSError as exc:
            raise PatchError(f"cannot read {path}: {exc.strerror or exc}") from None
        if _matches(lines, patch.hunks, reverse=False):
            files[path] = "applies"
        elif _matches(lines, patch.hunks, reverse=True):
            files[path] = "already"
        else:
            files[path] = "does not fit"
    return files


def fits(files: dict[Path, str]) -> bool:
    return all(state != "does not fit" for state in files.values())
