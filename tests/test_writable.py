"""Whether receipts could be written: tried as the engine would, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_staging_plugin._offline.writable import receipts_problem, receipts_warning


def test_a_writable_directory_and_a_creatable_one_pass_and_nothing_is_left(tmp_path: Path) -> None:
    assert receipts_problem(tmp_path) is None and list(tmp_path.iterdir()) == []
    assert receipts_problem(tmp_path / "new" / "deeper") is None and list(tmp_path.iterdir()) == []
    assert receipts_warning(None) is None and receipts_warning(tmp_path) is None


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert receipts_problem(tmp_path / "file" / "receipts") == f"{tmp_path / 'file'} is not a directory"


def test_a_folder_the_kernel_refuses_is_named_even_for_root() -> None:
    """``os.access`` answers yes to root; creating the folder is what the engine would do."""
    problem = receipts_problem(Path("/proc/nonexistent/x"))
    assert problem is not None and problem.startswith("cannot create a folder in /proc (")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder")
def test_a_read_only_directory_is_named(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        assert receipts_problem(tmp_path) == f"cannot write a file in {tmp_path} (Permission denied)"
    finally:
        tmp_path.chmod(0o700)
