"""Contract tests of the KDA state-slot fix (``_engine/kda_fix.py``) against the installed vLLM: vLLM's real
GDN metadata builder, built on CPU from the layer's spec (``seams.kda_mixed_step``), hands the speculative
kernel a one-column state index on a mixed step without the plugin and a full-width one with it; Kimi-K3's
own KDA layer is left alone; on a vLLM that already keeps the slots the plugin stands down. Each Kimi-Linear
test runs with two drafters: vLLM's n-gram (the GPU runs') and an EAGLE drafter, which the Model Runner V2
of 0.29.0-0.31.0 takes where it refuses n-gram."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from configs import K3_4_LAYERS, K3_DRAFTERS, KIMI_LINEAR_4_LAYERS, KIMI_LINEAR_EAGLE, model_folder
from fakes import installed_fix
from stable import assert_says
from vllm_configs import NGRAM_8, check_platform, vllm_config
from wrappers import is_plugin_wrapper

import vllm_staging_plugin
from vllm_staging_plugin._engine import kda_fix
from vllm_staging_plugin._offline import seams, vllm_patches
from vllm_staging_plugin._offline.preflight.refusals import BadArguments
from vllm_staging_plugin._offline.scoped import items
from vllm_staging_plugin._offline.seams import kda as seams_kda

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache", "offline")]
kimi_gdn = pytest.importorskip(kda_fix.KDA_MODULE, reason="this vLLM has no shared Kimi KDA layer")
if not hasattr(pytest.importorskip("vllm.config").CacheConfig, "use_replayssm"):  # 0.24.0 has none
    pytest.skip("this vLLM has no --use-replayssm, whose one slot the fix is about", allow_module_level=True)
# --use-replayssm in the 'align' cache mode (prefix caching on) needs Model Runner V2 on 0.29.0-0.33.0,
# which 0.33.0 picks by itself; 0.34.0 has no other runner and no such variable
V2 = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


@pytest.fixture(scope="module", autouse=True)
def model_runner_v2() -> Iterator[None]:
    with items(os.environ, V2):
        yield


@pytest.fixture(scope="module", params=["ngram", "eagle"])
def drafter(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The speculative words: 8 tokens from vLLM's n-gram, or from a config-only EAGLE drafter at the
    Kimi-Linear widths."""
    if request.param == "ngram":
        return NGRAM_8
    folder = model_folder(tmp_path_factory.mktemp("eagle"), KIMI_LINEAR_EAGLE)
    spec = {"method": "eagle", "model": folder, "num_speculative_tokens": 8}
    return ["--max-num-seqs", "48", "--speculative-config", json.dumps(spec)]


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The model folder, once vLLM configured it (and its logging) in this process: a test's log handler
    is then attached after vLLM's own logging set-up."""
    folder = model_folder(tmp_path_factory.mktemp("kimi"), KIMI_LINEAR_4_LAYERS)
    configs((folder,))
    return folder


@pytest.fixture(scope="module")
def replayssm(kimi_linear: str, drafter: list[str]) -> tuple[str, ...]:
    """``vllm serve`` words of the fault: the model with ``--use-replayssm`` and the drafter."""
    return (kimi_linear, "--use-replayssm", *drafter)


def columns(config: Any) -> tuple[int, int]:
    """The state index vLLM's builder hands the kernel, from the layer's spec as this process holds it
    (the seam suspends the registered fixes for the pre-flight's stock arm; here they stay)."""
    with mock.patch.object(seams_kda, "suspended", contextlib.nullcontext):
        step = seams.kda_mixed_step(config)
    assert step is not None
    return step.index_columns, step.query_length


def configs(*models_and_words: tuple[str, ...]) -> list[Any]:
    """vLLM's configs for each ``(model, *words)``, then the plugin unregistered: vLLM's parser loads the
    general plugins (this one too) the first time a process parses, and each test starts stock."""
    try:
        built = [vllm_config(*words) for words in models_and_words]
    except BadArguments as exc:
        if "--use-replayssm is only supported for" in str(exc):  # 0.27.0 and 0.28.0: Nemotron-H only
            pytest.skip(f"this vLLM refuses --use-replayssm for Kimi-Linear: no fault to fix ({exc})")
        if "not a multiple of the number of attention heads" in str(exc):
            # 0.27.0's and 0.28.0's K3 DSpark config is a DeepseekV2Config, which the transformers here
            # (0.33.0's) validates as multi-head attention: K3's drafter is refused before vLLM sees it
            pytest.skip(f"the installed transformers refuses this vLLM's K3 drafter config ({exc})")
        if "does not yet support" not in str(exc) or "ngram" not in str(exc):
            raise
        pytest.skip(f"this vLLM's Model Runner V2 refuses the n-gram drafter ({exc})")
    finally:
        vllm_staging_plugin.unregister()
    return built


def test_the_kernel_gets_a_full_width_index_with_the_plugin_and_one_column_without(
    replayssm: tuple[str, ...], plugin_log: Any
) -> None:
    (config,) = configs(replayssm)
    assert columns(config) == (1, 9)  # stock: the fault
    vllm_staging_plugin.register()
    assert installed_fix("kda").wrap is not None  # the module was imported: installed at once
    assert is_plugin_wrapper(kimi_gdn.KimiGatedDeltaNetAttention.__dict__["get_kv_cache_spec"])
    assert columns(config) == (9, 9)
    (line,) = [m for m in plugin_log.at(20) if "KDA" in m]
    assert_says(
        line,
        "vllm-staging-plugin: KimiGatedDeltaNetAttention (vLLM's shared KDA layer) keeps one state slot",
        "(8 speculative tokens): 10 state slots per request instead of 2,",
        "STAGING_PLUGIN_KDA_FIX=off turns this off",
    )
    vllm_staging_plugin.unregister()
    assert "get_kv_cache_spec" not in kimi_gdn.KimiGatedDeltaNetAttention.__dict__  # inherited again
    assert columns(config) == (1, 9)


def test_the_cost_is_the_upstream_patchs(replayssm: tuple[str, ...], plugin_log: Any) -> None:
    """Per request and layer, by vLLM's own accounting of the spec (prefix caching on: the 'align' cache
    mode holds 2 + num_speculative_blocks slots): 8 more slots of one request's state, as without
    --use-replayssm and as with kda-spec-state-slots.patch."""
    (config,) = configs(replayssm)
    step = seams.kda_mixed_step(config)
    assert step is not None
    vllm_staging_plugin.register()
    columns(config)
    (line,) = [m for m in plugin_log.at(20) if "KDA" in m]
    page = step.slot_bytes  # one slot (no padding on this model)
    assert f"{10 * page} bytes per request in each such layer instead of {2 * page}" in line
    assert (10 - 2) * page * step.kda_layers == step.extra_bytes_per_request


def test_nothing_changes_without_replayssm(kimi_linear: str, drafter: list[str], plugin_log: Any) -> None:
    """Without --use-replayssm vLLM keeps the slots itself (vLLM refuses --use-replayssm without
    speculation on Model Runner V2; the unit tests cover that branch)."""
    (plain,) = configs((kimi_linear, *drafter))
    vllm_staging_plugin.register()
    assert columns(plain) == (9, 9)  # vLLM's own slots: nothing to keep
    assert not [m for m in plugin_log.at(20) if "KDA" in m]


def test_kimi_k3s_own_kda_layer_is_left_alone(plugin_log: Any) -> None:
    """K3 at its deployed settings: its own DSpark drafter (8 tokens), --use-replayssm."""
    from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention

    spec = {"method": "dspark", "model": str(K3_DRAFTERS[8]), "num_speculative_tokens": 8}
    (config,) = configs((str(K3_4_LAYERS), "--use-replayssm", "--max-num-seqs", "48",
                         "--speculative-config", json.dumps(spec)))  # fmt: skip
    vllm_staging_plugin.register()
    assert not issubclass(KimiK3DeltaAttention, kimi_gdn.KimiGatedDeltaNetAttention)
    assert not is_plugin_wrapper(KimiK3DeltaAttention.get_kv_cache_spec)
    with check_platform():  # 0.30.0 validates K3's config again here: the platform it was built under
        assert seams.kda_mixed_step(config) is None  # its own metadata
    assert not [m for m in plugin_log.at(20) if "KDA" in m]


def test_the_variable_turns_it_off(replayssm: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    (config,) = configs(replayssm)
    monkeypatch.setenv("STAGING_PLUGIN_KDA_FIX", "off")
    vllm_staging_plugin.register()
    assert installed_fix("kda") is None  # the settings leave the fix out
    assert columns(config) == (1, 9)


@pytest.mark.skipif(
    not vllm_patches.fits(vllm_patches.plan("kda")), reason="the bundled kda patch does not fit this vLLM"
)
@pytest.mark.usefixtures("kda_fixed_vllm")
def test_on_a_vllm_that_keeps_the_slots_the_plugin_stands_down(
    replayssm: tuple[str, ...], plugin_log: Any
) -> None:
    (config,) = configs(replayssm)
    vllm_staging_plugin.register()
    assert installed_fix("kda").wrap is not None
    assert columns(config) == (9, 9)
    (line,) = [m for m in plugin_log.at(20) if "KDA" in m or "state slots" in m]
    assert_says(line, "vllm-staging-plugin: this vLLM's KimiGatedDeltaNetAttention already keeps 8",
                end="the plugin leaves its KV-cache spec to vLLM")  # fmt: skip
