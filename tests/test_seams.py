"""Contract tests of ``_offline/seams.py`` against the installed vLLM: each private it reaches still answers
as its docstring says, and the process is left as it was found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from configs import K3_4_LAYERS, KIMI_LINEAR_4_LAYERS, NO_WEIGHTS, QWEN3_0_6B, model_folder

pytest.importorskip("vllm.v1.attention.backends.gdn_attn")

from vllm_staging_plugin._offline import seams
from vllm_staging_plugin._offline.preflight import configure
from vllm_staging_plugin._offline.preflight.platform import GPUS, platform_for_check

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache", "offline")]
NGRAM_8 = ["--max-num-seqs", "48", "--speculative-config",
           '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}']  # fmt: skip


def vllm_config(model: str, *words: str) -> Any:
    """vLLM's own VllmConfig for ``vllm serve MODEL WORDS``, built as the pre-flight builds it."""
    with platform_for_check(GPUS["h200"]) as (platform, emulated):
        if emulated:
            type(platform).emulated_count = 8  # one node of eight
        args = configure.parse_serve_arguments([model, *NO_WEIGHTS, *words])
        configure.inspect_model_classes(str(args.model))
        return configure.create_engine_config(args)


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory: pytest.TempPathFactory) -> str:
    return model_folder(tmp_path_factory.mktemp("kimi"), KIMI_LINEAR_4_LAYERS)


def test_the_kda_layer_is_the_one_vllms_kimi_decoder_builds(kimi_linear: str, tmp_path: Path) -> None:
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import KimiGatedDeltaNetAttention
    from vllm.models.kimi_k3.nvidia import model
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    before = dict(vars(model))
    assert seams.kda_layer_class(vllm_config(kimi_linear)) is KimiGatedDeltaNetAttention
    assert seams.kda_layer_class(vllm_config(str(K3_4_LAYERS))) is KimiK3DeltaAttention  # full-rank gate
    assert seams.kda_layer_class(vllm_config(model_folder(tmp_path / "qwen", QWEN3_0_6B))) is None
    assert vars(model) == before  # every recorder put back


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


def test_without_replayssm_the_index_covers_the_query(kimi_linear: str) -> None:
    step = seams.kda_mixed_step(vllm_config(kimi_linear, *NGRAM_8))
    assert step is not None and (step.index_columns, step.query_length) == (9, 9) and not step.faults


def test_tensor_parallel_ranks_hold_a_share_of_the_state(kimi_linear: str) -> None:
    one = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    two = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", "-tp", "2", *NGRAM_8))
    assert one is not None and two is not None and two.slot_bytes * 2 == one.slot_bytes


def test_not_applicable_without_speculation_or_to_kimi_k3(kimi_linear: str) -> None:
    assert seams.kda_mixed_step(vllm_config(kimi_linear, "--max-num-seqs", "48")) is None
    assert seams.kda_mixed_step(vllm_config(str(K3_4_LAYERS), "--use-replayssm", *NGRAM_8)) is None


@pytest.mark.usefixtures("kda_fixed_vllm")
def test_on_vllm_with_the_kda_patch_the_index_covers_the_query(kimi_linear: str) -> None:
    step = seams.kda_mixed_step(vllm_config(kimi_linear, "--use-replayssm", *NGRAM_8))
    assert step is not None and step.layer == "KimiGatedDeltaNetAttention"
    assert (step.index_columns, step.query_length) == (9, 9) and not step.faults


def test_the_derived_grid_is_vllms_own_and_carries_its_decode_sizes() -> None:
    """vLLM's ``_set_cudagraph_sizes`` on a config with no explicit sizes: the default steps, and with
    speculative decoding the uniform-decode sizes (multiples of 1 + tokens) appended (0.33.0)."""
    from vllm_staging_plugin._offline import cpu_replay

    plain = cpu_replay.derived_capture_sizes(max_num_seqs=256)
    assert plain[:4] == [1, 2, 4, 8] and plain[-1] == 512 and plain == sorted(plain)
    speculative = cpu_replay.derived_capture_sizes(max_num_seqs=6, num_speculative_tokens=4)
    assert speculative == [1, 2, 4, 5, 8, 10, 16, 20, 24, 30, 32, 40, 48, 56]  # 5, 10, 20, 30: 1, 2, 4, 6 x 5


def test_the_capability_family_answer_raises_the_derived_ceiling_for_the_block_only() -> None:
    from vllm.platforms import current_platform

    from vllm_staging_plugin._offline import cpu_replay

    before = dict(vars(type(current_platform)))
    with seams.capability_family(100):
        assert current_platform.is_device_capability_family(100)
        assert max(cpu_replay.derived_capture_sizes(max_num_seqs=512)) == 1024
    assert dict(vars(type(current_platform))) == before
    assert max(cpu_replay.derived_capture_sizes(max_num_seqs=512)) == 512


def test_the_graph_pool_stub_answers_vllms_getter_and_is_gone_after() -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    had = "_global_graph_pool" in vars(cls), vars(cls).get("_global_graph_pool")
    with seams.graph_pool_stub(current_platform, ("pool",)):
        assert current_platform.get_global_graph_pool() == ("pool",)
    assert ("_global_graph_pool" in vars(cls), vars(cls).get("_global_graph_pool")) == had


def test_the_manager_features_of_this_release() -> None:
    """vLLM 0.33.0 has every knob the atlas searches."""
    from vllm_staging_plugin._offline import cpu_replay

    assert seams.manager_features(cpu_replay.cudagraph_module()) == {
        "lora_capture_cases": True, "varlen_decode": True, "dbo": True, "kda_recoverssm": True,
        "dense_schedule": True, "intermediate_tensors": True,
    }  # fmt: skip


def test_an_architecture_is_inspected_through_vllms_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    asked: list[str] = []
    monkeypatch.setattr(ModelRegistry, "_try_inspect_model_cls", lambda arch: asked.append(arch))
    seams.inspect_architecture("Qwen3ForCausalLM")
    seams.inspect_architecture("NoSuchArchitectureForCausalLM")  # not in the registry: not asked
    assert asked == ["Qwen3ForCausalLM"]
