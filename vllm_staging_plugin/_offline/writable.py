"""Whether the engine could write receipts where ``STAGING_PLUGIN_RECEIPTS_DIR`` points, asked before any
boot relies on it. The engine creates the directory at the first capture and never lets a failed receipt
take the capture down, so a directory it cannot write only loses the receipts: the tools say so first."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def receipts_problem(directory: Path) -> str | None:
    """Why no receipt could be written under ``directory``, or None. It tries what the engine would do (a
    folder created where the path starts to be missing, a file written in the directory) and removes what
    it made: root passes ``os.access`` where the kernel still refuses (``/proc``)."""
    path = directory.expanduser()
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        if existing == path:
            fd, name = tempfile.mkstemp(prefix=".vllm-staging-plugin-probe-", dir=path)
            os.close(fd)
            os.unlink(name)
        else:
            shutil.rmtree(tempfile.mkdtemp(prefix=".vllm-staging-plugin-probe-", dir=existing))
    except OSError as exc:
        what = "write a file in" if existing == path else "create a folder in"
        return f"cannot {what} {existing} ({exc.strerror or exc})"
    return None


def receipts_warning(directory: Path | None) -> str | None:
    """The tools' one line about an unwritable receipts directory (None when there is none, or it is fine)."""
    problem = receipts_problem(directory) if directory is not None else None
    if problem is None:
        return None
    return (
        f"STAGING_PLUGIN_RECEIPTS_DIR={directory}: {problem}; vLLM boots and serves, but no receipt is "
        "written there"
    )
