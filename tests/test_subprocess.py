"""Fresh processes: vLLM's own plugin loader finds the entry point; third-party policies; rank determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.plugins")
pytestmark = pytest.mark.subprocess
ROOT = Path(__file__).resolve().parents[1]

BOOT = """
import json, os
try:  # engine processes configure vLLM's log handler before loading plugins (0.33.0)
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    configure_logging(LoggingConfig())
except ImportError:
    pass
from vllm.plugins import load_general_plugins
load_general_plugins()  # exactly what EngineCore / each worker does at start-up
import vllm.v1.worker.gpu.cudagraph_utils as cu  # what model_runner imports before building managers
from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._engine import patch, staging
cfg = cpu_replay.ReplayConfig(hidden_size=64)
order = os.environ.get("REPLAY_ORDER")
with cpu_replay.cpu_stubs(cfg):
    manager = cpu_replay.build_manager(cfg)
    result = cpu_replay.run_capture(manager, cfg, cpu_replay.ascending if order == "ascending" else None)
print("RESULT:" + json.dumps({
    "patched": patch.is_patched(cu.ModelCudaGraphManager),
    "capacity_attr": getattr(staging.state_of(manager), "capacity", None),
    "ok": result.ok, "error": result.error,
    "rows": {k: b["rows"] for k, b in result.buffers.items()},
    "forwards": result.forwards[::2],
}))
"""


def run(code: str, env: dict[str, str], extra_path: Path | None = None) -> dict[str, Any]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGING_PLUGIN", "VLLM_PLUGINS"))}
    full_env.update(env)
    if extra_path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(extra_path), full_env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT:"))
    result["log"] = proc.stdout + proc.stderr
    return result


def test_entry_point_is_installed() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("vllm_staging_plugin") == "vllm_staging_plugin:register", (
        "install the package (pip install -e .) so vLLM can discover it"
    )


def test_vllm_discovers_and_applies_the_plugin() -> None:
    result = run(BOOT, {"VLLM_PLUGINS": "vllm_staging_plugin", "REPLAY_ORDER": "ascending"})
    assert result["patched"] and result["capacity_attr"] == 512
    assert result["ok"] and result["rows"] == {"hidden_states": 512}
    assert "sized to 512 rows" in result["log"]


def test_vllm_plugins_naming_another_plugin_leaves_vllm_stock() -> None:
    result = run(BOOT, {"VLLM_PLUGINS": "some_other_plugin", "REPLAY_ORDER": "ascending"})
    assert not result["patched"] and result["capacity_attr"] is None
    assert not result["ok"] and "must match the existing size" in result["error"]


THIRD_PARTY = """
from vllm_staging_plugin.hookspecs import hookimpl

@hookimpl
def staging_order_policies():
    return ["max-first", "evens-first"]

@hookimpl
def staging_capture_order(policy, argument, mode, descriptors):
    if policy == "max-first":  # overrides the built-in: the largest, then DEScending (vLLM's order)
        return list(descriptors)
    if policy == "evens-first":
        evens = [d for d in descriptors if d.num_tokens % 2 == 0]
        return evens + [d for d in descriptors if d.num_tokens % 2]
    return None
"""


def test_third_party_policy_through_entry_point(tmp_path: Path) -> None:
    (tmp_path / "my_policies.py").write_text(THIRD_PARTY)
    dist = tmp_path / "my_policies-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm_staging_plugin.order_policies]\nbroken = no_such_policy_module\nmine = my_policies\n"
    )
    env = {"VLLM_PLUGINS": "vllm_staging_plugin"}
    overridden = run(BOOT, env | {"STAGING_PLUGIN_ORDER": "max-first"}, tmp_path)
    assert overridden["ok"] and overridden["forwards"][:3] == [512, 496, 480]  # the override ran
    assert "order-policy entry point 'broken' (no_such_policy_module) failed to load" in overridden["log"]
    evens = run(BOOT, env | {"STAGING_PLUGIN_ORDER": "evens-first"}, tmp_path)
    assert evens["ok"] and evens["rows"] == {"hidden_states": 512}
    piecewise = evens["forwards"][:51]
    assert piecewise[-1] == 1 and all(n % 2 == 0 for n in piecewise[:50])


SHUFFLE = """
from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._engine.policies import reordered
from vllm_staging_plugin._engine.settings import read_settings
from vllm_staging_plugin._engine import staging
import json
cfg = cpu_replay.ReplayConfig()
with cpu_replay.cpu_stubs(cfg):
    manager = cpu_replay.build_manager(cfg)
order = reordered(read_settings(), manager._capture_descs)
as_lists = {m.name: [(d.num_tokens, d.num_active_loras) for d in ds] for m, ds in order.items()}
print("RESULT:" + json.dumps(as_lists))
"""


def test_shuffle_is_identical_across_processes_and_ranks() -> None:
    runs = [
        run(SHUFFLE, {"STAGING_PLUGIN_ORDER": "shuffle:7", "RANK": str(rank), "PYTHONHASHSEED": str(seed)})
        for rank, seed in ((0, 1), (1, 99))
    ]
    for r in runs:
        r.pop("log")
    assert runs[0] == runs[1]
    assert runs[0]["PIECEWISE"] != sorted(runs[0]["PIECEWISE"], reverse=True)


def test_register_is_import_light() -> None:
    code = """
    import sys, json
    import vllm_staging_plugin
    vllm_staging_plugin.register()
    heavy = sorted(m for m in ("torch", "vllm", "pluggy") if m in sys.modules)
    print("RESULT:" + json.dumps({"heavy": heavy}))
    """
    assert run(code, {})["heavy"] == []


FRONT_END = """
import json, os
from vllm.engine.arg_utils import EngineArgs
import vllm.plugins
outcomes = []
for variable, value in json.loads(os.environ["CASES"]):  # one vLLM import for every case
    os.environ.pop("STAGING_PLUGIN_ORDER", None)
    os.environ[variable] = value
    vllm.plugins.plugins_loaded = False  # each EngineArgs below loads the plugins afresh, as a new process
    try:  # what `vllm serve` / `vllm.LLM` build first; vLLM loads general plugins in its __post_init__
        EngineArgs(model="/nonexistent/model-never-read")
        outcomes.append({"raised": None})
    except Exception as exc:
        outcomes.append({"raised": type(exc).__name__, "message": str(exc)})
    del os.environ[variable]
print("RESULT:" + json.dumps({"outcomes": outcomes}))
"""

BAD_VALUES = [
    ("STAGING_PLUGIN_ORDER", "fastest", "STAGING_PLUGIN_ORDER='fastest'"),
    ("STAGING_PLUGIN_STRICT", "2", "STAGING_PLUGIN_STRICT='2'"),
    ("STAGING_PLUGIN_PRESIZE", "maybe", "STAGING_PLUGIN_PRESIZE='maybe'"),
]


def test_bad_values_stop_vllm_start_up_before_any_model_is_read() -> None:
    """vLLM's own front-end path: EngineArgs loads the plugin, which rejects each bad value at once; a
    valid value (the last case) lets start-up go on, so the check is not vacuous."""
    cases = [[v, value] for v, value, _ in BAD_VALUES] + [["STAGING_PLUGIN_ORDER", "ascending"]]
    result = run(FRONT_END, {"VLLM_PLUGINS": "vllm_staging_plugin", "CASES": json.dumps(cases)})
    *bad, good = result["outcomes"]
    for (_, _, named), outcome in zip(BAD_VALUES, bad, strict=True):
        assert outcome["raised"] == "ConfigError", outcome
        assert named in outcome["message"] and "allowed values" in outcome["message"]
    assert good["raised"] is None
