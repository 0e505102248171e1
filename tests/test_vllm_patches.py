"""The bundled vLLM patches: the command's diff applies with ``patch -p1 --fuzz=0`` on every release it is
for and on no other but those pinned in ``MATCHES_UNNEEDED`` (this file runs on every supported release the
compat matrix covers); the fit check agrees with the patch program; the command's answers for each case."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from atlas.releases import span
from release import SIZES_STAGING

from vllm_staging_plugin._engine import compat
from vllm_staging_plugin._offline import cli, cpu_replay, vllm_patches
from vllm_staging_plugin._offline.vllm_patches import PATCHES, PatchError

INSTALLED = compat.installed_versions()["vllm"]
FITS = {name: INSTALLED in span(patch.releases) for name, patch in PATCHES.items()}
# Releases outside a patch's span that its hunks still match, and why the patch is not for them.
MATCHES_UNNEEDED = {("kda", "0.28.0"): "it refuses --use-replayssm for Kimi-Linear (Nemotron-H only)"}


def vllm_tree(root: Path, name: str) -> Path:
    """A folder holding copies of the installed vLLM's files that ``name`` changes; the first one."""
    real = vllm_patches.vllm_root()
    paths = [patch.path for patch in vllm_patches.parse(vllm_patches.text(name))]
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real / path, root / path)
    return root / paths[0]


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_each_patch_fits_the_installed_vllm_exactly_when_it_names_its_release(name: str) -> None:
    """Inside its span every file applies; outside, the plan says it does not fit or the file is missing
    (or, on a release of ``MATCHES_UNNEEDED``, it applies where nothing needs it)."""
    if FITS[name] or (name, INSTALLED) in MATCHES_UNNEEDED:
        files = vllm_patches.plan(name)
        assert set(files.values()) == {"applies"}, (INSTALLED, files)
        return
    try:
        files = vllm_patches.plan(name)
    except PatchError as exc:
        assert str(exc).startswith("this vLLM has no ") and PATCHES[name].releases in str(exc)
    else:
        assert not vllm_patches.fits(files), (INSTALLED, files)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.skipif(not FITS[n], reason=f"vLLM {INSTALLED} is outside its span"))
     for n in sorted(PATCHES)],
)  # fmt: skip
def test_the_printed_diff_applies_with_the_patch_program_as_the_fit_check_says(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' line: the command's stdout into ``patch -p1`` in the folder holding vllm/."""
    target = vllm_tree(tmp_path, name)
    stock = target.read_bytes()
    assert vllm_patches.plan(name, tmp_path) == {target: "applies"}
    assert cli.main(["patch", name]) == 0
    printed = capsys.readouterr().out
    subprocess.run(["patch", "-p1", "-s", "--fuzz=0"], input=printed, text=True, cwd=tmp_path, check=True)
    assert target.read_bytes() != stock
    assert vllm_patches.plan(name, tmp_path) == {target: "already"}


def test_a_file_that_does_not_match_does_not_fit(tmp_path: Path) -> None:
    target = vllm_tree(tmp_path, "presize")
    target.write_text(target.read_text().replace("def store_capture_output(", "def store_output(", 1))
    files = vllm_patches.plan("presize", tmp_path)
    assert files == {target: "does not fit"} and not vllm_patches.fits(files)
    done = subprocess.run(
        ["patch", "-p1", "--dry-run", "--fuzz=0"], input=vllm_patches.text("presize"), text=True,
        cwd=tmp_path, capture_output=True,
    )  # fmt: skip
    assert done.returncode != 0  # the patch program agrees


def test_a_missing_file_an_unreadable_one_and_a_bad_diff_are_patch_errors(tmp_path: Path) -> None:
    with pytest.raises(PatchError) as missing:
        vllm_patches.plan("presize", tmp_path)
    assert str(missing.value) == (
        "this vLLM has no vllm/v1/worker/gpu/cudagraph_utils.py (the presize patch is for vLLM 0.30.0-0.33.0)"
    )
    (tmp_path / "vllm/v1/worker/gpu/cudagraph_utils.py").mkdir(parents=True)
    with pytest.raises(PatchError, match=r"^cannot read .*cudagraph_utils.py: Is a directory$"):
        vllm_patches.plan("presize", tmp_path)
    with pytest.raises(PatchError, match="not a unified diff"):
        vllm_patches.parse("just text\n")


@pytest.mark.parametrize("sizes_itself", [True, False])
def test_presize_on_a_vllm_that_sizes_itself_is_not_needed_by_behaviour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sizes_itself: bool
) -> None:
    """Where the presize patch does not fit, the installed vLLM's own staging is replayed: if it holds the
    largest descriptor, a note on stderr says the patch is not needed; the diff prints either way."""
    target = vllm_tree(tmp_path, "presize")
    target.write_text("# another vLLM\n")
    monkeypatch.setattr(vllm_patches, "vllm_root", lambda: tmp_path)
    monkeypatch.setattr(cpu_replay, "vllm_sizes_staging", lambda: sizes_itself)
    assert cli.main(["patch", "presize"]) == 0
    out, err = capsys.readouterr()
    assert out == vllm_patches.text("presize")
    if sizes_itself:
        assert err.startswith("# vllm-staging-plugin patch: not needed: this vLLM sizes its staging buffers")
    else:
        assert err == ""
    assert target.read_text() == "# another vLLM\n"


@pytest.mark.skipif(not SIZES_STAGING, reason="this vLLM does not size its staging buffers itself")
def test_presize_on_the_installed_vllm_that_sizes_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.34.0, for real: the patch does not fit, the replay says why it need not."""
    assert not vllm_patches.fits(vllm_patches.plan("presize"))
    assert cli.main(["patch", "presize"]) == 0  # the diff still prints, with the note beside it
    printed = capsys.readouterr()
    assert printed.out == vllm_patches.text("presize") and "not needed" in printed.err


def test_the_command_without_vllm_prints_the_diff(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vllm_patches.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["patch", "presize"]) == 0
    assert capsys.readouterr() == (vllm_patches.text("presize"), "")
    with pytest.raises(vllm_patches.PatchError, match="no vLLM is installed in this Python environment"):
        vllm_patches.plan("presize")  # the library's own answer, for a caller other than the command


@pytest.mark.parametrize(
    "words", [["patch", "presize", "extra"], ["patch", "kda", "--bogus"], ["patch", "kda", "--apply"]]
)  # the command prints; it edits no file
def test_a_stray_word_is_one_line_and_exit_2(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(words) == 2
    text = capsys.readouterr()
    assert text.out == "" and text.err == (
        f"vllm-staging-plugin patch: unrecognized arguments: {words[-1]} "
        "(`vllm-staging-plugin patch --help` explains the options)\n"
    )
