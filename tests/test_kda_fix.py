"""Unit tests of the KDA state-slot fix (``_engine/kda_fix.py``) on stand-in classes: every branch of
``keep_slots``, install and restore, strict mode, the log lines. The real layer and builder:
tests/test_contract_kda_fix.py."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest
from stable import assert_says
from wrappers import is_plugin_wrapper

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, kda_fix
from vllm_staging_plugin._engine.kda_fix import KdaFix, KdaShapeError
from vllm_staging_plugin._engine.settings import Settings


@dataclasses.dataclass(frozen=True)
class Spec:
    """MambaSpec's accounting: one page per slot, 1 + num_speculative_blocks slots per request."""

    page_size_bytes: int = 100
    num_speculative_blocks: int = 0

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        return self.page_size_bytes * (1 + self.num_speculative_blocks)


class Base:
    def get_kv_cache_spec(self, vllm_config: Any) -> Any:
        return Spec()


def layer_class() -> type:
    """A fresh KimiGatedDeltaNetAttention stand-in that inherits its spec method, as vLLM's does."""
    return type("KimiGatedDeltaNetAttention", (Base,), {})


def config(replay: bool = True, tokens: int | None = 8) -> Any:
    spec = None if tokens is None else types.SimpleNamespace(num_speculative_tokens=tokens)
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(use_replayssm=replay), speculative_config=spec
    )


@pytest.fixture(autouse=True)
def supported_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")


def test_an_out_of_tree_platform_leaves_the_layer_alone_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "npu")
    patch = KdaFix(Settings())
    patch.install(types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=layer_class()))
    assert patch.wrap is None
    (line,) = plugin_log.warnings
    assert "the KDA state-slot fix is inactive" in line and "IncompatibleVllm: platform 'npu'" in line
    with pytest.raises(KdaShapeError, match="platform 'npu'"):
        KdaFix(Settings(strict=True)).install(
            types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=layer_class())
        )


def patched(strict: bool = False) -> tuple[KdaFix, type]:
    cls = layer_class()
    patch = KdaFix(Settings(strict=strict))
    patch.install(types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=cls))
    return patch, cls


def test_it_keeps_one_slot_per_speculative_token_and_says_the_cost_once(plugin_log: Any) -> None:
    _, cls = patched()
    assert is_plugin_wrapper(cls.__dict__["get_kv_cache_spec"])
    assert cls().get_kv_cache_spec(config()).num_speculative_blocks == 8
    assert cls().get_kv_cache_spec(config()).num_speculative_blocks == 8  # every layer, every call
    (line,) = plugin_log.at(20)
    assert_says(line, "vllm-staging-plugin: KimiGatedDeltaNetAttention (vLLM's shared KDA layer) keeps one",
                "(8 speculative tokens): 9 state slots per request instead of 1, 900 bytes per request in "
                "each such layer instead of 100",
                end="STAGING_PLUGIN_KDA_FIX=off turns this off")  # fmt: skip
    assert len(plugin_log.at(10)) == 1  # the second layer's at DEBUG


@pytest.mark.parametrize(
    "cfg", [config(replay=False), config(tokens=None), config(tokens=0)], ids=["no replayssm", "no spec", "0"]
)
def test_nothing_changes_without_replayssm_or_speculation(cfg: Any, plugin_log: Any) -> None:
    _, cls = patched()
    assert cls().get_kv_cache_spec(cfg) == Spec()
    assert plugin_log.at(20) == [] and plugin_log.warnings == []


def test_a_vllm_that_keeps_the_slots_is_left_alone_with_one_info_line(plugin_log: Any) -> None:
    cls = type(
        "KimiGatedDeltaNetAttention",
        (Base,),
        {"get_kv_cache_spec": lambda s, c: Spec(num_speculative_blocks=8)},
    )
    patch = KdaFix(Settings())
    assert patch.apply(cls) and not patch.apply(cls)  # one class per patch
    assert cls().get_kv_cache_spec(config()) == Spec(num_speculative_blocks=8)
    cls().get_kv_cache_spec(config())
    (line,) = plugin_log.at(20)
    assert_says(line, "vllm-staging-plugin: this vLLM's KimiGatedDeltaNetAttention already keeps 8",
                end="the plugin leaves its KV-cache spec to vLLM")  # fmt: skip
    patch.uninstall()
    assert not is_plugin_wrapper(cls.__dict__["get_kv_cache_spec"])  # its own method put back


def test_uninstall_restores_the_inherited_method_and_passes_through_once_dead() -> None:
    patch, cls = patched()
    wrapper = cls.__dict__["get_kv_cache_spec"]
    assert patch.uninstall() == []
    assert "get_kv_cache_spec" not in cls.__dict__ and patch.uninstall() == []
    assert wrapper(cls(), config()) == Spec()  # a dead wrapper someone kept: vLLM's answer


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (
            types.SimpleNamespace(__name__="vllm.kda"),
            "vllm.kda.KimiGatedDeltaNetAttention.get_kv_cache_spec is missing",
        ),
        (
            types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=type("K", (), {})),
            "vllm.kda.KimiGatedDeltaNetAttention.get_kv_cache_spec is missing",
        ),
    ],
    ids=["class missing", "method missing"],
)
def test_an_unexpected_module_leaves_vllm_alone_with_one_warning(
    module: Any, reason: str, plugin_log: Any
) -> None:
    patch = KdaFix(Settings())
    patch.install(module)
    patch.install(module)
    (line,) = plugin_log.warnings
    assert_says(line, "vllm-staging-plugin: the KDA state-slot fix is inactive", reason,
                end="Set STAGING_PLUGIN_STRICT=1 to fail instead.")  # fmt: skip
    assert patch.wrap is None
    with pytest.raises(KdaShapeError, match=f"strict mode.*{reason}"):
        KdaFix(Settings(strict=True)).install(module)


def test_an_unexpected_spec_is_returned_as_it_is_with_one_warning(plugin_log: Any) -> None:
    patch, cls = patched()
    cls.__bases__[0].get_kv_cache_spec = lambda self, c: {"not": "a spec"}  # type: ignore[method-assign]
    try:
        assert patch.keep_slots("L", config(), {"not": "a spec"}) == {"not": "a spec"}
        assert patch.keep_slots("L", config(), Spec) is Spec  # a class, not a spec
        (line,) = plugin_log.warnings
        assert "L.get_kv_cache_spec returned dict without num_speculative_blocks" in line
        with pytest.raises(KdaShapeError):
            KdaFix(Settings(strict=True)).keep_slots("L", config(), {"not": "a spec"})
    finally:
        cls.__bases__[0].get_kv_cache_spec = lambda self, c: Spec()  # type: ignore[method-assign]
    assert patch.keep_slots("L", config(), None) is None  # vLLM's "no spec" passes through


def test_a_failing_patch_never_breaks_vllms_import(monkeypatch: pytest.MonkeyPatch, plugin_log: Any) -> None:
    patch = KdaFix(Settings())
    monkeypatch.setattr(patch, "apply", lambda cls: (_ for _ in ()).throw(TypeError("odd class")))
    patch.install(types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=layer_class()))
    assert "TypeError: odd class" in plugin_log.warnings[0]


@dataclasses.dataclass(frozen=True)
class SpecWithoutPages:
    """The field the fix sets, without the accounting its INFO line reads."""

    num_speculative_blocks: int = 0


@dataclasses.dataclass(frozen=True)
class SpecWithOtherAccounting(Spec):
    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        raise TypeError("max_memory_usage_bytes() takes 1 positional argument but 2 were given")


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (SpecWithoutPages(), "AttributeError: 'SpecWithoutPages' object has no attribute 'page_size_bytes'"),
        (SpecWithOtherAccounting(), "TypeError: max_memory_usage_bytes() takes 1 positional argument"),
    ],
    ids=["no page_size_bytes", "accounting raises"],
)
def test_a_spec_the_fix_cannot_account_for_gets_vllms_spec_back_with_one_warning(
    spec: Any, reason: str, plugin_log: Any
) -> None:
    base = type("Base", (), {"get_kv_cache_spec": lambda self, c: spec})
    cls = type("KimiGatedDeltaNetAttention", (base,), {})
    patch = KdaFix(Settings())
    patch.install(types.SimpleNamespace(__name__="vllm.kda", KimiGatedDeltaNetAttention=cls))
    assert is_plugin_wrapper(cls.__dict__["get_kv_cache_spec"])
    assert cls().get_kv_cache_spec(config()) is spec  # vLLM's KV-cache setup goes on with its own spec
    assert cls().get_kv_cache_spec(config()) is spec
    (line,) = plugin_log.warnings
    assert_says(line, "vllm-staging-plugin: the KDA state-slot fix is inactive",
                f"KimiGatedDeltaNetAttention.get_kv_cache_spec: {reason}",
                end="Set STAGING_PLUGIN_STRICT=1 to fail instead.")  # fmt: skip
    assert plugin_log.at(20) == []
    strict = KdaFix(Settings(strict=True))
    strict.apply(type("KimiGatedDeltaNetAttention", (base,), {}))
    assert strict.wrap is not None
    with pytest.raises(KdaShapeError, match="strict mode.*" + reason.split(":")[0]):
        strict.wrap.cls().get_kv_cache_spec(config())


def test_quiet_keeps_the_slots_without_a_line(plugin_log: Any) -> None:
    patch = KdaFix(Settings())
    assert patch.keep_slots("L", config(), Spec(), quiet=True) == Spec(num_speculative_blocks=8)
    assert (
        patch.keep_slots("L", config(), Spec(num_speculative_blocks=8), quiet=True).num_speculative_blocks
        == 8
    )
    assert plugin_log.at(20) == []


def test_the_slot_cost_is_the_specs_own_accounting() -> None:
    cost = kda_fix.slot_cost(
        config(), Spec(page_size_bytes=64), Spec(page_size_bytes=64, num_speculative_blocks=3)
    )
    assert cost == kda_fix.SlotCost(1, 4, 64, 256)


def test_register_installs_it_when_vllm_imports_the_layer_and_the_variable_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fakes import installed_fix

    vllm_staging_plugin.register()
    assert installed_fix("kda").settings.kda_fix == "on"
    vllm_staging_plugin.unregister()
    monkeypatch.setenv("STAGING_PLUGIN_KDA_FIX", "0")
    vllm_staging_plugin.register()
    assert installed_fix("kda") is None  # the settings leave it out: no fix, no hook
    assert kda_fix.KDA_MODULE not in [getattr(f, "fullname", None) for f in sys.meta_path]


@pytest.mark.parametrize(
    "cfg",
    [
        types.SimpleNamespace(),
        types.SimpleNamespace(
            cache_config=types.SimpleNamespace(), speculative_config=config().speculative_config
        ),
        types.SimpleNamespace(cache_config=types.SimpleNamespace(use_replayssm=True)),
    ],
    ids=["no cache config", "no use_replayssm", "no speculative config"],
)
def test_a_config_without_the_fields_leaves_the_spec_alone(cfg: Any, plugin_log: Any) -> None:
    assert KdaFix(Settings()).keep_slots("L", cfg, Spec()) == Spec()
    assert plugin_log.at(20) == [] and plugin_log.warnings == []


def test_one_speculative_token_keeps_one_slot() -> None:
    assert (
        KdaFix(Settings()).keep_slots("L", config(tokens=1), Spec(), quiet=True).num_speculative_blocks == 1
    )


def test_a_dataclass_spec_without_the_field_is_refused(plugin_log: Any) -> None:
    @dataclasses.dataclass(frozen=True)
    class Other:
        page_size_bytes: int = 1

    assert KdaFix(Settings()).keep_slots("L", config(), Other()) == Other()
    (line,) = plugin_log.warnings
    assert line == (
        "vllm-staging-plugin: the KDA state-slot fix is inactive, vLLM's shared KDA layer runs as it is (a "
        "Kimi-Linear model with --use-replayssm and speculative decoding can fault on a step that mixes a "
        "speculative decode with a prefill): L.get_kv_cache_spec returned Other without "
        "num_speculative_blocks. "
        "Set STAGING_PLUGIN_STRICT=1 to fail instead."
    )


def test_slot_counts_are_whole_numbers() -> None:
    cost = kda_fix.slot_cost(
        config(), Spec(page_size_bytes=64), Spec(page_size_bytes=64, num_speculative_blocks=3)
    )
    assert all(type(v) is int for v in dataclasses.astuple(cost))
