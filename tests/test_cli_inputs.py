"""Every bad input the CLI meets, as a user meets it: the console script in a fresh process, real vLLM 0.33.0.

Each answer is one line naming the problem with the documented exit code (2 bad arguments, 3 cannot
check here), never a traceback; with --json, stdout is exactly one JSON object carrying ``error``. By
default vLLM's INFO lines and the warnings of a GPU-less machine are hidden; ``-v`` shows them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from configs import QWEN3_0_6B

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("vllm-staging-plugin")
NO_WEIGHTS = ["--load-format", "dummy", "--skip-tokenizer-init"]
TINY_UNKNOWN = {
    "architectures": ["NoSuchModelForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 128,
}  # fmt: skip
FORM = "vllm-staging-plugin check [options] -- MODEL [vllm serve arguments]"
CPU_ONLY_NOISE = ("Failed to import from vllm._C", "Triton not available", "Failed to import Triton kernels")


def cli(*words: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("STAGING_PLUGIN_", "VLLM_LOGGING", "HF_"))}  # fmt: skip
    return subprocess.run(
        [str(SCRIPT), *words],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_json_object(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    out: dict[str, object] = json.loads(proc.stdout)  # the whole of stdout is one object
    assert out["exit_code"] == proc.returncode and ("error" in out) == (proc.returncode >= 2)
    return out


def folder(root: Path, config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return root


OFFLINE = {"HF_HUB_OFFLINE": "1"}
CLOSED_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there: the hub cannot be reached


@pytest.mark.parametrize(
    ("words", "env", "code", "message"),
    [
        (["--", "./missing-model"], OFFLINE, 2,
         "model './missing-model': no such folder (a local model is a folder holding its config.json)"),
        (["--", "./missing-model"], {}, 2, "model './missing-model': no such folder"),
        (["--", "./config.json"], OFFLINE, 2, "model './config.json': a file, not a model folder"),
        (["--", "qwen3x"], CLOSED_HUB, 2, "model 'qwen3x': no such folder; did you mean 'qwen3'?"),
        (["--", "Qwen/Qwen3-8B"], OFFLINE, 3,
         "model 'Qwen/Qwen3-8B' is not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE"),
        (["--", "Qwen/Qwen3-8B"], CLOSED_HUB, 3,
         "model 'Qwen/Qwen3-8B' is not a local folder and the hub (127.0.0.1) cannot be reached"),
        (["--order", "zigzag", "--", "./qwen3"], {}, 2, "--order 'zigzag': unknown order policy"),
        (["--", "./qwen3"], {"STAGING_PLUGIN_ORDER": "zigzag"}, 2, "STAGING_PLUGIN_ORDER='zigzag': unknown"),
        (["--gpus", "0", "--", "./qwen3"], {}, 2, "argument --gpus: '0': must be 1 or more"),
        (["--"], {}, 2, f"nothing after `--`: {FORM}"),
        (["./qwen3", "--max-num-seqs", "4"], {}, 2,
         f"'./qwen3' looks like a model: the vllm serve arguments go after `--`, as in: {FORM}"),
    ],
)  # fmt: skip
def test_each_bad_input_is_one_line_with_its_exit_code(
    words: list[str], env: dict[str, str], code: int, message: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text("{}")
    folder(tmp_path / "qwen3", QWEN3_0_6B)
    text = cli("check", *words, cwd=tmp_path, env=env)
    assert text.returncode == code, text.stderr[-2000:]
    assert text.stdout == "" and "Traceback" not in text.stderr
    lines = text.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], text.stderr
    proc = cli("check", "--json", *words, cwd=tmp_path, env=env)
    out = one_json_object(proc)
    assert proc.returncode == code and message in str(out["message"])


def test_an_unknown_architecture_is_one_line_not_vllms_list_quietly(tmp_path: Path) -> None:
    """Also the quiet default: no vLLM INFO line and none of the CPU-only warnings reach the terminal."""
    model = folder(tmp_path / "unknown", TINY_UNKNOWN)
    proc = cli("check", "--", str(model), *NO_WEIGHTS, cwd=tmp_path, env=OFFLINE)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "vllm-staging-plugin check: bad arguments: ModelConfig: Model architectures "
        "['NoSuchModelForCausalLM'] are not supported for now: vLLM 0.33.0 does not know this architecture "
        "(check `architectures` in config.json and the vLLM version)"
    ]
    out = one_json_object(cli("check", "--json", "--", str(model), *NO_WEIGHTS, cwd=tmp_path, env=OFFLINE))
    assert out["exit_code"] == 2 and len(str(out["message"])) < 300


def test_quiet_by_default_everything_with_verbose(tmp_path: Path) -> None:
    model = str(folder(tmp_path / "qwen3", QWEN3_0_6B))
    quiet = cli("check", "--", model, *NO_WEIGHTS, cwd=tmp_path, env=OFFLINE)
    assert quiet.returncode == 0 and "stock vLLM (its own order): boots" in quiet.stdout
    assert quiet.stderr == ""  # nothing but the answer
    loud = cli("check", "-v", "--", model, *NO_WEIGHTS, cwd=tmp_path, env=OFFLINE)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert " INFO " in loud.stderr and any(noise in loud.stderr for noise in CPU_ONLY_NOISE)
    assert loud.stderr.startswith("note: messages about vllm._C and Triton are expected on a machine without")
    # the operator's own log level is kept, and stdout is still one JSON object
    own = cli(
        "check",
        "--json",
        "--",
        model,
        *NO_WEIGHTS,
        cwd=tmp_path,
        env={**OFFLINE, "VLLM_LOGGING_LEVEL": "INFO"},
    )
    assert one_json_object(own)["stock"] and " INFO " in own.stderr


def test_help_lists_every_option_and_the_exit_codes(tmp_path: Path) -> None:
    top = cli("--help", cwd=tmp_path)
    assert top.returncode == 0 and "``" not in top.stdout
    check = cli("check", "--help", cwd=tmp_path).stdout
    for option in ("--order", "--json", "--gpu ", "--gpus", "--mode", "--max-size", "--max-num-seqs",
                   "--hidden-size", "-v, --verbose"):  # fmt: skip
        assert option in check, option
    assert "exit codes:" in check and "3  cannot check on this machine" in check
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
