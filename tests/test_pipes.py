"""Every command that prints stops quietly when its reader goes away, as ``git log | head`` does: no
message, exit 141 (what a shell reports for a process that SIGPIPE ended), and no file half-written.

The console script runs in a fresh process for each call. A reader that closes before the command prints
meets the closed pipe every time; one that reads a line and closes meets it only when the command is still
printing, so the fast commands run that way many times, under the ``extended`` marker, as do the main job
and a pre-flight, which import vLLM (about 10 s each).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from childproc import clean_environment
from configs import KIMI_CRASH, KIMI_LINEAR_4_LAYERS, NO_WEIGHTS, model_folder
from release import SIZES_STAGING

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("vllm-staging-plugin")
RECEIPTS = ROOT / "docs" / "data" / "h200-2026-11-29" / "receipts"
FAST = [["--help"], ["check", "--help"], ["report", str(RECEIPTS)], ["patch", "kda"], ["patch", "presize"]]
READER_GONE = 141


def quiet(words: list[str], err: str) -> bool:
    """Nothing on stderr but, from ``patch presize`` on a vLLM that sizes its staging itself, its note."""
    note = "# vllm-staging-plugin patch: not needed:"
    return err == "" or (words == ["patch", "presize"] and SIZES_STAGING and err.startswith(note))


def into_closed_pipe(words: list[str], lines: int, cwd: Path) -> tuple[int, str]:
    """Run the console script with a reader that takes ``lines`` lines, then closes; its code and stderr."""
    env = clean_environment({"HF_HUB_OFFLINE": "1"})
    with subprocess.Popen([str(SCRIPT), *words], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                          env=env, text=True) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        for _ in range(lines):
            proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        return proc.wait(timeout=300), err


@pytest.mark.parametrize("words", FAST, ids=" ".join)
def test_a_fast_command_stops_quietly_when_its_reader_goes(words: list[str], tmp_path: Path) -> None:
    code, err = into_closed_pipe(words, 0, tmp_path)  # closed before the first line: met every time
    # argparse's help swallows a failed write itself: it ends as --help does
    assert code == (0 if "--help" in words else READER_GONE) and quiet(words, err), err


@pytest.mark.extended
@pytest.mark.parametrize("words", FAST, ids=" ".join)
def test_a_fast_command_read_one_line_at_a_time_stops_quietly_every_time(
    words: list[str], tmp_path: Path
) -> None:
    for _ in range(12):  # `| head -1`: met whenever the command is still printing
        code, err = into_closed_pipe(words, 1, tmp_path)
        assert code in (0, READER_GONE) and quiet(words, err), err


@pytest.mark.extended
@pytest.mark.parametrize("pre_flight", [False, True], ids=["main job", "pre-flight"])
def test_the_main_job_and_a_pre_flight_stop_quietly_when_their_reader_goes(
    pre_flight: bool, tmp_path: Path
) -> None:
    kimi = model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    words = ["check", "--", kimi, *NO_WEIGHTS, *KIMI_CRASH] if pre_flight else []
    code, err = into_closed_pipe(words, 0, tmp_path)
    assert code == READER_GONE and "internal error" not in err and "Traceback" not in err, err


@pytest.mark.extended  # matplotlib's import and drawing: about 3 s
def test_a_plot_is_whole_when_the_reader_goes(tmp_path: Path) -> None:
    """``report --plot`` writes the picture before it prints: the file is complete, the exit quiet."""
    pytest.importorskip("matplotlib")
    target = tmp_path / "orders.png"
    code, err = into_closed_pipe(["report", str(RECEIPTS), "--plot", str(target)], 0, tmp_path)
    assert (code, err) == (READER_GONE, "")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.read_bytes().endswith(b"IEND\xaeB`\x82")
