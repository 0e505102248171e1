"""Kimi-K3 at its deployed settings, answered by ``check`` on the installed vLLM 0.33.0: the shipped MXFP4
cut with the config-only K3 DSpark drafters in tests/data (their aux buffers, capacity, stock's crash pair
and the workaround), at tensor parallel 8 and 16; the generated settings page against fresh answers; the GPU
stages' dry runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from configs import K3_4_LAYERS, K3_DRAFTERS, KIMI_LINEAR_4L, NO_WEIGHTS
from release import SIZES_STAGING

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

from vllm_staging_plugin._offline.cli import main

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache", "offline")]
ROOT = Path(__file__).resolve().parents[1]
POWERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def k3_check(capsys: Any, block: int, tokens: int | None, tp: int) -> tuple[int, dict[str, Any]]:
    spec: dict[str, Any] = {"method": "dspark", "model": str(K3_DRAFTERS[block])}
    if tokens is not None:
        spec["num_speculative_tokens"] = tokens
    argv = [str(K3_4_LAYERS), *NO_WEIGHTS, "--use-replayssm", "--max-num-seqs", "48",
            "--tensor-parallel-size", str(tp), "--speculative-config", json.dumps(spec),
            "-cc", json.dumps({"cudagraph_capture_sizes": POWERS})]  # fmt: skip
    code = main(["check", "--json", "--", *argv])
    return code, json.loads(capsys.readouterr().out)


def taps(block: int) -> int:
    """The drafter's tap count, read from its config (independently of vLLM's helper the check uses)."""
    return len(json.loads((K3_DRAFTERS[block] / "config.json").read_text())["target_layer_ids"])


@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize(
    ("block", "tokens", "capacity", "crash"),
    [(8, 8, 261, (256, 261)), (5, None, 258, (256, 258)), (7, None, 256, None)],
    ids=["block8-8-tokens", "block5", "block7"],
)
def test_the_k3_dspark_deployment_is_answered_with_every_aux_buffer(
    capsys: Any, block: int, tokens: int | None, capacity: int, crash: tuple[int, int] | None, tp: int
) -> None:
    code, out = k3_check(capsys, block, tokens, tp)
    if SIZES_STAGING and block == 7:  # 0.34.0 captures decode graphs by request count: 48 x 8 = 384 tokens
        capacity = 384
    assert code == 0 and out["architecture"] == "KimiK3ForConditionalGeneration"
    assert out["answered"] is True and out["unanswered"] == []  # every question answered in this environment
    assert out["serve"] | {"advice": None} == {
        "applies": False,
        "checked": False,
        "ok": None,
        "plugin_ok": None,
        "error": None,
        "advice": None,
        "fix": None,
    }  # fmt: skip  K3's own KDA metadata
    assert out["decode_query_len"] == 1 + (tokens or block)  # vLLM takes the block size when unset
    assert out["capacity"] == capacity and out["plugin"]["ok"] is True
    buffers = out["plugin"]["buffers"]
    aux = sorted(name for name in buffers if name.startswith("aux_hidden_states"))
    assert aux == [f"aux_hidden_states[{i}]" for i in range(taps(block))]  # one per tap of the drafter
    assert {name: b["shape"] for name, b in buffers.items()} == {
        name: [capacity, 7168] for name in ["hidden_states", *aux]
    }
    assert out["staging_bytes"] == (1 + taps(block)) * capacity * 7168 * 2  # bfloat16
    stock, workaround = out["stock"], out["stock_workaround"]
    if crash is None or SIZES_STAGING:  # 0.34.0 sizes its staging itself: stock boots every one
        assert stock["ok"] is True and workaround is None and out["fixed_in_vllm"] is None
        return
    assert out["fixed_in_vllm"] == "0.34.0"
    assert stock["ok"] is False
    assert f"tensor ({crash[0]}) must match the existing size ({crash[1]})" in stock["error"]
    assert f"Target sizes: [{crash[0]}, 7168]" in stock["error"]
    assert stock["allocated_by"] == f"PIECEWISE num_tokens={crash[0]}"
    assert workaround["verified"] is True
    assert workaround["cudagraph_capture_sizes"] == sorted([*POWERS, capacity])


def test_every_model_folder_shipped_is_checked_above() -> None:
    """tests/data holds the K3 cut and its drafters, each checked above with the README's example among
    them (block 8, 8 tokens, tensor parallel 8), and the Kimi-Linear cut, which tests/configs.py reads for
    every Kimi-Linear test; a folder added there must be added to those tests."""
    shipped = {p for p in (ROOT / "tests" / "data").iterdir() if p.is_dir()}
    assert shipped == {K3_4_LAYERS, *K3_DRAFTERS.values(), KIMI_LINEAR_4L}
    readme = (ROOT / "README.md").read_text()
    example = '"method": "dspark", "model": "tests/data/kimi-k3-dspark-b8", "num_speculative_tokens": 8'
    assert (
        "check -- tests/data/kimi-k3-4l" in readme
        and example in readme
        and "--tensor-parallel-size 8" in readme
    )


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("k3_settings", ROOT / "lab" / "k3_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("k3_settings", module)  # its dataclass resolves annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(SIZES_STAGING, reason="the page gives vLLM 0.33.0's answers")
@pytest.mark.extended  # the lab's generator and GPU stages
def test_the_k3_settings_page_is_what_check_answers_now() -> None:
    """The page's rows at tensor parallel 8 with --use-replayssm (the ones that crash stock among them)
    are regenerated here and must be on the page as they are."""
    tool = _tool()
    page = (ROOT / "docs" / "k3-settings.md").read_text().splitlines()
    settings = [s for s in tool.SETTINGS if s.tp == 8 and s.replayssm]
    rows = tool.generate(settings)
    assert len(rows) == 8 and all(row in page for row in rows)
    assert sum("crashes at capture" in row for row in rows) == 3  # n-gram 8 and DSpark 8, 5 on powers of two
    assert len([line for line in page if line.startswith("| 8 ") or line.startswith("| 16 ")]) == len(
        tool.SETTINGS
    )


@pytest.mark.extended  # the lab's generator and GPU stages
def test_the_k3_gpu_stages_dry_run_on_any_machine(tmp_path: Path) -> None:
    """``DRY_RUN=1 session.sh k3-deploy`` lists the planned boots (nothing installed, no GPU); ``k3-serve``
    plans its `vllm serve` boots first; the decode stage's engines are the deployment's three arms."""
    env = os.environ | {"DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    deploy = subprocess.run(["bash", "lab/gpu/session.sh", "k3-deploy"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert deploy.returncode == 0, deploy.stderr
    booted = [line.split()[2] for line in deploy.stdout.splitlines() if line.startswith("would boot")]
    assert len(booted) == 14 and "14 boots" in deploy.stdout
    assert sum("dspark8-llm-join-descending-plugin" in b for b in booted) == 3
    assert sum("dspark8-serve-join-descending-plugin" in b for b in booted) == 2
    assert sum(b.endswith("dspark8-llm-join-descending-vanilla") for b in booted) == 2
    assert any(b.endswith("vanilla-vllm-presize") for b in booted)
    for line in deploy.stdout.splitlines():
        if line.startswith("would boot") and "dspark8" in line:
            kwargs = json.loads(line.split(" ", 4)[4].rsplit(" env=", 1)[0])
            assert kwargs["speculative_config"]["num_speculative_tokens"] == 8
            assert kwargs["use_replayssm"] is True and kwargs["max_num_seqs"] == 48
    serve = subprocess.run(["bash", "lab/gpu/session.sh", "k3-serve"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    first = [line.split()[2] for line in serve.stdout.splitlines() if line.startswith("would boot")][:3]
    assert sorted(first) == sorted(["r0-kimi-k3-mxfp4-dspark8-llm-join-descending-vanilla",
                                    "r0-kimi-k3-mxfp4-dspark8-serve-join-descending-plugin",
                                    "r1-kimi-k3-mxfp4-dspark8-serve-join-descending-plugin"])  # fmt: skip
    decode = subprocess.run(["bash", "lab/gpu/session.sh", "k3-decode"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert decode.returncode == 0, decode.stderr
    engines = [line.split()[0] for line in decode.stdout.splitlines() if line.startswith("kimi-k3-mxfp4")]
    assert engines == ["kimi-k3-mxfp4-dspark8-plugin", "kimi-k3-mxfp4-dspark8-workaround-vanilla",
                       "kimi-k3-mxfp4-dspark8-vanilla-vllm-presize"]  # fmt: skip


@pytest.mark.extended  # the lab's generator and GPU stages
def test_the_k3_tensor_parallel_stage_dry_runs_at_the_machines_gpu_count(tmp_path: Path) -> None:
    """``DRY_RUN=1 session.sh k3-tp`` (no GPU here: the dry run's two) plans every boot at tensor parallel
    = the GPU count, the `vllm serve` boots with ``--tensor-parallel-size`` among them."""
    env = os.environ | {"DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path)}
    run = subprocess.run(["bash", "lab/gpu/session.sh", "k3-tp"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("would boot")]
    booted = [line.split()[2] for line in lines]
    assert len(booted) == 8 and all("-tp2-" in b for b in booted)
    assert sum(b.endswith("serve-join-descending-plugin") for b in booted) == 2
    assert sum(b.endswith("llm-join-descending-plugin") for b in booted) == 3
    assert sum(b.endswith("llm-join-descending-vanilla") for b in booted) == 3  # 2 stock + 1 workaround
    for line in lines:
        kwargs = json.loads(line.split(" ", 4)[4].rsplit(" env=", 1)[0])
        assert kwargs["tensor_parallel_size"] == 2 and kwargs["speculative_config"]["method"] == "dspark"
