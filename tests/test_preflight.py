"""``check -- <vllm serve arguments>`` against the real installed vLLM: its parser, config and manager.

Models are local folders holding only a config.json (no hub, no weights, no tokenizer). vLLM's registry
reads each architecture's inspection from the run's model-info cache (conftest's model_inspection_cache).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from configs import ARCHITECTURES, K3, KIMI_CRASH, KIMI_LINEAR_4_LAYERS, NO_WEIGHTS, QWEN3_0_6B, model_folder
from fakes import installed
from release import SIZES_STAGING

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
from stable import assert_says
from wrappers import is_patched, is_plugin_wrapper

import vllm_staging_plugin
from vllm_staging_plugin._offline import preflight, seams
from vllm_staging_plugin._offline.cli import main
from vllm_staging_plugin._offline.exits import Exit

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache")]

STOCK_CRASH = "The expanded size of the tensor (8) must match the existing size (9)"


def test_the_runs_model_cache_holds_every_architecture_the_tests_check(
    model_inspection_cache: list[str],
) -> None:
    """Else each first check of an architecture starts vLLM's inspection subprocess: slower, not wrong."""
    assert model_inspection_cache == ARCHITECTURES


def check_json(capsys: Any, *words: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "--json", "--", *words])
    return code, json.loads(capsys.readouterr().out)  # stdout holds the one object, vLLM logs go to stderr


@pytest.mark.usefixtures("offline")
def test_kimi_linear_crashes_stock_in_vllms_own_order_and_boots_patched(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    code, out = check_json(capsys, model, *NO_WEIGHTS, *KIMI_CRASH)
    assert code == Exit.OK  # boots and serves with the plugin (its KDA state-slot fix)
    assert out["architecture"] == "KimiLinearForCausalLM" and out["use_kda_recoverssm"] is True
    assert out["decode_query_len"] == 3
    assert out["sequence"] == {"PIECEWISE": [8, 4, 2, 1], "FULL": [9, 6, 3]}  # the same plan on 0.34.0
    assert out["capacity"] == 9
    if SIZES_STAGING:  # vLLM 0.34.0 sizes its staging itself: no crash, no workaround, nothing to upgrade to
        assert out["stock"]["ok"] is True and out["stock"]["buffers"]["hidden_states"]["shape"] == [9, 2304]
        assert out["identical_to_stock"] is True and out["fixed_in_vllm"] is None
        assert out["stock_workaround"] is None and out["vllm_version"] == "0.34.0"
    else:
        assert out["capture_sizes"] == [1, 2, 4, 8, 16]
        assert out["stock"]["ok"] is False and STOCK_CRASH in out["stock"]["error"]
        assert out["stock"]["allocated_by"] == "PIECEWISE num_tokens=8"
        assert out["stock"]["failed_at"].startswith("FULL num_tokens=9")
        assert out["identical_to_stock"] is None  # stock has nothing to compare against
        assert out["vllm_version"] == "0.33.0" and out["fixed_in_vllm"] == "0.34.0"
    assert out["plugin"] | {"captured": None} == out["plugin"] | {
        "ok": True, "error": None, "order": "descending", "failed_at": None, "captured": None,
    }  # fmt: skip
    assert out["plugin"]["buffers"]["hidden_states"]["shape"] == [9, 2304]
    assert out["staging_bytes"] == 9 * 2304 * 2  # bfloat16
    assert out["platform"]["emulated"] is True
    advice = out["serve"].pop("advice")
    assert out["serve"] == {
        "applies": True,
        "checked": True,
        "ok": False,  # stock vLLM's answer
        "plugin_ok": True,  # the plugin keeps one state slot per speculative token
        "fault_at_boot": SIZES_STAGING,  # 0.34.0's warm-up runs the step: stock dies at boot
        "error": None,
        "fix": {  # the arguments without --use-replayssm, checked again from the start
            "serve_arguments": [model, *(w for w in [*NO_WEIGHTS, *KIMI_CRASH] if w != "--use-replayssm")],
            "stock_boots": True,
            "plugin_boots": True,
            "serves": True,
        },
        "layer": "KimiGatedDeltaNetAttention",
        "builder": "GDNAttentionMetadataBuilder",
        "index_columns": 1,
        "query_length": 3,
        "kda_layers": 3,
        "extra_bytes_per_request_without_replayssm": 2 * 3 * (12288 * 5 * 2 + 32 * 128 * 128 * 4),
    }  # fmt: skip  conv (3 x 32 x 128, 3 + 2) bf16 and recurrent (32, 128, 128) float32 per slot and layer
    assert advice[0].startswith("serving: stock vLLM's shared KDA layer") and len(advice) == 5
    assert advice[2].startswith("  with the plugin: fixed, it serves (the layer keeps one state slot per")
    assert (
        advice[3].startswith("  without the plugin: drop --use-replayssm")
        and "patch vLLM with the diff `vllm-staging-plugin patch kda` prints" in advice[3]
    )
    assert (
        advice[4].strip()
        == "(without --use-replayssm: checked again, it serves and stock vLLM and the plugin boot it)"
    )
    assert out["answered"] is True and out["unanswered"] == []
    if SIZES_STAGING:
        return
    fix = out["stock_workaround"]  # the grid gets stock vLLM through the capture, not through serving
    assert fix["verified"] is True and "--use-replayssm" in fix["serve_arguments"]
    assert (fix["fixes"], fix["serves"]) == ("boot only: the serving fault stays (see serve)", False)


@pytest.mark.usefixtures("offline")
def test_with_the_kda_fix_turned_off_it_will_not_serve(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 4 stays for a plugin that does not apply the KDA fix (STAGING_PLUGIN_KDA_FIX=off); a value
    outside on/off is a bad argument naming the variable."""
    model = model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    monkeypatch.setenv("STAGING_PLUGIN_KDA_FIX", "off")
    code, out = check_json(capsys, model, *NO_WEIGHTS, *KIMI_CRASH)
    assert code == Exit.WILL_NOT_SERVE == 4
    assert (out["serve"]["ok"], out["serve"]["plugin_ok"]) == (False, False)
    advice = out["serve"]["advice"]
    assert advice[0].startswith("WARNING serving: stock vLLM's shared KDA layer")
    assert (
        advice[2]
        == "  with the plugin: NOT fixed (its KDA state-slot fix is off: STAGING_PLUGIN_KDA_FIX=off)"
    )
    monkeypatch.setenv("STAGING_PLUGIN_KDA_FIX", "maybe")
    assert main(["check", "--", model, *NO_WEIGHTS, *KIMI_CRASH]) == Exit.BAD_INPUT
    err = capsys.readouterr().err
    assert_says(err, "vllm-staging-plugin check: bad arguments: STAGING_PLUGIN_KDA_FIX='maybe'",
                "allowed values: on, off")  # fmt: skip


@pytest.mark.usefixtures("offline", "kda_fixed_vllm")
def test_on_vllm_with_the_kda_patch_the_serving_warning_is_gone(tmp_path: Path, capsys: Any) -> None:
    code, out = check_json(
        capsys, model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS), *NO_WEIGHTS, *KIMI_CRASH
    )
    assert code == Exit.OK
    assert out["serve"]["ok"] is True and (out["serve"]["index_columns"], out["serve"]["query_length"]) == (
        3,
        3,
    )


@pytest.mark.usefixtures("offline")
def test_a_serving_check_that_cannot_be_made_is_said_not_fatal(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_staging_plugin._offline import seams

    def changed(vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        raise seams.SeamChanged("KimiDecoderLayer built no Mamba layer for KDA layer 0\nmore")

    monkeypatch.setattr(seams, "kda_mixed_step", changed)
    model = model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    code, out = check_json(capsys, model, *NO_WEIGHTS, *KIMI_CRASH)
    assert code == Exit.NOT_ANSWERED == 5  # it boots with the plugin; whether it serves is open
    said = "SeamChanged: KimiDecoderLayer built no Mamba layer for KDA layer 0"  # the first line only
    assert out["serve"] == {"applies": None, "checked": False, "ok": None, "plugin_ok": None, "error": said,
                            "fix": None, "advice": [f"serving: NOT CHECKED here ({said})"]}  # fmt: skip
    assert out["answered"] is False and out["unanswered"] == [
        f"serving (vLLM's shared KDA layer on a step mixing a speculative decode with a prefill): {said}"
    ]
    if not SIZES_STAGING:  # 0.34.0: stock boots the staging, no workaround to qualify
        assert (out["stock_workaround"]["fixes"], out["stock_workaround"]["serves"]) == ("boot", None)
    assert main(["check", "--", model, *NO_WEIGHTS, *KIMI_CRASH]) == Exit.NOT_ANSWERED
    text = capsys.readouterr().out
    assert f"serving: NOT CHECKED here ({said})" in text
    if not SIZES_STAGING:
        assert "  whether it then serves was not checked here (see serving above)" in text
    assert text.rstrip().endswith(
        "NOT ANSWERED here (the report above is incomplete):\n  serving (vLLM's shared KDA layer on a step "
        f"mixing a speculative decode with a prefill): {said}"
    )


@pytest.mark.usefixtures("offline")
def test_the_crash_needs_recover_ssm(tmp_path: Path, capsys: Any) -> None:
    """Control: the same arguments without --use-replayssm keep PIECEWISE 16 first, and stock boots."""
    words = [w for w in KIMI_CRASH if w != "--use-replayssm"]
    code, out = check_json(capsys, model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS), *NO_WEIGHTS, *words)
    assert code == 0 and out["use_kda_recoverssm"] is False
    assert out["serve"]["ok"] is True and (out["serve"]["index_columns"], out["serve"]["query_length"]) == (
        3,
        3,
    )
    assert out["sequence"]["PIECEWISE"][0] == 16 and out["capacity"] == 16
    assert out["stock"]["ok"] is True and out["identical_to_stock"] is True


@pytest.mark.usefixtures("offline")
def test_qwen3_stock_boots_with_identical_buffers(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, *NO_WEIGHTS, "--max-num-seqs", "8"]) == 0
    text = capsys.readouterr().out
    # vLLM derives the grid itself: max size min(max_num_seqs x 2, 512) = 16
    assert "config: FULL_AND_PIECEWISE, capture sizes 1, 2, 4, 8, 16, max_num_seqs 8" in text
    assert "  capacity   16 rows" in text
    assert "stock vLLM (its own order): boots (hidden_states [16, 1024] bfloat16 = 0.03 MiB)" in text
    assert "with the plugin (order descending): boots, 16-row buffers; buffers identical to stock" in text


@pytest.mark.usefixtures("offline")
def test_another_order_boots_patched(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
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
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, "--max-num-seqs", "many"]) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'" in err


@pytest.mark.usefixtures("offline")
def test_bad_configuration_exits_2_with_vllms_message(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
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
        code, out = check_json(capsys, model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    finally:
        registry._try_inspect_model_cls.cache_clear()
    assert code == 3 and out["error"] == "cannot check on this machine"
    assert "cannot inspect the model class on this machine" in out["message"]
    assert "run the check on the GPU host" in out["message"]


def _process_state() -> dict[str, Any]:
    """What an in-process pre-flight must leave exactly as it found it."""
    import vllm.platforms

    cls = seams.cudagraph_module().ModelCudaGraphManager
    process = installed()
    fixes = process.fixes if process is not None else ()
    return {
        "environ": dict(os.environ),
        "meta_path": [id(finder) for finder in sys.meta_path],
        "installed": id(process),
        "installer": None if process is None else (process.installed, [id(fix) for fix in fixes]),
        "fixes": [(id(f.wrap), f.wrap and f.wrap.live, f.suspended) for f in fixes],
        "staging": [f.vllm_sizes_staging for f in fixes if hasattr(f, "vllm_sizes_staging")],
        "class": {name: id(cls.__dict__[name]) for name in ("__init__", "capture")},
        "plugin_wrappers": [is_plugin_wrapper(cls.__dict__[name]) for name in ("__init__", "capture")],
        "platform": id(vllm.platforms.current_platform),
        "bindings": {name: id(vars(module)["current_platform"]) for name, module in list(sys.modules.items())
                     if name.startswith("vllm.") and "current_platform" in vars(module)},
        "modules": {name: id(module) for name, module in list(sys.modules.items())},
        "patched": {name: {k: id(v) for k, v in vars(sys.modules[name]).items()}
                    for name in PATCHED_MODULES if name in sys.modules},
        "globals": {name: {k: id(vars(module)[k]) for k in ("HAS_TRITON", "PIN_MEMORY") if k in vars(module)}
                    for name, module in list(sys.modules.items()) if name.startswith("vllm.")},
        "classes": [dict(vars(c)) for c in (type(vllm.platforms.current_platform), cls,
                                            seams.cudagraph_module().CudaGraphManager)],
    }  # fmt: skip


# The modules whose globals the offline seams set for a block (every name compared by identity).
PATCHED_MODULES = ("vllm.v1.worker.gpu.cudagraph_utils", "vllm._custom_ops", "vllm.platforms",
                   "vllm.models.kimi_k3.nvidia.model", "vllm.config.vllm")  # fmt: skip


def assert_left_as_found(before: dict[str, Any], after: dict[str, Any]) -> None:
    """``after`` equals ``before`` except for modules first imported in between (kept, as imports are),
    none of them a stand-in the check made for vLLM's CUDA kernel libraries."""
    added = set(after["modules"]) - set(before["modules"])
    assert not added & {*seams.platform.NATIVE_OP_MODULES, "vllm.platforms.cuda"}
    by_module = ("modules", "bindings", "globals", "patched")
    for key in by_module:
        assert {k: v for k, v in after[key].items() if k not in added} == before[key], key
    assert {k: v for k, v in after.items() if k not in by_module} == {
        k: v for k, v in before.items() if k not in by_module
    }


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize("registered", [False, True], ids=["unregistered", "registered"])
@pytest.mark.parametrize(
    ("config", "argv"),
    [(QWEN3_0_6B, ["--max-num-seqs", "4"]), (K3, KIMI_CRASH)],
    ids=["qwen3", "kimi-k3-4l-stock-crash"],
)
def test_an_in_process_preflight_leaves_the_process_as_it_found_it(
    config: dict[str, Any], argv: list[str], registered: bool, tmp_path: Path
) -> None:
    """os.environ (vLLM's VLLM_USE_BREAKABLE_CUDAGRAPH=1 undone), sys.meta_path, the process installer (the
    real class keeps the installer's own wrappers when register() ran before) and every vLLM module's
    ``current_platform`` binding, while the check emulated a CUDA platform and replayed both arms."""
    import vllm.platforms

    machine = vllm.platforms.current_platform
    if registered:
        vllm_staging_plugin.register()
        assert is_patched(seams.cudagraph_module().ModelCudaGraphManager)
    before = _process_state()
    result = preflight.run([model_folder(tmp_path / "model", config), *NO_WEIGHTS, *argv])
    after = _process_state()
    assert result.plugin_boots and result.platform["emulated"] is not machine.is_cuda_alike()
    assert before["bindings"]
    assert_left_as_found(before, after)
    assert set(after["bindings"].values()) <= {id(machine)}  # modules first imported during the check too
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


def test_a_vllm_without_the_serve_parser_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.setattr(preflight, "has_serve_parser", lambda: False)
    assert main(["check", "--", model_folder(tmp_path / "qwen3", QWEN3_0_6B)]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert_says(line, "vllm-staging-plugin check: cannot check on this machine",
                "vllm.entrypoints.common.cli_args", "the plugin itself runs on 0.18.0 and later")  # fmt: skip


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
    assert_says(out["message"], f"model {model!r}: no such folder", "config.json")
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
    code, out = check_json(capsys, model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    assert code == 3 and out["error"] == "cannot check on this machine"
    assert out["message"].startswith("building the configuration asks vLLM's CUDA kernel library")
    assert "some_new_capability_query" in out["message"] and "run the check on the GPU host" in out["message"]


@pytest.mark.usefixtures("offline")
def test_a_check_option_after_the_separator_is_pointed_back_before_it(tmp_path: Path, capsys: Any) -> None:
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    assert main(["check", "--", model, *NO_WEIGHTS, "--order", "ascending"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --order ascending" in err
    assert "(--order: options of the check go before `--`)" in err


def test_a_phase_inside_another_is_counted_as_its_own() -> None:
    import time

    from vllm_staging_plugin._offline.preflight.phases import Phases

    phases = Phases()
    started = time.perf_counter()
    with phases.phase("configure"):
        time.sleep(0.05)
        with phases.phase("inspect"):
            time.sleep(0.1)
    wall = time.perf_counter() - started
    seconds = phases.seconds
    assert seconds["inspect"] >= 0.1 and seconds["configure"] >= 0.05
    assert abs(seconds["inspect"] + seconds["configure"] - wall) < 0.01  # each second counted once


@pytest.mark.usefixtures("offline")
def test_every_tool_path_leaves_the_process_as_it_found_it(tmp_path: Path, capsys: Any) -> None:
    """Through the command line: a check that emulates the GPU and replays staging, the main job, and a
    check that also builds vLLM's KDA metadata on CPU; each leaves the process as the in-process check
    above does."""
    kimi = model_folder(tmp_path / "kimi", KIMI_LINEAR_4_LAYERS)
    runs = {
        "check": ["check", "--json", "--", model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS],
        "main job": [],
        "check, KDA": ["check", "--json", "--", kimi, *NO_WEIGHTS, *KIMI_CRASH],
    }
    for argv in runs.values():
        before = _process_state()
        main(argv)
        assert_left_as_found(before, _process_state())
        capsys.readouterr()


def break_one_arm(monkeypatch: pytest.MonkeyPatch, plugin: bool) -> None:
    """One arm's capture (the plugin's, or stock's) raises what is neither vLLM's staging copy nor the
    plugin refusing: that replay breaks, the other runs as it would."""
    from vllm_staging_plugin._offline import seams
    from vllm_staging_plugin._offline.cpu_replay import run

    real = seams.capture_on_cpu

    def breaks(manager: Any, *args: Any, **kwargs: Any) -> None:
        if ("_vllm_staging" in vars(manager)) == plugin:  # the plugin's state marks its arm
            raise TypeError("capture() got an unexpected keyword argument 'attn_groups'")
        real(manager, *args, **kwargs)

    monkeypatch.setattr(run.seams, "capture_on_cpu", breaks)


@pytest.mark.usefixtures("offline")
def test_a_plugin_replay_that_breaks_answers_nothing_and_exits_5(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not vLLM's staging copy and not the plugin refusing: the replay itself broke, so the plugin's
    'does not boot' would be a guess; exit 5 and the gap named."""
    break_one_arm(monkeypatch, plugin=True)
    code, out = check_json(capsys, model_folder(tmp_path / "qwen3", QWEN3_0_6B), *NO_WEIGHTS)
    assert code == Exit.NOT_ANSWERED and out["plugin"]["ok"] is False
    assert out["stock"]["ok"] is True and out["answered"] is False
    assert out["unanswered"] == [
        "with the plugin at pipeline stage 0: the replay broke (TypeError: capture() got an unexpected "
        "keyword argument 'attn_groups')"
    ]


@pytest.mark.usefixtures("offline")
def test_a_stock_replay_that_breaks_is_named_unanswered_and_exits_5(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin boots it, but stock vLLM's answer is a broken replay, not a crash: the report says so
    instead of "crashes at capture", no workaround is searched on it, and the exit code is 5 as
    ``answered: false`` says."""
    break_one_arm(monkeypatch, plugin=False)
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    code, out = check_json(capsys, model, *NO_WEIGHTS)
    assert code == Exit.NOT_ANSWERED and out["answered"] is False
    assert out["plugin"]["ok"] is True and out["stock"]["ok"] is False
    assert out["stock_workaround"] is None and out["fixed_in_vllm"] is None
    assert out["unanswered"] == [
        "stock vLLM at pipeline stage 0: the replay broke (TypeError: capture() got an unexpected "
        "keyword argument 'attn_groups')"
    ]
    assert main(["check", "--", model, *NO_WEIGHTS]) == Exit.NOT_ANSWERED
    text = capsys.readouterr().out
    assert "stock vLLM (its own order): NOT ANSWERED here, the replay broke (TypeError" in text
    assert "crashes at capture" not in text


NOT_LOADED = [  # --speculative-config values whose `model` vLLM does not load as a model
    {"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
    {"model": "ngram", "num_speculative_tokens": 2},
    {"method": "ngram", "model": "org/any-name", "num_speculative_tokens": 2},
    {"method": "ngram_gpu", "model": "org/any-name", "num_speculative_tokens": 2},
    {"method": "extract_hidden_states", "model": "org/any-name", "num_speculative_tokens": 1},
]
PROPOSER = {"model": "my_pkg.MyProposer", "num_speculative_tokens": 2}  # a class on 0.29.0-0.33.0


@pytest.mark.usefixtures("model_inspection_cache")
@pytest.mark.parametrize("spec", [*NOT_LOADED, PROPOSER], ids=lambda s: f"{s.get('method')}-{s['model']}")
def test_the_drafter_is_checked_exactly_when_vllm_loads_its_name_as_a_model(
    spec: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own SpeculativeConfig, with the hub offline: where it builds the configuration without
    loading ``model`` the pre-flight leaves the name alone; where it loads it (an EAGLE3 folder; on 0.34.0
    a dotted name too, which it tries as a hub id) the pre-flight checks it."""
    import huggingface_hub.constants
    from vllm_configs import vllm_config

    from vllm_staging_plugin._offline.preflight import model_source
    from vllm_staging_plugin._offline.preflight.refusals import BadArguments

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model = model_folder(tmp_path / "qwen3", QWEN3_0_6B)
    drafter = {"method": "eagle3", "model": model, "num_speculative_tokens": 2}
    eagle = vllm_config(model, "--speculative-config", json.dumps(drafter)).speculative_config
    assert eagle.draft_model_config.model == model and model_source.draft_model(drafter) == (model, None)
    try:
        built = vllm_config(model, "--speculative-config", json.dumps(spec)).speculative_config
    except BadArguments as exc:  # vLLM tried `model` as a hub id: the pre-flight checks it first
        assert spec is PROPOSER and "Invalid repository ID" in str(exc)
        assert model_source.draft_model(spec) == (spec["model"], None)
        return
    assert built.draft_model_config is None or built.draft_model_config.model != spec["model"]
    assert model_source.draft_model(spec) is None


def test_a_module_vllm_cannot_import_is_named_with_its_pip_command_wherever_it_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The platform stage or any other: a missing distribution is advice to install it, not the GPU host."""
    from vllm_staging_plugin._offline import preflight
    from vllm_staging_plugin._offline.preflight.missing import vllm_requirement

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError("No module named 'compressed_tensors'", name="compressed_tensors")

    monkeypatch.setattr(preflight, "run", fails)
    assert preflight.main(["./model"], order=None, as_json=False) == Exit.CANNOT_CHECK
    err = capsys.readouterr().err
    requirement = vllm_requirement("compressed_tensors")
    assert requirement is not None and f"pip install '{requirement}'" in err and "GPU host" not in err
