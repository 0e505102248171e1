"""Ranks agree on order and capacity before the real capture: a real c10d store, and real gloo groups."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from vllm_staging_plugin import agreement
from vllm_staging_plugin.agreement import AgreementError, check
from vllm_staging_plugin.settings import Settings


class Desc:
    def __init__(self, n: int) -> None:
        self.num_tokens = n

    def __repr__(self) -> str:
        return f"Desc({self.num_tokens})"


def plan_for(order: str, tokens: tuple[int, ...] = (4, 2, 1)) -> dict[str, Any]:
    return agreement.plan(Settings(order=order), {"PIECEWISE": [Desc(n) for n in tokens]})


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(agreement, "_round", itertools.count())
    return dist.HashStore()


def publish(store: Any, rank: int, plan: dict[str, Any]) -> None:
    store.set(f"{agreement.KEY_PREFIX}/0/{rank}", json.dumps(plan, sort_keys=True))


def test_agreeing_ranks_pass(store: Any) -> None:
    publish(store, 1, plan_for("descending"))
    assert check(plan_for("descending"), store, 0, 2, wait_seconds=5) == 2


@pytest.mark.parametrize(
    ("other", "differs"),
    [
        (plan_for("ascending", (1, 2, 4)), "STAGING_PLUGIN_ORDER=ascending"),
        (plan_for("descending", (8, 2, 1)), "capacity=8"),
    ],
    ids=["order", "capacity"],
)
def test_a_split_fails_naming_ranks_and_settings(store: Any, other: dict[str, Any], differs: str) -> None:
    publish(store, 1, other)
    publish(store, 2, plan_for("descending"))
    with pytest.raises(AgreementError) as caught:
        check(plan_for("descending"), store, 0, 3, wait_seconds=5)
    text = str(caught.value)
    assert "ranks [0, 2]: STAGING_PLUGIN_ORDER=descending" in text and "capacity=4" in text
    assert "ranks [1]: " in text and differs in text


def test_the_digest_sees_the_order_not_only_the_policy_name() -> None:
    assert plan_for("x", (4, 2, 1))["digest"] != plan_for("x", (1, 2, 4))["digest"]
    assert plan_for("x", (4, 2, 1)) == plan_for("x", (4, 2, 1))


def test_a_silent_rank_is_a_warning_under_vllms_order(store: Any, plugin_log: Any) -> None:
    check(plan_for("descending"), store, 0, 2, wait_seconds=0.2)
    assert len(plugin_log.warnings) == 1 and "ranks [1] published no capture plan" in plugin_log.warnings[0]


def test_a_silent_rank_is_an_error_under_another_order(store: Any) -> None:
    with pytest.raises(AgreementError, match=r"ranks \[1\] published no capture plan.*'ascending'"):
        check(plan_for("ascending"), store, 0, 2, wait_seconds=0.2)


def test_no_process_group_means_no_check(mocker: Any) -> None:
    spy = mocker.spy(agreement, "check")
    agreement.check_process_group(Settings(order="ascending"), {"PIECEWISE": [Desc(1)]})
    assert spy.call_count == 0 and not dist.is_initialized()


# ---- two real processes, a real gloo group, the real manager ---------------------------------------

RANK = """
import json, os
from datetime import timedelta
import torch.distributed as dist
import vllm_staging_plugin
from vllm_staging_plugin import cpu_replay

dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2, timeout=timedelta(seconds=60))
cfg = cpu_replay.ReplayConfig(sizes=(1, 2, 4, 8, 16), max_num_seqs=16, hidden_size=64)
out = []
for order in (os.environ["FIRST_ORDER"], "descending"):  # a split, then the same order everywhere
    os.environ["STAGING_PLUGIN_ORDER"] = order
    vllm_staging_plugin.register()
    with cpu_replay.cpu_stubs(cfg):
        manager = cpu_replay.build_manager(cfg)
        result = cpu_replay.run_capture(manager, cfg)
    out.append({"ok": result.ok, "error": result.error, "forwards": result.forwards,
                "agreed": manager.__dict__.get("_vllm_staging_ranks_agreed")})
print("RESULT:" + json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.contract
@pytest.mark.subprocess
def test_a_misconfigured_rank_fails_every_rank_before_capture() -> None:
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    base = {k: v for k, v in os.environ.items() if not k.startswith("STAGING_PLUGIN")}
    base |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RANK)],
            env=base | {"RANK": str(rank), "FIRST_ORDER": "ascending" if rank == 1 else "descending"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT:")]
        assert proc.returncode == 0 and lines, stdout[-2000:] + stderr[-3000:]
        results.append(json.loads(lines[-1].removeprefix("RESULT:")))
    for rank, (split, agreed) in enumerate(results):
        assert not split["ok"] and split["error"].startswith("AgreementError: ")
        assert "ranks [0]: STAGING_PLUGIN_ORDER=descending" in split["error"]
        assert "ranks [1]: STAGING_PLUGIN_ORDER=ascending" in split["error"]
        assert split["forwards"] == []  # failed before the first forward of the capture
        assert agreed["ok"] and agreed["forwards"][0] == 16, (rank, agreed)
        assert agreed["agreed"] == 2  # both ranks' plans compared (recorded in receipts as ranks_agreed)


def test_timeout_type_is_what_store_wait_takes() -> None:
    """The store's wait takes a timedelta; a bare float would raise before any rank is compared."""
    store = dist.HashStore()
    store.set("k", "v")
    store.wait(["k"], timedelta(seconds=1))
