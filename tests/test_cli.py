"""The CLI's main job on the real installed vLLM, in-process (it needs no GPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from release import SIZES_STAGING

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
from stable import assert_says

from vllm_staging_plugin._offline.cli import main

pytestmark = pytest.mark.contract


def test_main_job_shows_the_crash_and_the_fix(capsys: Any) -> None:
    """And leaves os.environ exactly as it found it (it sets VLLM_LOGGING_LEVEL for its own run)."""
    environ = dict(os.environ)
    assert main([]) == 0
    assert dict(os.environ) == environ
    out = capsys.readouterr().out
    assert "would patch: yes" in out
    assert "PIECEWISE   51 descriptors, num_tokens 512, 496, 480, 464, 448, ..., 16, 8, 4, 2, 1" in out
    assert "capacity   512 rows" in out
    if SIZES_STAGING:  # vLLM 0.34.0 sizes its staging itself: stock boots the other order too
        assert "stock    OK: hidden_states [512, 4096] bfloat16 = 4.00 MiB" in out
        assert "this vLLM sizes its staging buffers to the largest capture descriptor itself" in out
    else:
        crash = "The expanded size of the tensor (1) must match the existing size (2)"
        assert f"stock    CRASH: RuntimeError: {crash}" in out
    assert "patched  OK: hidden_states [512, 4096] bfloat16 = 4.00 MiB" in out
    assert "stock and patched buffers identical in shape, dtype and bytes: yes" in out


def test_main_job_with_a_shuffled_order_and_smaller_grid(capsys: Any) -> None:
    assert main(["--order", "shuffle:3", "--max-size", "64", "--hidden-size", "128"]) == 0
    out = capsys.readouterr().out
    assert "capacity   64 rows" in out and "patched  OK: hidden_states [64, 128]" in out


def test_bad_configuration_is_reported_with_exit_2(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "zigzag")
    assert main([]) == 2
    assert (
        "configuration: INVALID: STAGING_PLUGIN_ORDER='zigzag': unknown order policy"
        in capsys.readouterr().out
    )


def test_the_kill_switch_is_named_beside_would_patch(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_DISABLE", "1")
    assert main(["--max-size", "16", "--hidden-size", "64"]) == 0  # the structure is supported
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("would patch: yes"))
    assert lines[at + 1] == "but STAGING_PLUGIN_DISABLE is set: with it, the plugin leaves vLLM untouched"


def test_the_configuration_line_names_every_variable_it_read(
    capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_KDA_FIX", "off")
    assert main(["--max-size", "16", "--hidden-size", "64"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("configuration:"))
    assert line == (
        "configuration: order=descending presize=on kda_fix=off strict=False disabled=False receipts=- "
        "(valid)"
    )


def test_json_and_gpu_need_serve_arguments(capsys: Any) -> None:
    """They belong to the pre-flight (`check -- ARGS`); the main job refuses them with exit 2, and with
    --json as one JSON object."""
    assert main(["check", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "bad arguments" and "add `-- MODEL [vllm serve arguments]`" in out["message"]
    assert main(["check", "--gpus", "2"]) == 2
    assert "--gpus belong to the pre-flight" in capsys.readouterr().err


def test_main_job_says_not_installed(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_staging_plugin._engine import compat

    monkeypatch.setattr(compat, "installed_versions", lambda: {"vllm": None, "torch": "2.13.0"})
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "installed: vllm not installed, torch 2.13.0" in out and "None" not in out


def test_main_job_refuses_a_bad_order_or_mode_in_one_line(capsys: Any) -> None:
    assert main(["--order", "zigzag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert_says(
        err[0],
        "vllm-staging-plugin check: --order 'zigzag': unknown order policy 'zigzag'",
        end="allowed values: descending, ascending, max-first, shuffle:SEED, "
        "full-first, size-descending, interleaved",
    )
    assert main(["--mode", "SIDEWAYS"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --mode: invalid choice: 'SIDEWAYS'" in err[0]


def test_a_receipts_directory_that_cannot_be_written_is_said_by_the_main_job(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path / "a-file" / "receipts"))
    assert main(["--max-size", "16", "--hidden-size", "64"]) == 0  # vLLM still boots: receipts are extra
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("configuration:"))
    assert lines[at].endswith("(valid values; WARNING below)")
    file = tmp_path / "a-file"
    assert lines[at + 1] == (
        f"WARNING STAGING_PLUGIN_RECEIPTS_DIR={file / 'receipts'}: {file} is not a directory; vLLM boots and "
        "serves, but no receipt is written there"
    )


def test_check_says_it_before_the_pre_flight_runs(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path / "a-file"))
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--", "./missing-model"]) == 2
    warning, refusal = capsys.readouterr().err.splitlines()
    file = tmp_path / "a-file"
    assert warning == (
        f"vllm-staging-plugin check: WARNING STAGING_PLUGIN_RECEIPTS_DIR={file}: {file} is not a directory; "
        "vLLM boots and serves, but no receipt is written there"
    )
    assert refusal.startswith("vllm-staging-plugin check: bad arguments: model './missing-model': no such")
