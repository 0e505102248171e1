"""Every bad input the CLI meets, as a user meets it, and what reaches the terminal; real vLLM 0.33.0.

Each answer is one line naming the problem with the documented exit code (2 bad arguments, 3 cannot
check here), never a traceback; with --json, stdout is exactly one JSON object carrying ``error``. By
default vLLM's INFO lines and the warnings of a GPU-less machine are hidden; ``-v`` shows them.

One child calls ``main([...])`` for each bad input refused before vLLM is imported, recording after each
call whether vLLM or torch is imported yet (it never imports vLLM: a second or two). The bad inputs that
need vLLM (read by its parser, or refused by its config), ``-v``, vLLM's refusal of an unknown
architecture and vLLM's log lines beside ``--json`` are met in this process; ``--help`` and ``report``,
which never import vLLM, run the console script on their own. The console script's quiet pre-flight (the
first check of an architecture: vLLM reads its log level once, when imported, and inspects the model
class in its own subprocess) imports vLLM twice and runs under the ``extended`` marker. (The operator's
own log level, and what ``-v`` keeps: test_quiet.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from childproc import Checks, clean_environment, finish, once_per_run, start
from configs import KIMI_CRASH, KIMI_LINEAR_4_LAYERS, NO_WEIGHTS, QWEN3_0_6B, model_folder
from release import SIZES_STAGING
from stable import assert_says

from vllm_staging_plugin._offline.cli import main

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("vllm-staging-plugin")
TINY_UNKNOWN = {
    "architectures": ["NoSuchModelForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 128,
}  # fmt: skip
FORM = "vllm-staging-plugin check [options] -- MODEL [vllm serve arguments]"
CPU_ONLY_NOISE = ("Failed to import from vllm._C", "Triton not available", "Failed to import Triton kernels")


def cli(*words: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *words],
        cwd=cwd,
        env=terminal_environment(env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def terminal_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    return clean_environment(env, drop=("VLLM_LOGGING", "HF_"))


def one_json_object(code: int, stdout: str, stderr: str) -> dict[str, Any]:
    assert "Traceback" not in stderr, stderr[-2000:]
    out: dict[str, Any] = json.loads(stdout)  # the whole of stdout is one object
    assert out["exit_code"] == code and ("error" in out) == (code >= 2)
    return out


OFFLINE = {"HF_HUB_OFFLINE": "1"}
CLOSED_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there: the hub cannot be reached
BAD_INPUTS = [  # (words, environment, exit code, the one line says)
    (["--", "./missing-model"], OFFLINE, 2,
     "model './missing-model': no such folder (a local model is a folder holding its config.json)"),
    (["--", "./missing-model"], {}, 2, "model './missing-model': no such folder"),
    (["--", "./config.json"], OFFLINE, 2, "model './config.json': a file, not a model folder"),
    (["--", "./listed"], OFFLINE, 2, "model './listed': its config.json holds a JSON list, not an object"),
    (["--", "./garbled"], OFFLINE, 2,
     "model './garbled': its config.json cannot be read as JSON (Expecting value"),
    (["--", "qwen3x"], CLOSED_HUB, 2, "model 'qwen3x': no such folder; did you mean 'qwen3'?"),
    (["--", "./qwen3x"], OFFLINE, 2, "model './qwen3x': no such folder; did you mean './qwen3'?"),
    (["--", "Qwen/Qwen3-8B"], OFFLINE, 3,
     "model 'Qwen/Qwen3-8B' is not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE"),
    (["--", "Qwen/Qwen3-8B"], CLOSED_HUB, 3,
     "model 'Qwen/Qwen3-8B' is not a local folder and the hub (127.0.0.1) cannot be reached"),
    (["--order", "zigzag", "--", "./qwen3"], {}, 2, "--order 'zigzag': unknown order policy"),
    (["--", "./qwen3"], {"STAGING_PLUGIN_ORDER": "zigzag"}, 2, "STAGING_PLUGIN_ORDER='zigzag': unknown"),
    (["--", "./qwen3"], {"STAGING_PLUGIN_STRICT": "maybe"}, 2,
     "STAGING_PLUGIN_STRICT='maybe' is not a boolean; allowed values: 0, false, no, off, 1, true, yes, on"),
    (["--", "./qwen3"], {"STAGING_PLUGIN_PRESIZE": "bogus"}, 2,
     "STAGING_PLUGIN_PRESIZE='bogus'; allowed values: on, off, off-allow-crash"),
    (["--order", "ascending", "--", "./qwen3"], {"STAGING_PLUGIN_PRESIZE": "off"}, 2,
     "STAGING_PLUGIN_ORDER='ascending' needs pre-sizing (STAGING_PLUGIN_PRESIZE=on)"),
    (["--gpus", "0", "--", "./qwen3"], {}, 2, "argument --gpus: '0': must be 1 or more"),
    (["--max-num-seqs", "48", "--", "./qwen3"], {}, 2,
     "--max-num-seqs: options of the demonstration (without `--`); a vllm serve option goes after `--`"),
    (["--"], {}, 2, f"nothing after `--`: {FORM}"),
    (["./qwen3", "--max-num-seqs", "4"], {}, 2,
     f"'./qwen3' looks like a model: the vllm serve arguments go after `--`, as in: {FORM}"),
    (["--", "a/b/qwen3"], {}, 2, "model 'a/b/qwen3': no such folder, and not a Hugging Face repository id"),
    (["--bogus"], {}, 2,
     "unrecognized arguments: --bogus (`vllm-staging-plugin check --help` explains the options)"),
    # last: vLLM's own parser reads it, so vLLM is imported from here on in its child
    (["--", "./qwen3", "--speculative-config", '{"method": "ngram",}'], {}, 2,
     "vllm serve: error: argument --speculative-config/-sc: not valid JSON (Expecting property name enclosed "
     'in double quotes: line 1 column 20 (char 19)): {"method": "ngram",}'),
    (["--", "./qwen3", "--speculative-config", '{"method": "eagle3", "model": "./no-drafter"}'], {}, 2,
     "speculative model './no-drafter': no such folder (a local model is a folder holding its config.json)"),
    (["--", "./zz"], {}, 2,  # no model type's name inside "zz": transformers cannot guess one
     "ModelConfig: Unrecognized model in ./zz. Should have a `model_type` key in its config.json"),
    (["--", "./nosuch", *NO_WEIGHTS], {}, 2,  # one line, not Transformers' advice to upgrade it
     "ModelConfig: model type 'nosuchtype' (architectures ['NoSuchModelForCausalLM']) is not one "
     f"Transformers knows: vLLM {version('vllm')} does not know this architecture (check `architectures` "
     "in config.json and the vLLM version)"),
    (["--", "./qwen3", "--max-num-seqs", "-5"], {}, 2,  # pydantic's two errors, the operator's option first
     "SchedulerConfig: max_num_seqs (--max-num-seqs) Input should be greater than or equal to 1; "
     "max_num_batched_tokens Input should be greater than or equal to 1"),
    (["--", "./qwen3", "-cc", '{"cudagraph_capture_sizes": "x"}'], {}, 2,
     "vllm serve: error: argument --compilation-config/-cc: 1 validation error for CompilationConfig: "
     "cudagraph_capture_sizes: Input should be a valid array"),
]  # fmt: skip
STOCK_CRASH = "The expanded size of the tensor (8) must match the existing size (9)"
# The refusals that come after vLLM is imported: read by its parser, or refused by its config.
AFTER_VLLM = ("vllm serve: error", "speculative model", "ModelConfig", "SchedulerConfig")


def needs_vllm(message: str) -> bool:
    return message.startswith(AFTER_VLLM)


def case_name(words: list[str], env: dict[str, str]) -> str:
    return " ".join([*(f"{k}={v}" for k, v in env.items()), *words])


def _model_folders(root: Path) -> Path:
    """The bad inputs' folders: ./qwen3, a file, a list, garbled JSON, a config.json without model_type."""
    (root / "config.json").write_text("{}")
    model_folder(root / "qwen3", QWEN3_0_6B)
    unknown = json.dumps({**TINY_UNKNOWN, "model_type": "nosuchtype"})  # neither vLLM nor Transformers
    for name, text in (("listed", "[1, 2]"), ("zz", "{}"), ("garbled", "not json"), ("nosuch", unknown)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(text)
    return root


def _early_refusals(root: Path) -> dict[str, Any]:
    """The child that calls ``main`` for each bad input refused before vLLM is imported."""
    _model_folders(root)
    calls = [
        [case_name(argv, env), argv, env]
        for words, env, _, message in BAD_INPUTS
        if not needs_vllm(message)
        for argv in (["check", *words], ["check", "--json", *words])
    ]
    caller = start("cli_calls", terminal_environment({"CALLS": json.dumps(calls)}), cwd=root)
    return finish(caller, timeout=400).results


def _quiet_console_script(root: Path) -> dict[str, Any]:
    """The console script's first check of an architecture, with an empty vLLM cache of its own."""
    kimi = model_folder(root / "kimi", KIMI_LINEAR_4_LAYERS)
    first_time = OFFLINE | {"VLLM_CACHE_ROOT": str(root / "empty-cache")}  # vLLM inspects the model afresh
    done = subprocess.run(
        [str(SCRIPT), "check", "--", kimi, *NO_WEIGHTS, *KIMI_CRASH],
        cwd=root,
        env=terminal_environment(first_time),
        capture_output=True,
        text=True,
        timeout=400,
    )
    written = root / "empty-cache" / "modelinfos"  # what vLLM's inspection subprocess left there
    inspected = sorted(p.name for p in written.iterdir()) if written.is_dir() else []
    return {"code": done.returncode, "out": done.stdout, "err": done.stderr, "inspected": inspected}


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cli")
    calls = once_per_run(tmp_path_factory, "test_cli_inputs", lambda: _early_refusals(root))
    return {"calls": calls}


@contextlib.contextmanager
def no_retry_pause() -> Iterator[None]:
    """vLLM retries reading a config.json it cannot parse after a pause of 2 s (``with_retry``); the answer
    is the same without the pause, which the in-process calls here skip."""
    repo_utils = pytest.importorskip("vllm.transformers_utils.repo_utils")
    with mock.patch.object(repo_utils, "time", types.SimpleNamespace(sleep=lambda seconds: None)):
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, model_inspection_cache: list[str]) -> Path:
    """The bad inputs' folders for the calls made here; the run's inspection cache spares vLLM's
    inspection subprocess."""
    return _model_folders(tmp_path_factory.mktemp("cli-here"))


def call(
    children: dict[str, Any], folders: Path, words: list[str], env: dict[str, str], message: str
) -> dict[str, Any]:
    """One call's code and output: from the child, or (once vLLM is needed) from ``main`` here."""
    if not needs_vllm(message):
        result: dict[str, Any] = Checks(children["calls"], "").value(case_name(words, env))
        return result
    assert env == {}  # the cases met here set no variable
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(folders), terminal_logs(), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err), no_retry_pause():  # fmt: skip
        code = main(words)
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


@pytest.mark.parametrize(("words", "env", "code", "message"), BAD_INPUTS)
def test_each_bad_input_is_one_line_with_its_exit_code(
    words: list[str], env: dict[str, str], code: int, message: str, children: dict[str, Any], folders: Path
) -> None:
    text = call(children, folders, ["check", *words], env, message)
    assert text["code"] == code, text["err"][-2000:]
    assert text["out"] == "" and "Traceback" not in text["err"]
    lines = text["err"].strip().splitlines()
    assert len(lines) == 1 and message in lines[0], text["err"]
    as_json = call(children, folders, ["check", "--json", *words], env, message)
    out = one_json_object(as_json["code"], as_json["out"], as_json["err"])
    assert as_json["code"] == code and message in str(out["message"])
    if not needs_vllm(message):
        assert not text["vllm"] and not as_json["vllm"]  # refused before vLLM is imported
        assert not text["torch"] and not as_json["torch"]  # and before torch


def test_vllms_help_after_the_separator_is_one_json_object_with_json(tmp_path: Path, capsys: Any) -> None:
    """`--help` after `--` is vLLM's parser's: its help, exit 0, on stderr (stdout is the report's); with
    --json the one object says to leave --json out, exit 2."""
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    with terminal_logs():
        assert main(["check", "--json", "--", model, "--help"]) == 2
        as_json = capsys.readouterr()
        assert main(["check", "--", model, "--help"]) == 0
        text = capsys.readouterr()
    out = one_json_object(2, as_json.out, as_json.err)
    assert out["error"] == "bad arguments" and "leave out --json" in str(out["message"])
    assert text.out == "" and "usage: vllm serve" in text.err


@pytest.mark.parametrize(
    ("words", "named"),
    [(["--max-s", "8"], "--max-size"), (["--hidden=8", "--mode", "FULL"], "--mode, --hidden-size"),
     (["--max-num-seqs", "128"], "--max-num-seqs")],  # the last: the demonstration's default, still given
)  # fmt: skip
def test_a_demonstration_option_with_the_separator_is_refused_however_it_is_spelled(
    words: list[str], named: str, capsys: Any
) -> None:
    """argparse takes an abbreviated option and an option given its default value: the pre-flight would
    ignore either, so each is named and refused, before vLLM or the model folder is looked at."""
    assert main(["check", *words, "--", "./no-such-model"]) == 2
    assert capsys.readouterr().err.startswith(
        f"vllm-staging-plugin check: {named}: options of the demonstration (without `--`)"
    )


@pytest.mark.parametrize(
    ("constants", "says"),
    [({"HF_HUB_OFFLINE": True}, "is not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE"),
     ({"HF_HUB_OFFLINE": False, "ENDPOINT": "http://127.0.0.1:9"},
      "is not a local folder and the hub (127.0.0.1) cannot be reached")],
)  # fmt: skip
def test_a_hub_drafter_is_checked_as_the_model_is(
    constants: dict[str, Any], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A drafter named by a hub id, neither cached nor reachable, is exit 3 in one line, at once (vLLM's
    hub client would retry for half a minute, then call it an invalid repository id: exit 2)."""
    import huggingface_hub.constants

    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    for name, value in constants.items():
        monkeypatch.setattr(huggingface_hub.constants, name, value)
    spec = '{"method": "eagle3", "model": "org/drafter", "num_speculative_tokens": 3}'
    with terminal_logs():
        assert main(["check", "--", model, "--speculative-config", spec]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"vllm-staging-plugin check: cannot check on this machine: speculative model "
                          f"'org/drafter' {says}") and err.count("\n") == 1, err  # fmt: skip


def test_an_unknown_architecture_is_one_line_not_vllms_list(tmp_path: Path, capsys: Any) -> None:
    """vLLM's refusal, met in this process (vLLM imported): one line on stderr, nothing on stdout, not
    vLLM's 11 KB list of architectures. (The first vLLM import's quietness: the console script's test.)"""
    unknown = model_folder(tmp_path / "unknown", TINY_UNKNOWN)
    with terminal_logs():
        code = main(["check", "--", unknown, *NO_WEIGHTS])
        text = capsys.readouterr()
        json_code = main(["check", "--json", "--", unknown, *NO_WEIGHTS])
        as_json = capsys.readouterr()
    assert code == 2 and text.out == ""
    (line,) = text.err.strip().splitlines()
    assert_says(line, "vllm-staging-plugin check: bad arguments: ModelConfig: Model architectures "
                "['NoSuchModelForCausalLM'] are not supported", f"vLLM {version('vllm')} does not know this",
                "`architectures` in config.json")  # fmt: skip
    out = one_json_object(json_code, as_json.out, as_json.err)
    assert out["exit_code"] == 2 and len(str(out["message"])) < 300


@pytest.mark.usefixtures("model_inspection_cache", "offline")
def test_with_json_vllms_log_lines_go_to_stderr(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout stays one JSON object while vLLM logs (a warning, which quiet mode keeps, logged as vLLM
    finishes building the configuration); the line reaches stderr."""
    from vllm_staging_plugin._offline import preflight

    build = preflight.create_engine_config

    def logging_build(args: Any, argv: Any = ()) -> Any:
        config = build(args, argv)  # vLLM configures its log handler in there, if this process had none yet
        logging.getLogger("vllm.config.model").warning("a warning of vLLM's")
        return config

    monkeypatch.setattr(preflight, "create_engine_config", logging_build)
    qwen3 = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    with terminal_logs():
        code = main(["check", "--json", "--", qwen3, *NO_WEIGHTS])
        captured = capsys.readouterr()
    assert one_json_object(code, captured.out, captured.err)["stock"]["ok"]
    assert "a warning of vLLM's" in captured.err and "a warning" not in captured.out


@contextlib.contextmanager
def terminal_logs() -> Iterator[None]:
    """vLLM's stream handlers (if this process configured them already) write to the current
    ``sys.stdout`` for the block, as in a fresh console script; handlers vLLM configures during the block
    bind the streams of the moment. Either way what vLLM logs reaches the captured streams."""
    handlers = [h for h in logging.getLogger("vllm").handlers if isinstance(h, logging.StreamHandler)]
    streams = [h.stream for h in handlers]
    for handler in handlers:  # not setStream: it flushes the old stream, which a finished test closed
        handler.stream = sys.stdout
    try:
        yield
    finally:
        for handler, stream in zip(handlers, streams, strict=True):
            handler.stream = stream


@pytest.mark.extended
def test_the_console_script_end_to_end_quietly(tmp_path: Path) -> None:
    """The installed entry point, a fresh process, the decisive configuration, text output, the first
    check of an architecture (vLLM inspects the model class in its subprocess); by default nothing but the
    answer reaches the terminal: no vLLM INFO line, none of the CPU-only warnings."""
    quiet = _quiet_console_script(tmp_path)
    assert [name.rsplit("-", 1)[-1] for name in quiet["inspected"]] == ["KimiLinearForCausalLM.json"]
    assert quiet["code"] == 0, quiet["out"][-2000:] + quiet["err"][-3000:]  # boots and serves with the plugin
    out = quiet["out"]
    assert "  PIECEWISE    4 descriptors, num_tokens 8, 4, 2, 1" in out
    assert "  FULL         3 descriptors, num_tokens 9, 6, 3" in out
    if SIZES_STAGING:  # vLLM 0.34.0 sizes the staging itself, then dies in its boot warm-up (KDA)
        assert "stock vLLM (its own order): its staging holds (hidden_states [9, 2304]" in out
        assert "but it dies at boot in its warm-up, before the capture (serving, below)" in out
    else:
        assert "stock vLLM (its own order): crashes at capture" in out and STOCK_CRASH in out
        assert "  allocated by  PIECEWISE num_tokens=8" in out
        assert "  did not fit   FULL num_tokens=9 (uniform decode 3 x 3)" in out
        assert "or upgrade: vLLM 0.34.0 sizes its staging buffers itself, and this crash is gone there" in out
        assert "  the serving fault above is not: vLLM 0.34.0 runs such a step in its boot warm-up" in out
    assert "with the plugin (order descending): boots, 9-row buffers" in out
    assert "serving: stock vLLM's shared KDA layer (KimiGatedDeltaNetAttention" in out
    assert "reads past its state index on every step that mixes a speculative decode with a prefill" in out
    assert "its kernel reads 3 index words (1 + 2 speculative tokens)" in out
    assert "  with the plugin: fixed, it serves" in out
    # vLLM 0.34.0's own warning that the grid's knob is deprecated reaches the operator; nothing else does
    deprecated = [line for line in quiet["err"].splitlines() if "cudagraph_capture_sizes" not in line]
    assert deprecated == [] if SIZES_STAGING else quiet["err"] == ""


@pytest.mark.usefixtures("offline", "model_inspection_cache")
def test_verbose_shows_everything_else_unchanged(folders: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-v``: the same answer as without it, vLLM's INFO lines beside it, and first the line that says why
    vLLM's CPU-only messages come (test_quiet.py: ``-v`` drops none of them)."""
    kimi = model_folder(folders / "kimi", KIMI_LINEAR_4_LAYERS)
    with contextlib.chdir(folders), terminal_logs():
        assert main(["check", "--", kimi, *NO_WEIGHTS, *KIMI_CRASH]) == 0
        quiet = capsys.readouterr()
        code = main(["check", "-v", "--", kimi, *NO_WEIGHTS, *KIMI_CRASH])
    loud = capsys.readouterr()
    assert code == 0 and loud.out == quiet.out and " INFO " not in quiet.err
    assert " INFO " in loud.err
    assert loud.err.startswith("note: messages about vllm._C and Triton are expected on a machine without")


def test_help_lists_every_option_and_the_exit_codes(tmp_path: Path) -> None:
    top = cli("--help", cwd=tmp_path)
    assert top.returncode == 0 and "``" not in top.stdout
    check = cli("check", "--help", cwd=tmp_path).stdout
    for option in ("--order", "--json", "--gpu ", "--gpus", "--mode", "--max-size", "--max-num-seqs",
                   "--hidden-size", "-v, --verbose"):  # fmt: skip
        assert option in check, option
    assert "exit codes:" in check and "3  cannot check on this machine" in check
    assert "4  it boots with the plugin but will not serve correctly" in check
    report = cli("report", "--help", cwd=tmp_path).stdout
    assert "every *.json file below it" in report and "exit codes:" in report


def test_report_reads_every_json_file_and_names_each_foreign_one(tmp_path: Path) -> None:
    receipts = ROOT / "docs" / "data" / "h200-2026-11-29" / "receipts" / "r0-qwen3-0.6b-descending-plugin"
    shutil.copytree(receipts, tmp_path / "r")
    (tmp_path / "r" / "r1.json").write_text("{corrupt")
    (tmp_path / "r" / "foreign.json").write_text(json.dumps({"name": "something else"}))
    proc = cli("report", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 0 and "descending" in proc.stdout
    warned = proc.stderr.strip().splitlines()
    assert len(warned) == 2 and "Traceback" not in proc.stderr
    assert any("r1.json: not JSON" in line for line in warned)
    assert any("foreign.json" in line for line in warned)
