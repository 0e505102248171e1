"""Contract tests of ``_offline/seams/`` against the installed vLLM: each private it reaches still answers
as its docstring says, and the process is left as it was found. CI runs them on every release it covers
(lab/compat_matrix.py's, the installed 0.33.0 and 0.34.0); the pre-flight's seams need the parser the
pre-flight uses (``vllm.entrypoints.common.cli_args``) and skip without it."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from atlas import probes
from atlas.releases import SUPPORTED, span
from configs import K3_4_LAYERS, KIMI_LINEAR_4_LAYERS, QWEN3_0_6B, model_folder
from release import SIZES_STAGING
from stable import assert_says
from vllm_configs import NGRAM_8, preflight_release, vllm_config

from vllm_staging_plugin._offline import seams
from vllm_staging_plugin._offline.preflight import arguments

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache", "offline")]


RELEASE = re.sub(r"^(\d+\.\d+\.\d+).*", r"\1", importlib.import_module("vllm").__version__)


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory: pytest.TempPathFactory) -> str:
    return model_folder(tmp_path_factory.mktemp("kimi"), KIMI_LINEAR_4_LAYERS)


@preflight_release
def test_the_kda_layer_is_the_one_vllms_kimi_decoder_builds(kimi_linear: str, tmp_path: Path) -> None:
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import KimiGatedDeltaNetAttention
    from vllm.models.kimi_k3.nvidia import model
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    before = dict(vars(model))
    assert seams.kda_layer_class(vllm_config(kimi_linear)) is KimiGatedDeltaNetAttention
    assert seams.kda_layer_class(vllm_config(str(K3_4_LAYERS))) is KimiK3DeltaAttention  # full-rank gate
    assert seams.kda_layer_class(vllm_config(model_folder(tmp_path / "qwen", QWEN3_0_6B))) is None
    assert vars(model) == before  # every recorder put back


@preflight_release
def test_the_model_class_is_the_one_vllms_registry_resolves(kimi_linear: str, tmp_path: Path) -> None:
    models = (kimi_linear, str(K3_4_LAYERS), model_folder(tmp_path / "qwen", QWEN3_0_6B))
    resolved = [seams.model_class(vllm_config(model)).__name__ for model in models]
    assert resolved == ["KimiLinearForCausalLM", "KimiK3ForConditionalGeneration", "Qwen3ForCausalLM"]


@preflight_release
def test_a_decode_beside_a_prefill_gets_one_column_under_replayssm(kimi_linear: str) -> None:
    """vLLM 0.33.0: one state slot per request (num_speculative_blocks 0) and the generic GDN builder's
    mixed branch slices it as it is, so the kernel's 9 index words meet a 1-column index."""
    import vllm.utils.torch_utils as torch_utils

    pinned = torch_utils.PIN_MEMORY
    step = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    assert step == seams.KdaMixedStep(
        layer="KimiGatedDeltaNetAttention",
        builder="GDNAttentionMetadataBuilder",
        index_columns=1,
        query_length=9,
        kda_layers=3,
        slot_bytes=12288 * 11 * 2 + 32 * 128 * 128 * 4,
    )  # fmt: skip  conv state (3 x 32 x 128, 3 + 8) bf16 + recurrent state (32, 128, 128) float32
    assert step.faults and step.extra_bytes_per_request == 8 * 3 * step.slot_bytes
    assert torch_utils.PIN_MEMORY is pinned


@preflight_release
def test_without_replayssm_the_index_covers_the_query(kimi_linear: str) -> None:
    step = seams.kda_mixed_step(vllm_config(kimi_linear, *NGRAM_8))
    assert step is not None and (step.index_columns, step.query_length) == (9, 9) and not step.faults


@preflight_release
def test_tensor_parallel_ranks_hold_a_share_of_the_state(kimi_linear: str) -> None:
    one = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    two = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", "-tp", "2", *NGRAM_8))
    assert one is not None and two is not None and two.slot_bytes * 2 == one.slot_bytes


@preflight_release
def test_not_applicable_without_speculation_or_to_kimi_k3(kimi_linear: str) -> None:
    assert seams.kda_mixed_step(vllm_config(kimi_linear, "--max-num-seqs", "48")) is None
    assert seams.kda_mixed_step(vllm_config(str(K3_4_LAYERS), "--use-replayssm", *NGRAM_8)) is None


@pytest.mark.usefixtures("kda_fixed_vllm")
@preflight_release
def test_on_vllm_with_the_kda_patch_the_index_covers_the_query(kimi_linear: str) -> None:
    step = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    assert step is not None and step.layer == "KimiGatedDeltaNetAttention"
    assert (step.index_columns, step.query_length) == (9, 9) and not step.faults


@pytest.mark.skipif(arguments.has_serve_parser(), reason="this vLLM has the parser the pre-flight builds on")
def test_without_the_serve_parser_the_check_says_what_it_needs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On a release the plugin supports but the pre-flight does not (before 0.33.0): exit 3, one line
    naming the parser, not advice to move to a GPU host."""
    from vllm_staging_plugin._offline.cli import main

    assert main(["check", "--json", "--", model_folder(tmp_path / "qwen", QWEN3_0_6B)]) == 3
    out = json.loads(capsys.readouterr().out)
    assert_says(out["message"], "the check builds on the `vllm serve` parser of vLLM 0.33.0 and later",
                arguments.PARSER_MODULE, f"vLLM {RELEASE} lacks")  # fmt: skip


# Each release's answers, pinned from the releases themselves (lab/compat_matrix.py runs this file on
# every supported one): the first release with each manager knob, with the uniform decode sizes in the
# derived grid, and with the 1024 ceiling on data-centre Blackwell.
KNOB_SINCE = {"intermediate_tensors": "0.19.0", "lora_capture_cases": "0.24.0", "dense_schedule": "0.25.0",
              "varlen_decode": "0.28.0", "dbo": "0.30.0", "kda_recoverssm": "0.30.0"}  # fmt: skip
UNIFORM_DECODE_SIZES_SINCE, BLACKWELL_1024_SINCE, SPLIT_SIZES_SINCE = "0.29.0", "0.28.0", "0.34.0"


def has_since(first: str) -> bool:
    """The installed release is ``first`` or a later one of the releases this repository knows."""
    return RELEASE in span(f"{first}-{SUPPORTED[-1]}")


pinned_release = pytest.mark.skipif(RELEASE not in SUPPORTED, reason=f"no answers pinned for vLLM {RELEASE}")


@pinned_release
def test_the_derived_grid_is_vllms_own_and_carries_its_decode_sizes() -> None:
    """vLLM's ``_set_cudagraph_sizes`` on a config with no explicit sizes: the default steps, and on
    releases that do so, with speculative decoding the uniform-decode sizes (multiples of 1 + tokens)."""

    plain = probes.derived_capture_sizes(max_num_seqs=256)
    assert plain[:4] == [1, 2, 4, 8] and plain[-1] == 512 and plain == sorted(plain)
    speculative = probes.derived_capture_sizes(max_num_seqs=6, num_speculative_tokens=4)
    if has_since(SPLIT_SIZES_SINCE):  # decode graphs by request count: 1, 2, 4, 5, 6 requests x 5 tokens
        assert speculative == [1, 2, 4, 5, 8, 10, 16, 20, 24, 25, 30, 32, 40, 48, 56]
    elif has_since(UNIFORM_DECODE_SIZES_SINCE):  # 5, 10, 20, 30: 1, 2, 4, 6 x 5
        assert speculative == [1, 2, 4, 5, 8, 10, 16, 20, 24, 30, 32, 40, 48, 56]
    else:
        assert speculative == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56]


@pinned_release
def test_the_capability_family_answer_raises_the_derived_ceiling_for_the_block_only() -> None:
    from vllm.platforms import current_platform

    before = dict(vars(type(current_platform)))
    with probes.capability_family(100):
        assert current_platform.is_device_capability_family(100)
        # 0.34.0: data-centre Blackwell's wider default grids (prefill tokens up to 8192)
        ceiling = 8192 if has_since(SPLIT_SIZES_SINCE) else 1024 if has_since(BLACKWELL_1024_SINCE) else 512
        assert max(probes.derived_capture_sizes(max_num_seqs=512)) == ceiling
    assert dict(vars(type(current_platform))) == before
    assert max(probes.derived_capture_sizes(max_num_seqs=512)) == 512


def test_the_graph_pool_stub_answers_vllms_getter_and_is_gone_after() -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    had = "_global_graph_pool" in vars(cls), vars(cls).get("_global_graph_pool")
    with seams.graph_pool_stub(current_platform, ("pool",)):
        assert current_platform.get_global_graph_pool() == ("pool",)
    assert ("_global_graph_pool" in vars(cls), vars(cls).get("_global_graph_pool")) == had


@pinned_release
def test_the_manager_features_of_this_release() -> None:
    """The knobs the atlas searches, as each release's manager has them (0.33.0: every one)."""

    features = probes.manager_features()
    assert features == {knob: has_since(first) for knob, first in KNOB_SINCE.items()}


@pinned_release
def test_the_manager_is_built_with_the_knobs_its_release_has_and_captures_on_cpu() -> None:
    """``new_manager`` builds vLLM's own class and passes a knob only where this release's manager has it
    (``manager_features``); ``capture_on_cpu`` runs its own ``capture()`` with every argument the
    release's signature requires: a warm-up and a capture forward per descriptor, vLLM's order."""
    from vllm_staging_plugin._offline import cpu_replay
    from vllm_staging_plugin._offline.cpu_replay.stand_ins import Model

    features = probes.manager_features()
    cfg = cpu_replay.ReplayConfig(mode="PIECEWISE", sizes=(1, 2, 4), max_num_seqs=4, hidden_size=8)
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        vllm_config = cpu_replay.make_vllm_config(cfg)
        for knob, value in (("lora_capture_cases", [0, 1]), ("varlen_decode", True)):
            if features[knob]:
                seams.new_manager(vllm_config, "PIECEWISE", 1, **{knob: value})
            else:
                with pytest.raises(TypeError):
                    seams.new_manager(vllm_config, "PIECEWISE", 1, **{knob: value})
        manager = seams.new_manager(vllm_config, "PIECEWISE", 1)
        assert type(manager) is seams.cudagraph_module().ModelCudaGraphManager
        model = Model(cfg)
        seams.capture_on_cpu(manager, model, max_num_seqs=4, rows=4)
    assert model.forwards == [4, 4, 2, 2, 1, 1]
    assert manager.hidden_states.shape[0] == 4  # vLLM's lazy staging, sized by its first descriptor


def test_the_capture_arguments_follow_the_signature_and_an_unknown_required_one_is_named() -> None:
    def capture(
        self: Any, model: Any, added: Any, *rest: Any, hook: Any = None, desc: str = "", **kw: Any
    ) -> None:
        pass

    assert seams.capture_arguments(capture, {"model": 1, "added": 2, "desc": "d", "other": 3}) == {
        "model": 1, "added": 2, "desc": "d",
    }  # fmt: skip
    with pytest.raises(seams.SeamChanged, match="requires added, unknown to the CPU replay"):
        seams.capture_arguments(capture, {"model": 1})


def test_an_architecture_is_inspected_through_vllms_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    asked: list[str] = []
    monkeypatch.setattr(ModelRegistry, "_try_inspect_model_cls", lambda arch: asked.append(arch))
    seams.inspect_architecture("Qwen3ForCausalLM")
    seams.inspect_architecture("NoSuchArchitectureForCausalLM")  # not in the registry: not asked
    assert asked == ["Qwen3ForCausalLM"]


def test_the_capture_plan_is_the_managers_own_and_reordering_it_changes_the_capture() -> None:
    """The plan is the live mapping ``capture()`` walks: a list reordered in it is the order captured."""
    from vllm.config.compilation import CUDAGraphMode

    from vllm_staging_plugin._offline import cpu_replay

    cfg = cpu_replay.ReplayConfig(sizes=[1, 2, 4, 8], max_num_seqs=8, hidden_size=64)
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
        plan = seams.capture_plan(manager)
        assert plan is seams.capture_plan(manager) and set(plan) <= set(CUDAGraphMode)
        assert [d.num_tokens for d in plan[CUDAGraphMode.PIECEWISE]] == [8, 4, 2, 1]  # vLLM's own: descending
        plan[CUDAGraphMode.PIECEWISE].sort(key=lambda d: d.num_tokens)  # in the live plan
        assert seams.replayed_plan(manager) is None  # nothing walked before the capture
        result = cpu_replay.run_capture(manager, cfg)
        assert seams.replayed_plan(manager) is plan  # the loop walked the live plan
    assert result.forwards[:3] == [1, 1, 2]  # the 1-token graph first, then the 2-token one
    if SIZES_STAGING:  # 0.34.0: every descriptor walked, the buffer sized by the largest
        assert result.ok and result.forwards[::2][:4] == [1, 2, 4, 8]
    else:  # stock's crash at the second descriptor
        assert result.error is not None and "(1) must match the existing size (2)" in result.error
    assert [d.num_tokens for d in plan[CUDAGraphMode.PIECEWISE]] == [1, 2, 4, 8]


def test_the_cutlass_capability_answers_follow_vllms_cuda_build() -> None:
    fp8, block, fp4 = (
        seams.KERNEL_QUERIES[f"cutlass_scaled_mm_supports_{k}"] for k in ("fp8", "block_fp8", "fp4")
    )
    assert [fp8(c) for c in (80, 86, 89, 90, 100)] == [False, False, True, True, True]
    assert [block(c) for c in (89, 90, 100, 120)] == [False, True, True, True]
    assert [fp4(c) for c in (90, 100, 120)] == [False, True, True]


@preflight_release
def test_the_kernel_library_answers_only_what_this_machine_cannot_and_only_for_the_block() -> None:
    import torch
    import vllm._custom_ops as ops

    before = dict(vars(ops))
    with seams.kernel_library_answers():
        for name, answer in seams.KERNEL_QUERIES.items():
            if hasattr(torch.ops._C, name) or name not in before:
                assert vars(ops).get(name) is before.get(name)  # this machine's own, or not vLLM's question
            else:
                assert getattr(ops, name) is answer and ops.cutlass_scaled_mm_supports_fp8(89)
    assert vars(ops) == before


@preflight_release
def test_vllms_cuda_platform_class_loads_here_and_leaves_the_modules_as_found() -> None:
    import sys

    import vllm.platforms
    from vllm.platforms.interface import Platform

    names = (*seams.platform.NATIVE_OP_MODULES, "vllm.platforms.cuda")
    before = {name: sys.modules.get(name) for name in names}, "cuda" in vars(vllm.platforms)
    cls = seams.cuda_platform_class()
    assert issubclass(cls, Platform) and cls.__name__ == "NonNvmlCudaPlatform" and cls.device_name == "cuda"
    assert ({name: sys.modules.get(name) for name in names}, "cuda" in vars(vllm.platforms)) == before


@preflight_release
def test_the_platform_branching_modules_are_this_releases() -> None:
    """Each module the pre-flight imports under the machine's platform exists in this release (a moved one
    raises ImportError here)."""
    seams.import_under_machine_platform()


@preflight_release
def test_the_platform_is_bound_in_every_vllm_module_for_the_block_only() -> None:
    import sys

    import vllm.config.vllm as config_module
    import vllm.platforms

    machine, stand_in = vllm.platforms.current_platform, object()
    bound = [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("vllm.")
             and vars(m).get("current_platform") is machine]  # fmt: skip
    triton = vars(config_module).get("HAS_TRITON")
    assert bound  # vLLM's modules bind it when imported
    with seams.platform_bound(machine, stand_in):
        assert vllm.platforms.current_platform is stand_in and config_module.HAS_TRITON is True
        assert all(vars(m)["current_platform"] is stand_in for m in bound if m is not vllm.platforms)
    assert all(vars(m)["current_platform"] is machine for m in bound)
    assert vllm.platforms.current_platform is machine and vars(config_module).get("HAS_TRITON") == triton


@preflight_release
def test_vllms_own_config_failures_are_sorted_by_their_sentences() -> None:
    """The sentences vLLM's registry raises for an architecture it cannot inspect or does not know, and
    torch's for a query of the absent CUDA kernel library (as vLLM's quantization setup asks it)."""
    import torch
    from vllm.model_executor.models.registry import ModelRegistry

    def failure(call: Any) -> tuple[str, str]:
        with pytest.raises(Exception) as caught:
            call()
        return seams.config_failure(caught.value)

    kind, text = failure(lambda: ModelRegistry._raise_for_unsupported(["Qwen3ForCausalLM"]))
    assert kind == "inspection" and "Qwen3ForCausalLM" in text
    kind, text = failure(lambda: ModelRegistry._raise_for_unsupported(["NoSuchModelForCausalLM"]))
    assert kind == "unknown-architecture" and text.endswith("are not supported for now")
    assert failure(lambda: torch.ops._C.no_such_capability_query)[0] == "kernel-library"
    assert failure(lambda: int("x"))[0] == "refusal"


@preflight_release
def test_the_manager_inputs_are_what_model_runner_v2_would_pass(kimi_linear: str) -> None:
    inputs = seams.manager_inputs(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    assert (inputs.cudagraph_mode, inputs.decode_query_len, inputs.lora_capture_cases) == (
        "FULL_AND_PIECEWISE",
        9,
        [0],
    )
    hidden = KIMI_LINEAR_4_LAYERS["hidden_size"]
    assert (inputs.hidden_size, str(inputs.dtype), inputs.aux_layers) == (hidden, "torch.bfloat16", 0)
    assert not inputs.varlen_decode and not inputs.dbo and inputs.notes


def test_a_dotted_drafter_name_is_a_proposer_class_where_vllm_reads_one() -> None:
    """0.29.0-0.33.0 read ``pkg.MyProposer`` (no method) as a proposer class, 0.34.0 as a model to load."""
    from vllm.config.speculative import SpeculativeConfig

    from vllm_staging_plugin._engine.compat import installed_versions

    reads_classes = hasattr(SpeculativeConfig, "_is_custom_proposer_path")
    version = installed_versions()["vllm"]
    if version in span("0.29.0-0.33.0"):
        assert reads_classes
    elif version == "0.34.0":
        assert not reads_classes
    assert seams.proposer_class_path("my_pkg.MyProposer") == reads_classes
    for model in ("Qwen/Qwen3-8B", "drafter", "./x.y", "https://host/a.b"):
        assert not seams.proposer_class_path(model)
