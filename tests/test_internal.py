"""An internal error (a bug in the plugin, or a vLLM private changed under a seam) in the main job,
``report`` and ``check --``: exit 70, one line naming what broke and where, the traceback only under -v."""

from __future__ import annotations

import json
from typing import Any

import pytest
from stable import assert_says

from vllm_staging_plugin._offline import cpu_replay, internal, preflight, report
from vllm_staging_plugin._offline.cli import main
from vllm_staging_plugin._offline.exits import Exit
from vllm_staging_plugin._offline.preflight import workaround
from vllm_staging_plugin._offline.seams import SeamChanged


def changed_seam(*args: Any, **kwargs: Any) -> Any:
    raise SeamChanged("vllm.v1.worker.gpu.cudagraph_utils has no _capture_descs")


@pytest.mark.parametrize("verbose", [False, True])
def test_a_changed_seam_in_the_main_job_is_named_in_one_line(
    verbose: bool, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(cpu_replay, "replay", changed_seam)  # main_job imports it once settings are valid
    assert main(["check", *(["-v"] if verbose else [])]) == Exit.INTERNAL == 70
    out, err = capsys.readouterr()
    assert "would patch: yes" not in out and out == ""
    *trace, line = err.splitlines()
    assert_says(
        line,
        "vllm-staging-plugin: internal error (a vLLM private the plugin reads changed): SeamChanged: "
        "vllm.v1.worker.gpu.cudagraph_utils has no _capture_descs",
        "(at vllm_staging_plugin._offline.main_job:",
        "in run)",
        end="please report it with this line, `vllm-staging-plugin --version` and `pip show vllm` "
        "(-v prints the traceback)",
    )
    assert ("Traceback (most recent call last):" in trace) if verbose else trace == []


def test_a_bug_in_report_is_an_internal_error_not_no_receipts(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Any
) -> None:
    monkeypatch.setattr(report, "read_receipts", lambda directory, skip: workaround.widest(None))  # type: ignore[arg-type]
    assert main(["report", str(tmp_path)]) == 70
    (line,) = capsys.readouterr().err.splitlines()
    assert_says(
        line,
        "vllm-staging-plugin: internal error (a bug in the plugin, or a vLLM change it does not know): "
        "AttributeError: 'NoneType' object has no attribute 'values'",
        "(at vllm_staging_plugin._offline.preflight.workaround:",
        "in widest)",
    )


def test_the_preflight_tells_its_own_bug_from_what_vllm_cannot_inspect(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The innermost frame decides: the plugin's own code is exit 70; vLLM's (or anyone else's) exit 3."""
    monkeypatch.setattr(preflight, "run", lambda *a: workaround.widest(None))  # type: ignore[arg-type]
    assert preflight.main(["./model"], None, as_json=True) == 70
    answer = json.loads(capsys.readouterr().out)
    assert answer["exit_code"] == 70 and answer["error"] == "internal error"
    assert answer["message"].startswith("internal error (a bug in the plugin")
    assert preflight.main(["./model"], None, as_json=False) == 70
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("vllm-staging-plugin check: internal error (a bug in the plugin")

    def vllm_refuses(*args: Any) -> None:
        raise ValueError("Model architectures ['X'] failed to be inspected")

    monkeypatch.setattr(preflight, "run", vllm_refuses)
    assert preflight.main(["./model"], None, as_json=True) == 3
    assert json.loads(capsys.readouterr().out)["error"] == "cannot check on this machine"


def test_where_outside_the_plugin_says_so() -> None:
    try:
        raise ValueError("x")
    except ValueError as exc:
        assert internal.where(exc) == "outside the plugin" and not internal.is_internal(exc)
    assert internal.is_internal(SeamChanged("gone"))
