"""Parallel layouts on CPU (the two-GPU runs of issue 6 could not be made): one process per rank.

Each rank builds the real ModelCudaGraphManager with its own role: tensor-parallel ranks 0 and 1, and the
two stages of a two-stage pipeline (the first stage is the non-last rank whose staging is vLLM's
IntermediateTensors; the last stage receives them). Under the ascending order every rank must capture the
same sequence with the same capacity, stock must crash on every rank, and the plugin must hold capacity
rows in whichever buffer the rank stages into.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
pytestmark = [pytest.mark.contract, pytest.mark.subprocess]

RANK = """
import json, os
import vllm_staging_plugin
from vllm_staging_plugin._offline import cpu_replay
rank = int(os.environ["RANK"])
layouts = {
    "tp": cpu_replay.ReplayConfig(hidden_size=256, tensor_parallel_size=2),
    "pp": cpu_replay.ReplayConfig(hidden_size=256, pipeline_parallel_size=2,
                                  first_pp_rank=rank == 0, last_pp_rank=rank == 1),
}
vllm_staging_plugin.register()  # the real route: patch on import, order from STAGING_PLUGIN_ORDER
out = {}
for name, cfg in layouts.items():
    with cpu_replay.cpu_stubs(cfg):
        patched = cpu_replay.run_capture(cpu_replay.build_manager(cfg), cfg)
    vllm_staging_plugin.unregister()
    stock = cpu_replay.replay(cfg, patched=False, reorder=cpu_replay.ascending)
    vllm_staging_plugin.register()
    out[name] = {"ok": patched.ok, "error": patched.error, "capacity": patched.capacity,
                 "forwards": patched.forwards[::2],
                 "rows": {k: b["rows"] for k, b in patched.buffers.items()},
                 "stock_error": stock.error}
print("RESULT:" + json.dumps(out))
"""


def rank_results(ranks: range) -> list[dict[str, Any]]:
    """One process per rank, started together (as vLLM starts its workers)."""
    procs = []
    for rank in ranks:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STAGING_PLUGIN")}
        env |= {"RANK": str(rank), "STAGING_PLUGIN_ORDER": "ascending", "PYTHONHASHSEED": str(rank + 7)}
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT:")]
        assert proc.returncode == 0 and lines, stdout[-2000:] + stderr[-2000:]
        results.append(json.loads(lines[-1].removeprefix("RESULT:")))
    return results


def test_every_rank_captures_the_same_order_with_the_same_capacity() -> None:
    ranks = rank_results(range(2))
    for layout in ("tp", "pp"):
        first, second = (r[layout] for r in ranks)
        assert first["ok"] and second["ok"], (first["error"], second["error"])
        assert first["capacity"] == second["capacity"] == 512
        assert first["forwards"] == second["forwards"]  # identical capture sequence on both ranks
        assert first["forwards"][:51] == sorted(first["forwards"][:51])  # and it is the ascending one
        for r in (first, second):
            assert "must match the existing size" in r["stock_error"]  # stock crashes on every rank
    assert ranks[0]["tp"]["rows"] == ranks[1]["tp"]["rows"] == {"hidden_states": 512}
    # pipeline: the first (non-last) stage stages IntermediateTensors, the last stage hidden states
    assert ranks[0]["pp"]["rows"] == {
        "intermediate_tensors[hidden_states]": 512,
        "intermediate_tensors[residual]": 512,
    }
    assert ranks[1]["pp"]["rows"] == {"hidden_states": 512}
