"""The bundled vLLM patches applied without fuzz: the same result as ``patch -p1 --fuzz=0``, undone
exactly, refused whole when one hunk does not match, fitting every release it is for and no other but those
pinned in ``MATCHES_UNNEEDED`` (this file runs on every supported release the compat matrix covers), and
the command's answers for each case."""

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
        result = vllm_patches.plan(name)
        assert result.fits and set(result.files.values()) == {"applies"}, (INSTALLED, result.files)
        return
    try:
        result = vllm_patches.plan(name)
    except PatchError as exc:
        assert str(exc).startswith("this vLLM has no ") and PATCHES[name].releases in str(exc)
    else:
        assert not result.fits, (INSTALLED, result.files)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.skipif(not FITS[n], reason=f"vLLM {INSTALLED} is outside its span"))
     for n in sorted(PATCHES)],
)  # fmt: skip
def test_applying_matches_the_patch_program_and_reverting_restores_every_byte(
    name: str, tmp_path: Path
) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    target, other = vllm_tree(ours, name), vllm_tree(theirs, name)
    stock = target.read_bytes()
    subprocess.run(
        ["patch", "-p1", "-s", "--fuzz=0"], input=vllm_patches.text(name), text=True, cwd=theirs, check=True
    )
    applied = vllm_patches.plan(name, ours)
    assert applied.files == {target: "applies"} and applied.fits
    vllm_patches.write(applied)
    assert target.read_bytes() == other.read_bytes() != stock
    assert vllm_patches.plan(name, ours).files == {target: "already"}
    vllm_patches.write(vllm_patches.plan(name, ours, reverse=True))
    assert target.read_bytes() == stock


def test_a_file_that_does_not_match_is_left_untouched(tmp_path: Path) -> None:
    target = vllm_tree(tmp_path, "presize")
    changed = target.read_text().replace("def store_capture_output(", "def store_output(", 1)
    target.write_text(changed)
    result = vllm_patches.plan("presize", tmp_path)
    assert result.files == {target: "does not fit"} and not result.fits
    with pytest.raises(PatchError, match="nothing was written"):
        vllm_patches.write(result)
    assert target.read_text() == changed


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


def test_the_command_says_it_does_not_fit_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / vllm_patches.parse(vllm_patches.text("kda"))[0].path
    target.parent.mkdir(parents=True)
    target.write_text("# another vLLM\n")
    monkeypatch.setattr(vllm_patches, "vllm_root", lambda: tmp_path)
    assert cli.main(["patch", "kda", "--apply"]) == 1
    out, err = capsys.readouterr()
    assert out == f"does not fit: {target}\n"
    assert err == (
        "vllm-staging-plugin patch: it does not fit this vLLM (the kda patch is for vLLM 0.29.0-0.34.0); "
        "nothing was written\n"
    )
    assert target.read_text() == "# another vLLM\n"


@pytest.mark.parametrize("sizes_itself", [True, False])
def test_presize_on_a_vllm_that_sizes_itself_is_not_needed_by_behaviour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sizes_itself: bool
) -> None:
    """Where the presize patch does not fit, the installed vLLM's own staging is replayed: if it holds the
    largest descriptor, nothing is needed (exit 0); otherwise the patch's own answer stands (exit 1)."""
    target = vllm_tree(tmp_path, "presize")
    target.write_text("# another vLLM\n")
    monkeypatch.setattr(vllm_patches, "vllm_root", lambda: tmp_path)
    monkeypatch.setattr(cpu_replay, "vllm_sizes_staging", lambda: sizes_itself)
    assert cli.main(["patch", "presize", "--apply"]) == (0 if sizes_itself else 1)
    out, err = capsys.readouterr()
    if sizes_itself:
        assert out.startswith("vllm-staging-plugin patch: not needed: this vLLM sizes its staging buffers")
        assert out.endswith("nothing was written\n") and not err
    else:
        assert out == f"does not fit: {target}\n" and "does not fit this vLLM" in err
    assert target.read_text() == "# another vLLM\n"


@pytest.mark.skipif(not SIZES_STAGING, reason="this vLLM does not size its staging buffers itself")
def test_presize_on_the_installed_vllm_that_sizes_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.34.0, for real: the patch does not fit, the replay says why it need not."""
    assert not vllm_patches.plan("presize").fits
    for action in (["--dry-run"], ["--revert"], ["--revert", "--dry-run"]):  # every action says so, exit 0
        assert cli.main(["patch", "presize", *action]) == 0
        assert "not needed: this vLLM sizes its staging buffers" in capsys.readouterr().out
    assert cli.main(["patch", "presize"]) == 0  # the diff still prints, with the note beside it
    printed = capsys.readouterr()
    assert printed.out == vllm_patches.text("presize") and "not needed" in printed.err


def test_the_command_without_vllm_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vllm_patches.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["patch", "presize", "--dry-run"]) == 3  # what to install: the patch's newest release
    assert capsys.readouterr().err == (
        "vllm-staging-plugin patch: vLLM and torch are not installed here: pip install vllm==0.33.0 "
        "(it brings torch)\n"
    )
    with pytest.raises(vllm_patches.PatchError, match="no vLLM is installed in this Python environment"):
        vllm_patches.plan("presize")  # the library's own answer, for a caller other than the command


def test_apply_and_revert_together_are_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["patch", "kda", "--apply", "--revert"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["patch", "presize", "extra"], ["patch", "kda", "--bogus"]])
def test_a_stray_word_is_one_line_and_exit_2(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(words) == 2
    text = capsys.readouterr()
    assert text.out == "" and text.err == (
        f"vllm-staging-plugin patch: unrecognized arguments: {words[-1]} "
        "(`vllm-staging-plugin patch --help` explains the options)\n"
    )
