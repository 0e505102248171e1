"""The two fixes to vLLM itself that ship inside the package (``presize`` and ``kda``), and applying one.

Each is a unified diff against vLLM 0.33.0, applied without fuzz and without the ``patch`` program: every
hunk must match the installed files exactly ("fits"), or nothing is written.
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
    """The patch does not fit the installed vLLM (or no vLLM is installed): nothing was written."""


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


def _apply_hunks(lines: list[str], hunks: list[Hunk], reverse: bool) -> list[str] | None:
    """``lines`` with every hunk applied (or undone), each found exactly at or after its place; None when
    one is not found."""
    out: list[str] = []
    at = 0
    for hunk in hunks:
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        start = next(
            (i for i in range(at, len(lines) - len(old) + 1) if lines[i : i + len(old)] == old), None
        )
        if start is None:
            return None
        out += lines[at:start] + new
        at = start + len(old)
    return out + lines[at:]


def vllm_root() -> Path:
    """The folder that holds the installed ``vllm`` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("no vLLM is installed in this Python environment")
    return Path(next(iter(spec.submodule_search_locations))).parent


@dataclass
class Plan:
    """What applying (or reverting) would do to each file: ``applies``, ``already`` or ``does not fit``."""

    files: dict[Path, str]  # path -> state
    results: dict[Path, list[str]]  # path -> new lines, for the files that change

    @property
    def fits(self) -> bool:
        return all(state != "does not fit" for state in self.files.values())


def plan(name: str, root: Path | None = None, reverse: bool = False) -> Plan:
    """Read each file the patch changes under ``root`` (the installed vLLM's) and work out the result."""
    base = vllm_root() if root is None else root
    files: dict[Path, str] = {}
    results: dict[Path, list[str]] = {}
    for patch in parse(text(name)):
        path = base / patch.path
        try:
            source = path.read_text()
        except FileNotFoundError:
            raise PatchError(f"this vLLM has no {patch.path} ({releases_of(name)})") from None
        except OSError as exc:
            raise PatchError(f"cannot read {path}: {exc.strerror or exc}") from None
        lines = source.split("\n")
        done = _apply_hunks(lines, patch.hunks, reverse)
        if done is not None:
            files[path], results[path] = "applies", done
        elif _apply_hunks(lines, patch.hunks, not reverse) is not None:
            files[path] = "already"
        else:
            files[path] = "does not fit"
    return Plan(files, results)


def write(result: Plan) -> None:
    """Write the planned files (only when every file fits)."""
    if not result.fits:
        raise PatchError("the patch does not fit the installed vLLM; nothing was written")
    for path, lines in result.results.items():
        try:
            path.write_text("\n".join(lines))
        except OSError as exc:
            raise PatchError(f"cannot write {path}: {exc.strerror or exc}") from None
