"""One process, several start-ups: vLLM imported once, then each start-up set up the way a vLLM process
starts (its environment set, the plugin unregistered, vLLM's general plugins loaded afresh). Used by
tests/test_subprocess.py; a third-party policy package is on the path beside it."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from wrappers import is_patched

import vllm_staging_plugin
from children.harness import check, report


def environment(plugins: str, **variables: str) -> None:
    import vllm.plugins

    vllm_staging_plugin.unregister()  # the previous start-up's process is gone
    for key in [k for k in os.environ if k.startswith("STAGING_PLUGIN")]:
        del os.environ[key]
    os.environ.update(variables, VLLM_PLUGINS=plugins)
    vllm.plugins.plugins_loaded = False


def start_up(plugins: str, **variables: str) -> None:
    import vllm.plugins

    environment(plugins, **variables)
    vllm.plugins.load_general_plugins()  # exactly what EngineCore / each worker does at start-up


def capture(ascending: bool = False) -> dict[str, Any]:
    import replays
    import vllm.v1.worker.gpu.cudagraph_utils as cu  # what model_runner imports before building managers

    from vllm_staging_plugin._engine import staging
    from vllm_staging_plugin._offline import cpu_replay

    cfg = cpu_replay.ReplayConfig(hidden_size=64)
    with cpu_replay.cpu_stubs(cfg):
        manager = cpu_replay.build_manager(cfg)
        if ascending:
            replays.reorder_plan(manager, replays.ascending)
        result = cpu_replay.run_capture(manager, cfg)
    cls = cu.ModelCudaGraphManager
    return {
        "patched": is_patched(cls),
        "registered": vllm_staging_plugin._installed is not None,
        "capacity_attr": getattr(staging.state_of(manager), "capacity", None),
        "ok": result.ok, "error": result.error,
        "rows": {k: b["rows"] for k, b in result.buffers.items()},
        "forwards": result.forwards[::2],
    }  # fmt: skip


def started(plugins: str, ascending: bool = False, **variables: str) -> dict[str, Any]:
    """A start-up with ``plugins`` named and ``variables`` set, then a capture."""
    start_up(plugins, **variables)
    return capture(ascending)


def front_end(variable: str, value: str) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs

    environment("vllm_staging_plugin", **{variable: value})
    try:  # what `vllm serve` / `vllm.LLM` build first; vLLM loads general plugins in its __post_init__
        EngineArgs(model="/nonexistent/model-never-read")
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "registered": vllm_staging_plugin._installed is not None}


def shuffled() -> dict[str, list[list[int]]]:
    from vllm_staging_plugin._engine.policies import PolicyRegistry
    from vllm_staging_plugin._engine.settings import Settings
    from vllm_staging_plugin._offline import cpu_replay, seams

    environment("vllm_staging_plugin")
    cfg = cpu_replay.ReplayConfig()
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
    order = PolicyRegistry.load().reordered(Settings(order="shuffle:7"), seams.capture_plan(manager))
    return {m.name: [[d.num_tokens, d.num_active_loras] for d in ds] for m, ds in order.items()}


def main() -> None:
    @check("register before vLLM is imported")
    def _() -> list[str]:
        vllm_staging_plugin.register()
        heavy: list[str] = sorted(m for m in ("torch", "vllm", "pluggy") if m in sys.modules)
        vllm_staging_plugin.unregister()
        return heavy

    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())  # engine processes configure vLLM's log handler before plugins
    check("the plugin named")(functools.partial(started, "vllm_staging_plugin", ascending=True))
    check("another plugin named")(functools.partial(started, "some_other_plugin", ascending=True))
    for order in ("max-first", "evens-first"):
        check(f"order {order}")(functools.partial(started, "vllm_staging_plugin", STAGING_PLUGIN_ORDER=order))
    values = [("STAGING_PLUGIN_ORDER", "fastest"), ("STAGING_PLUGIN_STRICT", "2"),
              ("STAGING_PLUGIN_PRESIZE", "maybe"), ("STAGING_PLUGIN_ORDER", "ascending")]  # fmt: skip
    for variable, value in values:
        check(f"front end {variable}={value}")(functools.partial(front_end, variable, value))
    check("shuffle:7")(shuffled)
    vllm_staging_plugin.unregister()
    report()


if __name__ == "__main__":
    main()
