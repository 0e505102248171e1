"""One rank of tests/test_agreement.py's layout (``DP`` data-parallel engines of ``TP`` tensor-parallel
ranks each), forked together with the others (children/fork_driver.py): one real gloo
group, the real manager on CPU, each scenario of ``SCENARIOS`` (JSON: name, order per rank, MoE, how late
engine 1 comes, the agreement's wait bound)."""

from __future__ import annotations

import json
import logging
import os
import time
import types
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import vllm_staging_plugin
from children.harness import report
from vllm_staging_plugin._engine import agreement, staging
from vllm_staging_plugin._offline import cpu_replay, seams


def main() -> None:
    rank = int(os.environ["RANK"])
    tp, dp = int(os.environ["TP"]), int(os.environ["DP"])
    seams.cudagraph_module()  # vLLM's module is imported: each register() below patches at once
    # Each scenario registers the plugin again; the store counts each rank's agreement rounds across them.
    dist.init_process_group("gloo", rank=rank, world_size=tp * dp, timeout=timedelta(seconds=120))
    store = dist.distributed_c10d._get_default_store()
    cfg = cpu_replay.ReplayConfig(sizes=(1, 2, 4, 8, 16), max_num_seqs=16, hidden_size=64,
                                  tensor_parallel_size=tp, data_parallel_size=dp)  # fmt: skip
    engine = rank // tp  # vLLM's layout: DP engine 0 holds ranks 0 .. tp - 1, engine 1 the next tp
    log: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: log.append(record.getMessage())  # type: ignore[method-assign]
    plugin_logger = logging.getLogger("vllm.staging_plugin")
    plugin_logger.addHandler(handler)
    plugin_logger.setLevel(logging.INFO)
    out: dict[str, Any] = {}
    for name, orders, moe, late, wait in json.loads(os.environ["SCENARIOS"]):
        dist.barrier()  # the harness lines the scenarios up; the plugin itself does not
        os.environ["STAGING_PLUGIN_ORDER"] = orders[rank]
        agreement.WAIT_SECONDS = wait  # the scenario's bound (no variable sets it): read by the next check
        vllm_staging_plugin.register()
        if engine == 1:
            time.sleep(late)  # this DP engine reaches capture later (weights on a slower disk)
        keys_before = store.num_keys()
        with cpu_replay.cpu_stubs(cfg):
            manager = cpu_replay.build_manager(cfg)
            if moe:  # what vLLM's ModelConfig.is_moe answers for a model with experts
                manager.vllm_config.model_config = types.SimpleNamespace(is_moe=True)
            started = time.monotonic()
            result = cpu_replay.run_capture(manager, cfg)
            seconds = time.monotonic() - started
        state = staging.state_of(manager)
        assert state is not None
        out[name] = {"ok": result.ok, "error": result.error, "forwards": result.forwards[::2],
                     "agreed": state.ranks_agreed, "seconds": seconds, "log": list(log),
                     "new_keys": store.num_keys() - keys_before}  # fmt: skip
        log.clear()
        vllm_staging_plugin.unregister()
    dist.barrier()
    report(out)


if __name__ == "__main__":
    main()
