"""The engine part does only what the operator asked, proven in two ranks over the real vLLM class.

The ranks are forked from one process that imported torch and vLLM's configuration, as vLLM forks its
workers, but neither the plugin nor vLLM's ``cudagraph_utils``. They form a real gloo group whose store
records every call, register the plugin the way vLLM does, let
vLLM's ``cudagraph_utils`` import apply the patch, and capture on CPU with no ``STAGING_PLUGIN_*`` variable
set. Recorded there: which of the plugin's modules (and pluggy) are loaded, which hooks sit on
``sys.meta_path``, every store call and every plugin frame during the capture, and the plugin frames of a
graph replay and of an unrelated import afterwards. A second start-up under ``ascending`` is the control
arm: it shows that the same instruments do see the plugin when it has something to do. Under that order
the same two ranks then capture two parallel layouts (CPU stand-ins for the two-GPU layouts):
tensor-parallel ranks, and the two stages of a pipeline.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from childproc import clean_environment, fork_together, free_port, once_per_run
from release import SIZES_STAGING

import vllm_staging_plugin

ENGINE_DIR = Path(vllm_staging_plugin.__file__).parent / "_engine"

# What every vLLM process has imported before it loads its plugins, imported once and the ranks forked from
# it; neither the plugin nor vLLM's cudagraph_utils (whose import applies the patch in each rank) is in it.
PRELOAD = ["torch.distributed", "vllm.config", "vllm.plugins"]
DEFAULT_LOADED = [
    "vllm_staging_plugin",
    "vllm_staging_plugin._engine",
    "vllm_staging_plugin._engine.compat",
    "vllm_staging_plugin._engine.fix",
    "vllm_staging_plugin._engine.import_hook",
    "vllm_staging_plugin._engine.installer",
    "vllm_staging_plugin._engine.kda_fix",
    "vllm_staging_plugin._engine.registry",
    "vllm_staging_plugin._engine.runner_guard",
    "vllm_staging_plugin._engine.settings",
    "vllm_staging_plugin._engine.sizing",
    "vllm_staging_plugin._engine.staging",
    "vllm_staging_plugin._engine.staging_fix",
]


two_ranks = pytest.mark.extended  # the two forked gloo ranks cost about 15 s of CPU


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    env = clean_environment()
    env["STORE"] = str(tmp_path_factory.mktemp("store") / "store")
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", str(free_port())
    envs = [env | {"RANK": str(rank)} for rank in range(2)]

    def run() -> list[dict[str, Any]]:
        return fork_together("footprint_rank", envs, PRELOAD)

    ranks: list[dict[str, Any]] = once_per_run(tmp_path_factory, "test_engine_footprint", run)
    return ranks


pytestmark = [pytest.mark.contract, pytest.mark.subprocess]


@two_ranks
def test_register_and_the_patch_load_only_the_presizing_modules(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["after_register"] == DEFAULT_LOADED  # no offline module, no pluggy, no receipts
        # the V1 guard's and the KDA fix's, until a manager exists
        assert rank["hooks_after_register"] == ["PostImportHook", "PostImportHook"]


@two_ranks
def test_a_default_capture_presizes_and_does_nothing_else(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        default = rank["default"]
        assert default["ok"] and default["rows"] == {"hidden_states": 512} and default["class_is_vllms"]
        assert default["store_calls"] == []  # no agreement round-trip, no collective through the store
        assert default["new_modules"] == []  # the capture imported nothing of the plugin's, nor pluggy
        assert [m for m in default["modules"] if "._offline" not in m] == DEFAULT_LOADED  # (the driver aside)
        assert rank["files_written"] == []


@two_ranks
def test_after_capture_no_plugin_code_runs_anywhere(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["hooks_after_capture"] == []  # both import hooks gone
        assert rank["replay_frames"] == []  # vLLM's per-step FULL graph replay
        assert rank["import_frames"] == []  # an unrelated import


@two_ranks
def test_the_control_arm_shows_the_instruments_work(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        control = rank["ascending"]
        assert control["ok"] and control["rows"] == {"hidden_states": 512}
        keys = [call[1] for call in control["store_calls"] if call[0] == "set"]
        assert any("vllm_staging_plugin/plan/0-1/0/" in key for key in keys)  # the two ranks agreed
        assert "vllm_staging_plugin._engine.agreement" in control["new_modules"]
        assert {"pluggy", "vllm_staging_plugin._engine.policies"} <= set(control["modules"])
        assert "vllm_staging_plugin._engine.capture_session" not in control["modules"]  # no receipts asked
        assert "reordered" in control["frames"]  # the profiler sees plugin code where it runs


@two_ranks
def test_every_rank_captures_the_same_order_with_the_same_capacity(ranks: list[dict[str, Any]]) -> None:
    for layout in ("tp", "pp"):
        first, second = (r[layout] for r in ranks)
        assert first["ok"] and second["ok"], (first["error"], second["error"])
        assert first["capacity"] == second["capacity"] == 512
        assert first["agreed"] == second["agreed"] == 2  # the coupled ranks compared their plans first
        assert first["forwards"] == second["forwards"]  # identical capture sequence on both ranks
        assert first["forwards"][:51] == sorted(first["forwards"][:51])  # and it is the ascending one
        for r in (first, second):  # stock crashes on every rank (0.34.0: boots, sized by vLLM)
            assert (
                r["stock_error"] is None
                if SIZES_STAGING
                else "must match the existing size" in r["stock_error"]
            )
    assert ranks[0]["tp"]["rows"] == ranks[1]["tp"]["rows"] == {"hidden_states": 512}
    # pipeline: the first (non-last) stage stages IntermediateTensors, the last stage hidden states
    assert ranks[0]["pp"]["rows"] == {
        "intermediate_tensors[hidden_states]": 512,
        "intermediate_tensors[residual]": 512,
    }
    assert ranks[1]["pp"]["rows"] == {"hidden_states": 512}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(ENGINE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_no_engine_module_imports_the_offline_part(path: Path) -> None:
    assert not any("_offline" in name for name in _imports(path))
