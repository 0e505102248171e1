"""A fresh process: vLLM's own plugin loader finds the entry point; third-party policies; rank determinism.

One child (``children/start_ups.py``) imports vLLM once and then plays several process start-ups in a
row, each the way a vLLM process starts: its environment is set, the plugin is unregistered and vLLM's
general plugins are loaded afresh (``vllm.plugins.plugins_loaded`` reset). Only the first start-up finds
``cudagraph_utils`` not yet imported (the import hook applies the patch); later ones find it imported
(``register()`` patches at once).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pytest
from childproc import EARLY, SHUFFLE_SEED, Checks, once_per_run, start_ups_environment
from release import SIZES_STAGING

pytest.importorskip("vllm.plugins")
pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Checks:
    def run() -> dict[str, Any]:
        environment = lambda: start_ups_environment(tmp_path_factory.mktemp("site"), SHUFFLE_SEED)  # noqa: E731
        return EARLY.finish("test_subprocess", "start_ups", environment).to_json()

    return Checks.from_json(once_per_run(tmp_path_factory, "test_subprocess", run))


def test_entry_point_is_installed() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("vllm_staging_plugin") == "vllm_staging_plugin:register", (
        "install the package (pip install -e .) so vLLM can discover it"
    )


def test_register_imports_neither_torch_nor_vllm_nor_pluggy(child: Checks) -> None:
    assert child.value("register before vLLM is imported") == []


def test_vllm_discovers_and_applies_the_plugin(child: Checks) -> None:
    result = child.value("the plugin named")
    # vLLM 0.34.0 sizes the buffers itself: the plugin records no capacity and says so
    assert result["patched"] and result["registered"]
    assert result["capacity_attr"] == (None if SIZES_STAGING else 512)
    assert result["ok"] and result["rows"] == {"hidden_states": 512}
    said = "to the largest of its" if SIZES_STAGING else "sized to 512 rows"
    assert said in child.log("the plugin named")  # through vLLM's own log handler


def test_vllm_plugins_naming_another_plugin_leaves_vllm_stock(child: Checks) -> None:
    result = child.value("another plugin named")
    assert not result["patched"] and not result["registered"] and result["capacity_attr"] is None
    if SIZES_STAGING:  # the child's capture order is not vLLM's: stock 0.34.0 boots it
        assert result["ok"]
    else:
        assert not result["ok"] and "must match the existing size" in result["error"]


def test_third_party_policy_through_entry_point(child: Checks) -> None:
    evens = child.value("order evens-first")
    assert evens["ok"] and evens["rows"] == {"hidden_states": 512}
    piecewise = evens["forwards"][:51]
    assert piecewise[-1] == 1 and all(n % 2 == 0 for n in piecewise[:50])
    log = child.log("order evens-first")
    assert "order-policy entry point 'broken' (no_such_policy_module) failed to load" in log


def test_a_package_declaring_a_builtin_name_does_not_take_it_over(child: Checks) -> None:
    result = child.value("order max-first")
    assert result["ok"] and result["forwards"][:3] == [512, 1, 2]  # the built-in: the largest, then ascending
    assert "order policy 'max-first' is declared by 'builtin' and by 'mine'; 'builtin' keeps it" in child.log(
        "order max-first"
    )


def test_shuffle_is_identical_across_processes_and_ranks(child: Checks) -> None:
    """The child (RANK 1, another hash seed) and this process (no RANK) shuffle vLLM's descriptors alike."""
    from vllm_staging_plugin._engine.policies import PolicyRegistry
    from vllm_staging_plugin._engine.settings import Settings
    from vllm_staging_plugin._offline import cpu_replay

    cfg = cpu_replay.ReplayConfig()
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
    order = PolicyRegistry.load().reordered(Settings(order="shuffle:7"), manager._capture_descs)
    here = {m.name: [[d.num_tokens, d.num_active_loras] for d in ds] for m, ds in order.items()}
    assert child.value("shuffle:7") == here
    assert here["PIECEWISE"] != sorted(here["PIECEWISE"], reverse=True)


BAD_VALUES = [
    ("STAGING_PLUGIN_ORDER", "fastest", "STAGING_PLUGIN_ORDER='fastest'"),
    ("STAGING_PLUGIN_STRICT", "2", "STAGING_PLUGIN_STRICT='2'"),
    ("STAGING_PLUGIN_PRESIZE", "maybe", "STAGING_PLUGIN_PRESIZE='maybe'"),
]


@pytest.mark.parametrize(("variable", "value", "named"), BAD_VALUES)
def test_a_bad_value_stops_vllm_start_up_before_any_model_is_read(
    variable: str, value: str, named: str, child: Checks
) -> None:
    """vLLM's own front-end path: EngineArgs loads the plugin, which rejects the bad value at once."""
    outcome: dict[str, Any] = child.value(f"front end {variable}={value}")
    assert outcome["raised"] == "ConfigError", outcome
    assert named in outcome["message"] and "allowed values" in outcome["message"]


def test_a_valid_value_lets_vllm_start_up_go_on(child: Checks) -> None:
    """The control of the test above: the same path with a valid value raises nothing and registers."""
    assert child.value("front end STAGING_PLUGIN_ORDER=ascending") == {"raised": None, "registered": True}
