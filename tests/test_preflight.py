"""``check -- <vllm serve arguments>`` against the real installed vLLM: its parser, config and manager.

Models are local folders holding only a config.json (no hub, no weights, no tokenizer). The first
inspection of an architecture runs vLLM's own registry subprocess; later runs read its model-info cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from configs import QWEN3_0_6B

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")

from vllm_staging_plugin._offline import preflight
from vllm_staging_plugin._offline.cli import main

pytestmark = pytest.mark.contract

# Kimi-Linear-48B-A3B's config.json shape, cut to 4 layers (3 KDA, 1 MLA) and 32 experts
KIMI_LINEAR_4_LAYERS = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 163840,
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 72, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "moe_intermediate_size": 1024, "num_experts": 32, "num_experts_per_token": 4, "num_shared_experts": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446, "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 128,
                           "num_heads": 32, "short_conv_kernel_size": 4},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 163584, "eos_token_id": 163585,
}  # fmt: skip
NO_WEIGHTS = ["--load-format", "dummy", "--skip-tokenizer-init"]
KIMI_CRASH = [  # issue 10's configuration: n-gram 2 tokens, recover-SSM, 4 sequences, an operator-set grid
    "--max-num-seqs", "4", "--use-replayssm",
    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}',
    "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}',
]  # fmt: skip
STOCK_CRASH = "The expanded size of the tensor (8) must match the existing size (9)"


def model_dir(root: Path, config: dict[str, Any]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return str(root)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def check_json(capsys: Any, *words: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "--json", "--", *words])
    return code, json.loads(capsys.readouterr().out)  # stdout holds the one object, vLLM logs go to stderr


@pytest.mark.usefixtures("offline")
def test_kimi_linear_crashes_stock_in_vllms_own_order_and_boots_patched(tmp_path: Path, capsys: Any) -> None:
    code, out = check_json(
        capsys, model_dir(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS), *NO_WEIGHTS, *KIMI_CRASH
    )
    assert code == 0
    assert out["architecture"] == "KimiLinearForCausalLM" and out["use_kda_recoverssm"] is True
    assert out["decode_query_len"] == 3 and out["capture_sizes"] == [1, 2, 4, 8, 16]
    assert out["sequence"] == {"PIECEWISE": [8, 4, 2, 1], "FULL": [9, 6, 3]}
    assert out["capacity"] == 9
    assert out["stock"]["ok"] is False and STOCK_CRASH in out["stock"]["error"]
    assert out["stock"]["allocated_by"] == "PIECEWISE num_tokens=8"
    assert out["stock"]["failed_at"].startswith("FULL num_tokens=9")
    assert out["plugin"] | {"captured": None} == out["plugin"] | {
        "ok": True, "error": None, "order": "descending", "failed_at": None, "captured": None,
    }  # fmt: skip
    assert out["plugin"]["buffers"]["hidden_states"]["shape"] == [9, 2304]
    assert out["staging_bytes"] == 9 * 2304 * 2  # bfloat16
    assert out["vllm_version"] == "0.33.0" and out["platform"]["emulated"] is True
    assert out["identical_to_stock"] is None  # stock has nothing to compare against


@pytest.mark.usefixtures("offline")
def test_the_crash_needs_recover_ssm(tmp_path: Path, capsys: Any) -> None:
    """Control: the same arguments without --use-replayssm keep PIECEWISE 16 first, and stock boots."""
    words = [w for w in KIMI_CRASH if w != "--use-replayssm"]
    code, out = check_json(capsys, model_dir(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS), *NO_WEIGHTS, *words)
    assert code == 0 and out["use_kda_recoverssm"] is False
    assert out["sequence"]["PIECEWISE"][0] == 16 and out["capacity"] == 16
    assert out["stock"]["ok"] is True and out["identical_to_stock"] is True


@pytest.mark.usefixtures("offline")
def test_qwen3_stock_boots_with_identical_buffers(tmp_path: Path, capsys: Any) -> None:
    model = model_dir(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, *NO_WEIGHTS, "--max-num-seqs", "8"]) == 0
    text = capsys.readouterr().out
    # vLLM derives the grid itself: max size min(max_num_seqs x 2, 512) = 16
    assert "config: FULL_AND_PIECEWISE, capture sizes 1, 2, 4, 8, 16, max_num_seqs 8" in text
    assert "  capacity   16 rows" in text
    assert "stock vLLM (its own order): boots (hidden_states [16, 1024] bfloat16 = 0.03 MiB)" in text
    assert "with the plugin (order descending): boots, 16-row buffers; buffers identical to stock" in text


@pytest.mark.usefixtures("offline")
def test_another_order_boots_patched(tmp_path: Path, capsys: Any) -> None:
    model = model_dir(tmp_path / "qwen3", QWEN3_0_6B)
    code, out = check_json(capsys, model, *NO_WEIGHTS, "--max-num-seqs", "8")
    assert code == 0
    assert (
        main(["check", "--order", "ascending", "--json", "--", model, *NO_WEIGHTS, "--max-num-seqs", "8"])
        == 0
    )
    asc = json.loads(capsys.readouterr().out)
    assert asc["plugin"]["order"] == "ascending" and asc["identical_to_stock"] is None
    assert asc["plugin"]["captured"] == {mode: sorted(ns) for mode, ns in out["sequence"].items()}
    assert asc["plugin"]["allocated_by"] == "PIECEWISE num_tokens=1"
    assert asc["plugin"]["buffers"] == out["plugin"]["buffers"]  # capacity rows whatever the order
    assert asc["sequence"] == out["sequence"]  # the plan is vLLM's own order either way


@pytest.mark.usefixtures("offline")
def test_bad_serve_argument_exits_2_with_vllms_message(tmp_path: Path, capsys: Any) -> None:
    model = model_dir(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, "--max-num-seqs", "many"]) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'" in err


@pytest.mark.usefixtures("offline")
def test_bad_configuration_exits_2_with_vllms_message(tmp_path: Path, capsys: Any) -> None:
    model = model_dir(tmp_path / "qwen3", QWEN3_0_6B)
    code, out = check_json(capsys, model, *NO_WEIGHTS, "-cc", '{"cudagraph_mode": "SIDEWAYS"}')
    assert code == 2 and out["error"] == "bad arguments" and "SIDEWAYS" in out["message"]


def test_bad_order_exits_2(capsys: Any) -> None:
    assert main(["check", "--order", "zigzag", "--", "unused"]) == 2
    assert "--order 'zigzag': unknown order policy" in capsys.readouterr().err


@pytest.mark.usefixtures("offline")
def test_an_architecture_vllm_cannot_inspect_here_exits_3(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's registry failing to import a model class (as Kimi-Linear did without compressed-tensors)."""
    from vllm.model_executor.models import registry

    def cannot_import(self: Any) -> Any:
        raise ImportError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(registry._LazyRegisteredModel, "inspect_model_cls", cannot_import)
    registry._try_inspect_model_cls.cache_clear()
    try:
        code, out = check_json(capsys, model_dir(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    finally:
        registry._try_inspect_model_cls.cache_clear()
    assert code == 3 and out["error"] == "cannot check on this machine"
    assert "cannot inspect the model class on this machine" in out["message"]
    assert "run the check on the GPU host" in out["message"]


@pytest.mark.usefixtures("offline")
def test_the_machine_is_left_as_it_was(tmp_path: Path, capsys: Any) -> None:
    import vllm.config.vllm as config_module
    import vllm.platforms

    machine = vllm.platforms.current_platform
    env = dict(os.environ)
    assert main(["check", "--json", "--", model_dir(tmp_path / "q", QWEN3_0_6B), *NO_WEIGHTS,
                 "--max-num-seqs", "4"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["platform"]["emulated"] is not machine.is_cuda_alike()
    assert vllm.platforms.current_platform is machine and config_module.current_platform is machine
    assert dict(os.environ) == env  # vLLM's VLLM_USE_BREAKABLE_CUDAGRAPH=1 and the plugin's variables undone
    if not machine.is_cuda_alike():
        assert "vllm.platforms.cuda" not in sys.modules  # later imports fail as before the check


def test_the_emulated_platform_is_vllms_cuda_platform() -> None:
    from vllm.platforms.interface import PlatformEnum

    platform = preflight.platform.emulated_platform(preflight.GPUS["a100"])
    assert type(platform).__mro__[1].__module__ == "vllm.platforms.cuda"
    assert platform._enum == PlatformEnum.CUDA and platform.device_type == "cuda"
    assert platform.support_static_graph_mode() and platform.is_cuda()
    assert platform.get_device_name() == "NVIDIA A100-SXM4-80GB" and platform.has_device_capability(80)
    assert not platform.has_device_capability(90)


@pytest.mark.subprocess
def test_console_script_end_to_end(tmp_path: Path) -> None:
    """The installed entry point, a fresh process, the decisive configuration, text output."""
    script = Path(sys.executable).with_name("vllm-staging-plugin")
    model = model_dir(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGING_PLUGIN", "VLLM_PLUGINS"))}
    proc = subprocess.run(
        [str(script), "check", "--", model, *NO_WEIGHTS, *KIMI_CRASH],
        env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "  PIECEWISE    4 descriptors, num_tokens 8, 4, 2, 1" in out
    assert "  FULL         3 descriptors, num_tokens 9, 6, 3" in out
    assert "stock vLLM (its own order): crashes at capture" in out and STOCK_CRASH in out
    assert "  allocated by  PIECEWISE num_tokens=8" in out
    assert "  did not fit   FULL num_tokens=9 (uniform decode 3 x 3)" in out
    assert "with the plugin (order descending): boots, 9-row buffers" in out
    assert "INFO" not in out  # vLLM's log lines went to stderr


def test_a_bad_order_variable_is_named_as_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "zigzag")
    assert main(["check", "--json", "--", "unused"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "bad arguments" and out["message"].startswith("STAGING_PLUGIN_ORDER='zigzag': ")


@pytest.mark.parametrize("model", ["/nonexistent/model", "./missing-model", "~/missing-model-folder"])
def test_a_missing_model_folder_is_one_line_and_exit_2(
    model: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what docs/preflight.md suggests
    assert main(["check", "--json", "--", model]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # one JSON object on stdout, never a traceback
    assert out["exit_code"] == 2 and out["error"] == "bad arguments"
    assert (
        out["message"]
        == f"model {model!r}: no such folder (a local model is a folder holding its config.json)"
    )
    assert "Traceback" not in captured.err


def test_a_file_given_as_the_model_says_so(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")
    assert main(["check", "--", str(config)]) == 2
    assert "a file, not a model folder" in capsys.readouterr().err


def test_a_model_without_the_separator_gets_the_right_form(capsys: Any) -> None:
    assert main(["check", "./kimi-linear", "--max-num-seqs", "4"]) == 2
    err = capsys.readouterr().err
    assert "'./kimi-linear' looks like a model" in err
    assert "as in: vllm-staging-plugin check [options] -- MODEL [vllm serve arguments]" in err


@pytest.mark.usefixtures("offline")
def test_a_question_to_vllms_missing_kernel_library_exits_3_naming_it(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a config-time query of an op vLLM's CUDA build registers (torch.ops._C.x) raises here."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    def asks_the_kernel_library(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'_OpNamespace' '_C' object has no attribute 'some_new_capability_query'")

    monkeypatch.setattr(AsyncEngineArgs, "create_engine_config", asks_the_kernel_library)
    code, out = check_json(capsys, model_dir(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    assert code == 3 and out["error"] == "cannot check on this machine"
    assert out["message"].startswith("building the configuration asks vLLM's CUDA kernel library")
    assert "some_new_capability_query" in out["message"] and "run the check on the GPU host" in out["message"]


def test_the_cutlass_capability_answers_follow_vllms_cuda_build() -> None:
    answers = preflight.platform._kernel_queries()
    fp8, block, fp4 = (answers[f"cutlass_scaled_mm_supports_{k}"] for k in ("fp8", "block_fp8", "fp4"))
    assert [fp8(c) for c in (80, 86, 89, 90, 100)] == [False, False, True, True, True]
    assert [block(c) for c in (89, 90, 100, 120)] == [False, True, True, True]
    assert [fp4(c) for c in (90, 100, 120)] == [False, True, True]


@pytest.mark.usefixtures("offline")
def test_a_check_option_after_the_separator_is_pointed_back_before_it(tmp_path: Path, capsys: Any) -> None:
    model = model_dir(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, *NO_WEIGHTS, "--order", "ascending"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --order ascending" in err
    assert "(--order: options of the check go before `--`)" in err
