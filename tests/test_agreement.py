"""Coupled ranks agree on order and capacity before the real capture; independent engines never wait.

Unit tests run the check on a real c10d store; the subprocess test runs DP=2 x TP=2 as four processes in
one real gloo group (the default group spanning both data-parallel engines, as vLLM builds it for MoE
data parallelism and under ``external_launcher``), with the real manager and the real capture path.
"""

from __future__ import annotations

import enum
import json
import os
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
from childproc import fork_together, free_port
from stable import assert_says

from vllm_staging_plugin._engine import agreement
from vllm_staging_plugin._engine.agreement import AgreementError, check, check_coupled_ranks, coupled_ranks
from vllm_staging_plugin._engine.settings import Settings


class Desc:
    def __init__(self, n: int, num_reqs: int | None = None) -> None:
        self.num_tokens = n
        self.num_reqs = num_reqs if num_reqs is not None else n

    def __repr__(self) -> str:  # a repr that hides num_reqs: the digest must not rely on it
        return f"Desc({self.num_tokens})"


def plan_for(order: str, tokens: tuple[int, ...] = (4, 2, 1)) -> dict[str, Any]:
    return agreement.plan(Settings(order=order), {"PIECEWISE": [Desc(n) for n in tokens]})


def publish(store: Any, ranks: str, rank: int, plan: dict[str, Any], round_: int = 0) -> None:
    store.set(f"{agreement.KEY_PREFIX}/{ranks}/{round_}/{rank}", json.dumps(plan, sort_keys=True))


def test_agreeing_ranks_pass_without_a_word(plugin_log: Any) -> None:
    store = dist.HashStore()
    mine = plan_for("ascending")
    publish(store, "0-1", 1, mine)
    assert check(mine, store, 0, range(2), wait_seconds=5) == 2
    assert json.loads(store.get(f"{agreement.KEY_PREFIX}/0-1/0/0")) == mine  # this rank's plan, published
    assert plugin_log.warnings == []
    (agreed,) = plugin_log.at(10)
    assert_says(agreed, "vllm-staging-plugin: ranks [0, 1] agree", end=mine["digest"])


def _plan(order: str, capacity: int, digest: str) -> dict[str, Any]:
    return {"order": order, "presize": "on", "capacity": capacity, "descriptors": 3, "digest": digest,
            "first": {"PIECEWISE": [capacity, 2, 1]}}  # fmt: skip


def test_the_disagreement_message_names_each_group_of_ranks_and_what_to_align() -> None:
    plans = {2: _plan("descending", 4, "aa"), 0: _plan("descending", 4, "aa"), 1: _plan("ascending", 4, "bb")}
    plans[2] = dict(reversed(list(plans[2].items())))  # same plan, keys in another order: same group
    assert_says(
        agreement.disagreement(plans),
        "vllm-staging-plugin: ranks whose CUDA-graph captures share collectives would capture in different",
        "deadlock",
        "Set the same STAGING_PLUGIN_* variables on every node",
        "in every worker's environment:\n  ranks [0, 2]: STAGING_PLUGIN_ORDER=descending presize=on "
        "capacity=4 descriptors=3 digest=aa first={'PIECEWISE': [4, 2, 1]}\n",
        end="  ranks [1]: STAGING_PLUGIN_ORDER=ascending presize=on capacity=4 descriptors=3 digest=bb "
        "first={'PIECEWISE': [4, 2, 1]}",
    )


@pytest.mark.parametrize(
    ("other", "differs"),
    [
        (plan_for("max-first", (4, 1, 2)), "STAGING_PLUGIN_ORDER=max-first"),
        (plan_for("ascending", (1, 2, 8)), "capacity=8"),
    ],
    ids=["order", "capacity"],
)
def test_a_split_fails_naming_ranks_and_settings(other: dict[str, Any], differs: str) -> None:
    store = dist.HashStore()
    publish(store, "0-2", 1, other)
    publish(store, "0-2", 2, plan_for("ascending", (1, 2, 4)))
    with pytest.raises(AgreementError) as caught:
        check(plan_for("ascending", (1, 2, 4)), store, 0, range(3), wait_seconds=5)
    text = str(caught.value)
    assert "ranks [0, 2]: STAGING_PLUGIN_ORDER=ascending" in text and "capacity=4" in text
    assert "ranks [1]: " in text and differs in text


GraphMode = enum.Enum("GraphMode", "PIECEWISE FULL")  # like vLLM's CUDAGraphMode: str() is not the name


def _plan_of(modes: dict[Any, list[int]]) -> dict[str, Any]:
    return agreement.plan(Settings(), {m: [Desc(n) for n in tokens] for m, tokens in modes.items()})


def test_the_plan_names_modes_and_digests_the_order() -> None:
    by_enum = _plan_of({GraphMode.PIECEWISE: [8, 4, 2, 1]})
    assert by_enum == _plan_of({"PIECEWISE": [8, 4, 2, 1]})  # vLLM's enum or its name: the same plan
    assert by_enum["digest"] != _plan_of({GraphMode.FULL: [8, 4, 2, 1]})["digest"]  # other mode, other plan
    assert by_enum["digest"] != _plan_of({"FULL": [8, 4, 2, 1]})["digest"]
    assert by_enum["digest"] != _plan_of({"PIECEWISE": [1, 2, 4, 8]})["digest"]  # other order, other plan
    digest = by_enum.pop("digest")
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert by_enum == {
        "order": "descending", "presize": "on", "capacity": 8, "descriptors": 4,
        "first": {"PIECEWISE": [8, 4, 2]},
    }  # fmt: skip


def test_the_digest_reads_descriptor_fields_not_repr() -> None:
    assert plan_for("x", (4, 2, 1)) == plan_for("x", (4, 2, 1))
    one = agreement.plan(Settings(order="x"), {"FULL": [Desc(4, num_reqs=4)]})
    other = agreement.plan(Settings(order="x"), {"FULL": [Desc(4, num_reqs=1)]})
    assert repr(Desc(4, 4)) == repr(Desc(4, 1)) and one["digest"] != other["digest"]


def test_descriptor_values_are_plain_json() -> None:
    assert agreement._value(GraphMode.FULL) == "FULL" and agreement._value(None) is None
    assert agreement._value(3) == 3 and agreement._value(True) is True and agreement._value(2.5) == 2.5
    assert agreement._value((1, 2)) == "(1, 2)"
    assert agreement.describe(SimpleNamespace(num_tokens=4, cg_mode=GraphMode.FULL)) == [
        "FULL", 4, None, None, None, None, None,
    ]  # fmt: skip


def test_the_silent_rank_message_names_the_ranks_the_wait_and_what_to_set() -> None:
    mine = agreement.plan(Settings(order="max-first"), {"FULL": [Desc(2)]})
    with pytest.raises(AgreementError) as caught:
        check(mine, dist.HashStore(), 0, range(3), wait_seconds=0.1)
    assert_says(
        str(caught.value),
        "vllm-staging-plugin: ranks [1, 2] published no capture plan within 0 s",
        "order 'max-first'",
        "STAGING_PLUGIN_ORDER unset",
        "(VLLM_PLUGINS, STAGING_PLUGIN_DISABLE)",
        "STAGING_PLUGIN_ORDER identically",
    )


def test_the_wait_is_bounded_by_the_configured_seconds() -> None:
    """A silent peer costs the configured wait, not the store's default timeout (300 s), then an error."""
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=60))
    started = time.monotonic()
    with pytest.raises(AgreementError, match="within 0 s"):
        check(plan_for("ascending"), store, 0, range(2), wait_seconds=0.3)
    assert 0.25 <= time.monotonic() - started < 10


def test_recapture_in_one_process_uses_the_next_round() -> None:
    store = dist.HashStore()
    publish(store, "0-1", 1, plan_for("ascending"), 0)
    assert check(plan_for("ascending"), store, 0, range(2), wait_seconds=5) == 2
    publish(store, "0-1", 1, plan_for("ascending"), 1)  # the second capture: round 1, and only round 1
    assert check(plan_for("ascending"), store, 0, range(2), wait_seconds=5) == 2
    publish(store, "0-1", 1, plan_for("max-first", (4, 1, 2)), 2)  # the peer's third capture differs
    with pytest.raises(AgreementError):  # compared with round 2, not with an earlier agreeing plan
        check(plan_for("ascending"), store, 0, range(2), wait_seconds=5)
    assert store.add(f"{agreement.KEY_PREFIX}/0-1/rounds/0", 0) == 3  # the store counts this rank's rounds


def test_no_process_group_means_no_check(mocker: Any) -> None:
    spy = mocker.spy(agreement, "check")
    ordered = {"PIECEWISE": [Desc(1)]}
    assert check_coupled_ranks(Settings(order="ascending"), ordered, mocker.Mock()) is None
    assert spy.call_count == 0 and not dist.is_initialized()


def _parallel(tp: int = 1, pp: int = 1, dp: int = 1, moe: bool = False) -> Any:
    parallel = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp,
                               prefill_context_parallel_size=1)  # fmt: skip
    return SimpleNamespace(parallel_config=parallel, model_config=SimpleNamespace(is_moe=moe))


def test_the_coupled_check_publishes_this_ranks_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """What check_coupled_ranks hands to check() inside a real group (the gloo test runs it for real, in
    child processes that a mutation run cannot see)."""
    from torch.distributed import distributed_c10d

    store = dist.HashStore()
    world = {"size": 4}
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world["size"])
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(agreement, "WAIT_SECONDS", 5.0)
    settings, ordered = Settings(order="ascending"), {"FULL": [Desc(1), Desc(2)]}
    mine = agreement.plan(settings, ordered)
    store.set(f"{agreement.KEY_PREFIX}/2-3/0/2", json.dumps(mine))  # DP=2 x TP=2, dense: own engine only
    assert check_coupled_ranks(settings, ordered, _parallel(tp=2, dp=2)) == 2
    assert json.loads(store.get(f"{agreement.KEY_PREFIX}/2-3/0/3")) == mine
    monkeypatch.setattr(agreement, "WAIT_SECONDS", 0.1)  # MoE: ranks 0-2 of the block never publish
    silent = r"ranks \[0, 1, 2\] published no capture plan within 0 s"
    with pytest.raises(AgreementError, match=silent):
        check_coupled_ranks(settings, ordered, _parallel(tp=2, dp=2, moe=True))
    assert check_coupled_ranks(settings, ordered, _parallel(tp=1, dp=4)) is None  # alone
    world["size"] = 2  # the smallest coupled world: TP=2, this rank 1 (rank 0 publishes first)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    store.set(f"{agreement.KEY_PREFIX}/0-1/0/0", json.dumps(mine))
    assert check_coupled_ranks(settings, ordered, _parallel(tp=2)) == 2
    rounds = {r: store.add(f"{agreement.KEY_PREFIX}/{r}/rounds/{rank}", 0) for r, rank in
              (("2-3", 3), ("0-3", 3), ("0-1", 1))}  # fmt: skip
    assert rounds == {"2-3": 1, "0-3": 1, "0-1": 1}
    world["size"] = 1
    assert check_coupled_ranks(settings, ordered, _parallel()) is None


def test_a_model_config_that_cannot_say_counts_as_dense() -> None:
    class Broken:
        @property
        def is_moe(self) -> bool:
            raise ValueError("no hf config")

    assert agreement._model_is_moe(SimpleNamespace(model_config=Broken())) is False
    assert agreement._model_is_moe(SimpleNamespace(model_config=None)) is False
    assert agreement._model_is_moe(SimpleNamespace(model_config=SimpleNamespace(is_moe=1))) is True


def test_the_engine_size_counts_prefill_context_ranks() -> None:
    pcp = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, prefill_context_parallel_size=2)
    assert agreement.engine_size(pcp) == 4
    older = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=3)  # no PCP before vLLM 0.2x
    assert agreement.engine_size(older) == 6
    unset = SimpleNamespace(
        tensor_parallel_size=2, pipeline_parallel_size=3, prefill_context_parallel_size=None
    )
    assert agreement.engine_size(unset) == 6


@pytest.mark.parametrize(
    ("rank", "world", "engine", "dp", "moe", "expected"),
    [
        (0, 2, 2, 1, False, [0, 1]),  # one TP=2 engine: both ranks
        (3, 4, 2, 2, False, [2, 3]),  # DP=2 x TP=2, dense, one default group over both: own engine only
        (1, 4, 2, 2, True, [0, 1, 2, 3]),  # MoE DP: every engine steps in lockstep
        (5, 8, 2, 2, True, [4, 5, 6, 7]),  # two coupled DP blocks in one launch world
        (1, 2, 2, 2, True, [0, 1]),  # elastic EP: the default group holds one engine only
        (0, 4, 4, 1, False, [0, 1, 2, 3]),  # TP=2 x PP=2
        (0, 1, 1, 1, False, [0]),
    ],
)
def test_coupled_ranks(rank: int, world: int, engine: int, dp: int, moe: bool, expected: list[int]) -> None:
    assert list(coupled_ranks(rank, world, engine, dp, moe)) == expected


# ---- DP=2 x TP=2: four processes, one real gloo group, the real manager ------------------------------

# children/agreement_rank.py runs one rank of each scenario.
# Two data-parallel engines of four tensor-parallel ranks each: eight forked processes, one real gloo group.
# MoE couples all eight (as Kimi-K3's eight ranks are coupled); dense couples each engine's four.
ASC = ["ascending"] * 8
SCENARIOS = [  # name, order per rank, MoE, how late engine 1 comes, the agreement's wait bound
    ("default", ["descending"] * 8, False, 4.0, 2.0),
    ("dense", ASC, False, 4.0, 2.0),  # engine 0 must not wait 4 s for engine 1 (it would time out at 2)
    ("moe", ASC, True, 1.5, 30.0),  # coupled: every rank agrees, engine 0 waits for engine 1
    ("moe-split", ["ascending"] * 7 + ["max-first"], True, 0.0, 30.0),  # one rank of eight misconfigured
    ("engine-split", ["ascending", "shuffle:1", *["ascending"] * 6], False, 0.0, 30.0),
]


@pytest.fixture(scope="module")
def dp_tp_runs() -> list[dict[str, Any]]:
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    base = {k: v for k, v in os.environ.items() if not k.startswith("STAGING_PLUGIN")}
    base |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TP": "4", "DP": "2",
             "SCENARIOS": json.dumps(SCENARIOS)}  # fmt: skip
    preload = ["torch.distributed", "vllm.v1.worker.gpu.cudagraph_utils"]  # vLLM's import, once
    return fork_together("agreement_rank", [base | {"RANK": str(rank)} for rank in range(8)], preload)


@pytest.mark.contract
@pytest.mark.subprocess
@pytest.mark.extended  # eight forked ranks: about 30 s of CPU
def test_data_parallel_engines_agree_only_where_coupled(dp_tp_runs: list[dict[str, Any]]) -> None:
    from release import SIZES_STAGING

    for rank, runs in enumerate(dp_tp_runs):
        engine = rank // 4
        default = runs["default"]  # vLLM's order: no check, no store key, no wait, no word
        assert default["ok"] and default["agreed"] is None and default["new_keys"] == 0, default
        staging_line = "(16 rows) itself" if SIZES_STAGING else "sized to 16 rows"  # 0.34.0 sizes itself
        assert default["log"] == [] or all(staging_line in m for m in default["log"])
        assert default["seconds"] < 4.0
        dense = runs["dense"]  # each dense engine's four ranks agree; the other engine is not waited on
        assert dense["ok"] and dense["agreed"] == 4, dense
        assert dense["forwards"][:5] == [1, 2, 4, 8, 16]  # and they captured in the chosen order
        moe = runs["moe"]  # MoE DP: all eight ranks compared, and each captured in the chosen order
        assert moe["ok"] and moe["agreed"] == 8 and moe["forwards"][:5] == [1, 2, 4, 8, 16], moe
        if engine == 0:
            assert moe["seconds"] >= 1.0  # engine 0 waited for engine 1's plan: they are coupled
        split = runs["moe-split"]  # one coupled rank of eight misconfigured: every rank fails, naming it
        assert not split["ok"] and split["error"].startswith("AgreementError: ") and split["forwards"] == []
        assert "ranks [0, 1, 2, 3, 4, 5, 6]: STAGING_PLUGIN_ORDER=ascending" in split["error"]
        assert "ranks [7]: STAGING_PLUGIN_ORDER=max-first" in split["error"]
        inner = runs["engine-split"]  # inside engine 0 only: engine 0 fails, engine 1 boots
        if engine == 0:
            assert not inner["ok"] and "ranks [1]: STAGING_PLUGIN_ORDER=shuffle:1" in inner["error"]
        else:
            assert inner["ok"] and inner["agreed"] == 4, inner
