"""One rank of tests/test_engine_footprint.py: two such ranks, forked together (children/fork_driver.py),
share a recording store and a gloo group, load the plugin the way vLLM does and capture on the real class;
this rank reports the modules, import hooks, store calls, engine frames and files of each capture."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch.distributed as dist

import vllm_staging_plugin
from children.harness import frames_under, report

ENGINE = str(Path(vllm_staging_plugin.__file__).parent / "_engine")


class Recording(dist.Store):  # type: ignore[misc]
    """The store the ranks share, each call recorded."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[tuple[str, Any]] = []

    def set(self, key: str, value: Any) -> Any:
        self.calls.append(("set", key))
        return self.inner.set(key, value)

    def get(self, key: str) -> Any:
        self.calls.append(("get", key))
        return self.inner.get(key)

    def add(self, key: str, value: int) -> Any:
        self.calls.append(("add", key))
        return self.inner.add(key, value)

    def check(self, keys: list[str]) -> Any:
        self.calls.append(("check", keys))
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: Any = None) -> Any:
        self.calls.append(("wait", keys))
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
        self.calls.append(("compare_set", key))
        return self.inner.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> Any:
        self.calls.append(("delete_key", key))
        return self.inner.delete_key(key)

    def num_keys(self) -> Any:
        return self.inner.num_keys()

    def set_timeout(self, timeout: Any) -> Any:
        return self.inner.set_timeout(timeout)


def plugin_modules() -> list[str]:
    return sorted(m for m in sys.modules if m.startswith("vllm_staging_plugin") or m == "pluggy")


def hooks() -> list[str]:
    return [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("vllm_staging_plugin")]


def engine_frames(action: Callable[[], Any]) -> list[str]:
    """The names of the engine's functions called while ``action`` runs."""
    return frames_under(ENGINE, action)


def main() -> None:
    rank = int(os.environ["RANK"])
    store = Recording(dist.FileStore(os.environ["STORE"], 2))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=120))
    dist.barrier()

    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what every vLLM process does: calls register() through the entry point
    import vllm.v1.worker.gpu.cudagraph_utils as cu  # what model_runner imports: the patch applies here

    out: dict[str, Any] = {"after_register": plugin_modules(), "hooks_after_register": hooks()}
    import replays

    from vllm_staging_plugin._engine import staging
    from vllm_staging_plugin._offline import cpu_replay, seams  # the test's driver, imported only now

    def capture(sizes: tuple[int, ...]) -> tuple[Any, dict[str, Any]]:
        cfg = cpu_replay.ReplayConfig(sizes=sizes, max_num_seqs=max(sizes), hidden_size=64,
                                      tensor_parallel_size=2)  # fmt: skip
        with cpu_replay.cpu_stubs(cfg):
            manager = cpu_replay.build_manager(cfg)
            dist.barrier()
            store.calls.clear()
            results = []
            before = set(sys.modules)
            frames = engine_frames(lambda: results.append(cpu_replay.run_capture(manager, cfg)))
            new = sorted(m for m in set(sys.modules) - before
                         if m.startswith("vllm_staging_plugin") or m == "pluggy")  # fmt: skip
            calls = list(store.calls)
        result = results[0]
        return manager, {"ok": result.ok, "error": result.error, "frames": frames, "store_calls": calls,
                         "new_modules": new, "rows": {k: b["rows"] for k, b in result.buffers.items()},
                         "class_is_vllms": type(manager) is cu.ModelCudaGraphManager}  # fmt: skip

    workdir = tempfile.mkdtemp()
    os.chdir(workdir)
    manager, out["default"] = capture(cpu_replay.DEFAULT_SIZES)
    out["default"]["modules"] = plugin_modules()
    out["hooks_after_capture"] = hooks()

    plan = seams.capture_plan(manager)
    desc = plan[next(m for m in plan if m.name == "FULL")][0]
    manager.graphs[desc] = SimpleNamespace(replay=lambda: None)
    out["replay_frames"] = engine_frames(lambda: manager.run_fullgraph(desc))
    sys.modules.pop("wave", None)
    out["import_frames"] = engine_frames(lambda: __import__("wave"))
    out["files_written"] = os.listdir(workdir)

    import vllm.plugins

    vllm_staging_plugin.unregister()  # the control arm: a process started with an order set
    os.environ["STAGING_PLUGIN_ORDER"] = "ascending"
    vllm.plugins.plugins_loaded = False
    load_general_plugins()
    _, out["ascending"] = capture(cpu_replay.DEFAULT_SIZES)
    out["ascending"]["modules"] = plugin_modules()

    # Parallel layouts under that order: tensor-parallel ranks 0 and 1, and the two stages of a pipeline
    # (the first stage stages vLLM's IntermediateTensors, the last hidden states); stock replayed alike.
    layouts = {
        "tp": cpu_replay.ReplayConfig(hidden_size=256, tensor_parallel_size=2),
        "pp": cpu_replay.ReplayConfig(
            hidden_size=256, pipeline_parallel_size=2, first_pp_rank=rank == 0, last_pp_rank=rank == 1
        ),
    }
    for name, cfg in layouts.items():
        with cpu_replay.cpu_stubs(cfg):
            manager = cpu_replay.build_manager(cfg)
            patched = cpu_replay.run_capture(manager, cfg)
        stock = replays.replay(cfg, patched=False, reorder=replays.ascending)
        rows = {k: b["rows"] for k, b in patched.buffers.items()}
        state = staging.state_of(manager)
        assert state is not None
        out[name] = {"ok": patched.ok, "error": patched.error, "capacity": patched.capacity,
                     "forwards": patched.forwards[::2], "agreed": state.ranks_agreed,
                     "rows": rows, "stock_error": stock.error}  # fmt: skip
    dist.barrier()
    report(out)


if __name__ == "__main__":
    main()
