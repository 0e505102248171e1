"""Behaviour a mutation run found unchecked (docs/testing.md, "Mutation score"): the exact operator-facing
messages, and the edge cases of the helpers behind them. Messages are the plugin's interface when it refuses
or stands down, so a changed word is a changed interface."""

from __future__ import annotations

import enum
import importlib
import importlib.machinery
import importlib.util
import json
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from fakes import FULL, PIECEWISE, config, descs, fresh_class, install_fake_module, make_module

import vllm_staging_plugin
from vllm_staging_plugin._engine import agreement, compat, installer, patch, policies, runner_guard, staging
from vllm_staging_plugin._engine.import_hook import PostImportHook, remove_hooks, when_imported
from vllm_staging_plugin._engine.policies import PolicyError
from vllm_staging_plugin._engine.settings import ConfigError, Settings, read_settings, strict_requested
from vllm_staging_plugin._engine.sizing import capture_sequence
from vllm_staging_plugin._engine.staging import StagingError

MODULE = compat.CUDAGRAPH_MODULE
INACTIVE = (
    "vllm-staging-plugin is inactive, vLLM runs unpatched (stock lazy staging, vLLM's own descending capture "
    "order): {reason}.{ignored} Set STAGING_PLUGIN_STRICT=1 to fail instead."
)


@pytest.mark.parametrize(
    ("order", "ignored"),
    [
        (None, ""),
        ("descending", ""),
        ("", ""),
        ("  ascending ", " STAGING_PLUGIN_ORDER=ascending is NOT applied."),
        ("shuffle:3", " STAGING_PLUGIN_ORDER=shuffle:3 is NOT applied."),
    ],
)
def test_the_stand_down_warning_word_for_word(
    order: str | None, ignored: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    if order is not None:
        monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    patch.refuse("the reason")
    patch.refuse("a second reason")  # one warning per process
    assert plugin_log.warnings == [INACTIVE.format(reason="the reason", ignored=ignored)]


def test_an_explicit_strict_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager refuses with the settings it was built with, even if the environment changed since."""
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    patch.refuse("built lenient", strict=False)  # no raise
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "0")
    with pytest.raises(compat.IncompatibleVllm, match=r"^vllm-staging-plugin \(strict mode\): built strict$"):
        patch.refuse("built strict", strict=True)


def test_standing_down_when_the_class_is_already_stock(plugin_log: Any) -> None:
    """Deactivating a manager whose class is no longer patched (unregister() raced with construction)
    still stands down with the warning instead of failing."""
    manager = SimpleNamespace()
    patch._deactivate(manager, "gone", strict=False)
    assert plugin_log.warnings == [INACTIVE.format(reason="gone", ignored="")]


def _fake_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    return install_fake_module(monkeypatch)


@pytest.mark.parametrize(
    ("order", "advice"),
    [
        (
            "descending",
            "vLLM's own order starts with a smaller descriptor here (see docs/stock-crashes.md), so stock "
            "vLLM would crash at the staging copy too; free GPU memory (lower gpu_memory_utilization).",
        ),
        (
            "ascending",
            "STAGING_PLUGIN_ORDER=ascending captures a 8-row descriptor first; with "
            "STAGING_PLUGIN_ORDER=descending vLLM's own first output usually has capacity rows and needs no "
            "second allocation, or free GPU memory (lower gpu_memory_utilization).",
        ),
    ],
)
def test_the_allocation_failure_message_word_for_word(
    order: str, advice: str, monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    """PIECEWISE (captured first) tops out at 8 rows, FULL needs 16: even vLLM's own order starts short."""
    module = _fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    vllm_staging_plugin.register()
    mocker.patch.object(staging, "presized", side_effect=torch.OutOfMemoryError("CUDA out of memory"))
    capture_descs = {PIECEWISE: descs(PIECEWISE, [8]), FULL: descs(FULL, [16])}
    manager = module.ModelCudaGraphManager(
        config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs
    )
    with pytest.raises(StagingError) as caught:
        manager.capture()
    assert str(caught.value) == (
        "vllm-staging-plugin: allocating hidden_states with 16 rows failed (OutOfMemoryError: CUDA out of "
        "memory); vLLM's own buffer has 8 rows and a later descriptor of this capture needs 16, so the "
        f"capture cannot go on. {advice}"
    )


# ---- agreement ---------------------------------------------------------------------------------


def _plan(order: str, capacity: int, digest: str) -> dict[str, Any]:
    return {"order": order, "presize": "on", "capacity": capacity, "descriptors": 3, "digest": digest,
            "first": {"PIECEWISE": [capacity, 2, 1]}}  # fmt: skip


def test_the_disagreement_message_word_for_word() -> None:
    plans = {2: _plan("descending", 4, "aa"), 0: _plan("descending", 4, "aa"), 1: _plan("ascending", 4, "bb")}
    plans[2] = dict(reversed(list(plans[2].items())))  # same plan, keys in another order: same group
    assert agreement.disagreement(plans) == (
        "vllm-staging-plugin: ranks whose CUDA-graph captures share collectives would capture in different "
        "orders or with different staging capacities, which can deadlock the capture. Set the same "
        "STAGING_PLUGIN_* variables on every node (see docs/many-gpus.md):\n"
        "  ranks [0, 2]: STAGING_PLUGIN_ORDER=descending presize=on capacity=4 descriptors=3 digest=aa "
        "first={'PIECEWISE': [4, 2, 1]}\n"
        "  ranks [1]: STAGING_PLUGIN_ORDER=ascending presize=on capacity=4 descriptors=3 digest=bb "
        "first={'PIECEWISE': [4, 2, 1]}"
    )


# ---- the V1 runner -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "ignored"), [(None, "pre-sizing"), ("max-first", "STAGING_PLUGIN_ORDER=max-first")]
)
def test_the_v1_runner_message_word_for_word(
    order: str | None, ignored: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if order is not None:
        monkeypatch.setenv("STAGING_PLUGIN_ORDER", order)
    assert runner_guard.message() == (
        "vllm-staging-plugin is inactive in this worker: vLLM chose the V1 model runner "
        "(vllm.v1.worker.gpu_model_runner.GPUModelRunner), and the plugin acts only on Model Runner V2's "
        f"ModelCudaGraphManager, so {ignored} and receipts do not apply here. vLLM's log says why it chose "
        "V1; VLLM_USE_V2_MODEL_RUNNER=1 asks for V2. Set STAGING_PLUGIN_STRICT=1 to fail instead."
    )


class _Runner:
    """Stands in for vLLM's V1 ``GPUModelRunner``: records that its own ``__init__`` ran."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, *args: Any) -> None:
        type(self).calls.append(args)


@pytest.fixture
def v1_module() -> Iterator[Any]:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    module.GPUModelRunner = type("GPUModelRunner", (_Runner,), {"__init__": _Runner.__init__, "calls": []})  # type: ignore[attr-defined]
    yield module
    installer.INSTALLER.unwrap(module.GPUModelRunner)


def test_the_v1_guard_runs_vllms_init_and_warns_once(v1_module: Any, plugin_log: Any) -> None:
    cls = v1_module.GPUModelRunner
    original = cls.__dict__["__init__"]
    runner_guard.guard(v1_module)
    runner_guard.guard(v1_module)  # idempotent: wrapped once
    cls(1, 2)
    cls(3)
    type("CPUModelRunner", (cls,), {})(4)  # a subclass (CPU/XPU runner): no warning, vLLM's init runs
    assert cls.calls == [(1, 2), (3,), (4,)]
    assert plugin_log.warnings == [runner_guard.message()]
    assert installer.INSTALLER.unwrap(cls) and not installer.INSTALLER.unwrap(cls)
    assert cls.__dict__["__init__"] is original and cls not in installer.INSTALLER.classes


@pytest.mark.parametrize("runner", ["absent", None, "not a class"])
def test_the_v1_guard_leaves_odd_modules_alone(runner: Any) -> None:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    if runner != "absent":
        module.GPUModelRunner = runner  # type: ignore[attr-defined]
    runner_guard.guard(module)  # never breaks the import of vLLM's module
    assert not installer.INSTALLER.classes
    assert getattr(module, "GPUModelRunner", "absent") == runner


def test_a_class_without_its_own_init_is_not_guarded() -> None:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    module.GPUModelRunner = type("GPUModelRunner", (_Runner,), {})  # type: ignore[attr-defined]
    runner_guard.guard(module)
    assert "__init__" not in module.GPUModelRunner.__dict__


# ---- settings ----------------------------------------------------------------------------------


def test_strict_requested_reads_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STAGING_PLUGIN_STRICT", raising=False)
    assert strict_requested({"STAGING_PLUGIN_STRICT": "1"}) is True
    assert strict_requested({"STAGING_PLUGIN_STRICT": "off"}) is False
    assert strict_requested({"STAGING_PLUGIN_STRICT": "bogus"}) is True  # malformed: fail loudly
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "yes")
    assert strict_requested() is True and strict_requested({}) is False


# ---- the import hook ---------------------------------------------------------------------------


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pkg = tmp_path / "mutpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mutpkg.target"
    for name in ("mutpkg.target", "mutpkg.missing"):
        remove_hooks(name)
    for name in ("mutpkg.target", "mutpkg"):
        sys.modules.pop(name, None)


def test_a_probe_before_the_import_does_not_disarm_the_hook(target: str) -> None:
    """Code that probes with importlib.util.find_spec (vLLM does, for optional modules) before the real
    import must not use up the hook."""
    seen: list[str] = []
    when_imported(target, lambda m: seen.append(m.__name__))
    assert importlib.util.find_spec(target) is not None
    assert importlib.util.find_spec(target) is not None
    importlib.import_module(target)
    assert seen == [target]


def test_a_hooked_module_that_does_not_exist_still_raises_module_not_found(target: str) -> None:
    when_imported("mutpkg.missing", lambda m: None)
    with pytest.raises(ModuleNotFoundError, match=r"mutpkg\.missing"):
        importlib.import_module("mutpkg.missing")


# ---- capture_session: vLLM's profiling estimate, recomputed for profiling receipts (GPU-only path) ------

MIB = 1 << 20


def _profiled(full: int, samples: list[int] | None) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, [1, 2, 4]), FULL: descs(FULL, list(range(1, full + 1)))}
    return SimpleNamespace(_capture_descs=capture_descs, _capture_mem_samples=samples)


def test_profiling_estimate_is_vllms_extrapolation_over_this_window() -> None:
    """measured - sampled + first sample + (FULL descriptors - 1) x max(second sample, 1 MiB), as vLLM's
    _extrapolate_full_graph_memory computes it (0.29+); written out here so a wrong term is seen."""
    pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
    from vllm_staging_plugin._engine.capture_session import _profiling_estimate

    manager = _profiled(full=5, samples=[64 * MIB, 8 * MIB])
    assert _profiling_estimate(manager, 100 * MIB) == 100 * MIB - 72 * MIB + 64 * MIB + 4 * 8 * MIB
    small_second = _profiled(full=3, samples=[64 * MIB, 1024])  # per-graph floor of 1 MiB
    assert _profiling_estimate(small_second, 70 * MIB) == 70 * MIB - 64 * MIB - 1024 + 64 * MIB + 2 * MIB
    no_full = SimpleNamespace(
        _capture_descs={PIECEWISE: descs(PIECEWISE, [1])}, _capture_mem_samples=[5 * MIB, 2 * MIB]
    )
    assert _profiling_estimate(no_full, 9 * MIB) == 9 * MIB - 7 * MIB + 5 * MIB - 2 * MIB  # (0 - 1) x 2 MiB
    assert _profiling_estimate(_profiled(full=2, samples=[2 * MIB, 2 * MIB]), 0) == 0  # never negative
    assert _profiling_estimate(_profiled(full=2, samples=None), 10 * MIB) is None  # not a profiling pass
    assert _profiling_estimate(_profiled(full=2, samples=[MIB]), None) is None  # no CUDA: nothing measured


# ---- agreement: the plan is keyed by mode name; a clean run is silent --------------------------------

GraphMode = enum.Enum("GraphMode", "PIECEWISE FULL")  # like vLLM's CUDAGraphMode: str() is not the name


class _D:
    def __init__(self, n: int) -> None:
        self.num_tokens = n

    def __repr__(self) -> str:
        return f"D({self.num_tokens})"


def _plan_of(modes: dict[Any, list[int]]) -> dict[str, Any]:
    return agreement.plan(Settings(), {m: [_D(n) for n in tokens] for m, tokens in modes.items()})


def test_the_plan_names_modes_and_digests_the_order() -> None:
    by_enum = _plan_of({GraphMode.PIECEWISE: [8, 4, 2, 1]})
    assert by_enum == _plan_of({"PIECEWISE": [8, 4, 2, 1]})  # vLLM's enum or its name: the same plan
    assert by_enum["digest"] != _plan_of({GraphMode.FULL: [8, 4, 2, 1]})["digest"]  # other mode, other plan
    assert by_enum["digest"] != _plan_of({"FULL": [8, 4, 2, 1]})["digest"]
    digest = by_enum.pop("digest")
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert by_enum == {
        "order": "descending", "presize": "on", "capacity": 8, "descriptors": 4,
        "first": {"PIECEWISE": [8, 4, 2]},
    }  # fmt: skip


def test_agreeing_ranks_pass_without_a_word(plugin_log: Any) -> None:
    store = dist.HashStore()
    mine = _plan_of({"FULL": [2, 1]})
    store.set(f"{agreement.KEY_PREFIX}/0-1/0/1", json.dumps(mine))
    assert agreement.check(mine, store, 0, range(2), wait_seconds=5) == 2
    assert plugin_log.warnings == []
    agreed = f"vllm-staging-plugin: ranks [0, 1] agree on the capture plan {mine['digest']}"
    assert plugin_log.at(10) == [agreed]


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
    monkeypatch.setattr(agreement, "WAIT_SECONDS", 5.0)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world["size"])
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    settings, ordered = Settings(order="ascending"), {"FULL": [_D(1), _D(2)]}
    mine = agreement.plan(settings, ordered)
    store.set(f"{agreement.KEY_PREFIX}/2-3/0/2", json.dumps(mine))  # DP=2 x TP=2, dense: own engine only
    assert agreement.check_coupled_ranks(settings, ordered, _parallel(tp=2, dp=2)) == 2
    assert json.loads(store.get(f"{agreement.KEY_PREFIX}/2-3/0/3")) == mine
    monkeypatch.setattr(agreement, "WAIT_SECONDS", 0.1)  # MoE: ranks 0-2 of the block never publish
    silent = r"ranks \[0, 1, 2\] published no capture plan within 0 s"
    with pytest.raises(agreement.AgreementError, match=silent):
        agreement.check_coupled_ranks(settings, ordered, _parallel(tp=2, dp=2, moe=True))
    assert agreement.check_coupled_ranks(settings, ordered, _parallel(tp=1, dp=4)) is None  # alone
    world["size"] = 2  # the smallest coupled world: TP=2, this rank 1 (rank 0 publishes first)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    store.set(f"{agreement.KEY_PREFIX}/0-1/0/0", json.dumps(mine))
    assert agreement.check_coupled_ranks(settings, ordered, _parallel(tp=2)) == 2
    world["size"] = 1
    assert agreement.check_coupled_ranks(settings, ordered, _parallel()) is None


def test_a_model_config_that_cannot_say_counts_as_dense() -> None:
    class Broken:
        @property
        def is_moe(self) -> bool:
            raise ValueError("no hf config")

    assert agreement._model_is_moe(SimpleNamespace(model_config=Broken())) is False
    assert agreement._model_is_moe(SimpleNamespace(model_config=None)) is False
    assert agreement._model_is_moe(SimpleNamespace(model_config=SimpleNamespace(is_moe=1))) is True
    assert agreement.engine_size(SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=3,
                                                 prefill_context_parallel_size=None)) == 6  # fmt: skip


def test_the_silent_rank_message_word_for_word() -> None:
    mine = agreement.plan(Settings(order="max-first"), {"FULL": [_D(2)]})
    with pytest.raises(agreement.AgreementError) as caught:
        agreement.check(mine, dist.HashStore(), 0, range(3), wait_seconds=0.1)
    assert str(caught.value) == (
        "vllm-staging-plugin: ranks [1, 2] published no capture plan within 0 s, while this rank would "
        "capture in order 'max-first'; a rank without the plugin, or with STAGING_PLUGIN_ORDER unset, "
        "captures in vLLM's own order. Install and enable the plugin on every node (VLLM_PLUGINS, "
        "STAGING_PLUGIN_DISABLE) and set STAGING_PLUGIN_ORDER identically everywhere."
    )


def test_state_of_reads_only_the_plugins_state() -> None:
    assert staging.state_of(SimpleNamespace(_vllm_staging="not a state")) is None
    assert staging.state_of(SimpleNamespace()) is None


def test_the_engine_size_counts_prefill_context_ranks() -> None:
    pcp = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=1, prefill_context_parallel_size=2)
    assert agreement.engine_size(pcp) == 4
    older = SimpleNamespace(tensor_parallel_size=2, pipeline_parallel_size=3)  # no PCP before vLLM 0.2x
    assert agreement.engine_size(older) == 6


def test_descriptor_values_are_plain_json() -> None:
    assert agreement._value(GraphMode.FULL) == "FULL" and agreement._value(None) is None
    assert agreement._value(3) == 3 and agreement._value(True) is True and agreement._value(2.5) == 2.5
    assert agreement._value((1, 2)) == "(1, 2)"
    assert agreement.describe(SimpleNamespace(num_tokens=4, cg_mode=GraphMode.FULL)) == [
        "FULL", 4, None, None, None, None, None,
    ]  # fmt: skip


# ---- patch.presized on every value vLLM can stage ----------------------------------------------


def test_presized_passes_through_what_it_cannot_grow() -> None:
    scalar = torch.tensor(1.0)
    assert staging.presized(scalar, 4) is scalar  # 0-dim: nothing to grow
    assert staging.presized(torch.zeros(2), 4).shape == (4,)  # 1-dim grows
    assert staging.presized(None, 4) is None
    other = object()
    assert staging.presized(other, 4) is other
    grown = staging.presized(SimpleNamespace(tensors={"h": torch.zeros(2, 3)}, tag=1), 5)
    assert grown.tensors["h"].shape == (5, 3) and grown.tag == 1  # IntermediateTensors-like


# ---- policies: the mode a policy sees, and a policy name nobody answers --------------------------


class _Recorder:
    from vllm_staging_plugin.hookspecs import hookimpl

    seen: ClassVar[list[str]] = []

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["recorder", "silent"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        if policy != "recorder":
            return None
        self.seen.append(mode)
        return list(descriptors)


@pytest.fixture
def recorder() -> Iterator[list[str]]:
    pm = policies.plugin_manager()
    pm.register(_Recorder(), name="recorder")
    _Recorder.seen.clear()
    yield _Recorder.seen
    pm.unregister(name="recorder")


def test_a_policy_is_told_the_mode_by_name(recorder: list[str]) -> None:
    policies.reordered(Settings(order="recorder"), {GraphMode.PIECEWISE: [_D(1)], "FULL": [_D(2)]})
    assert recorder == ["PIECEWISE", "FULL"]


def test_a_policy_name_no_hook_answers_is_a_policy_error(recorder: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        policies.order_descriptors(Settings(order="silent"), "FULL", [_D(1)])
    assert str(caught.value) == "no order policy answered for 'silent'"


# ---- compat: the exact refusals, the platform name, installed versions ----------------------------


def _init(self: Any, config: Any, uses_mrope: bool, device: Any) -> None: ...


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (None, "vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager is missing (vLLM < 0.18.0?)"),
        ({"__init__": _init}, "ModelCudaGraphManager.capture is not defined on the class"),
        (
            {"__init__": _init, "capture": lambda self: None},
            "ModelCudaGraphManager.__init__ takes (config, uses_mrope, device), expected it to start with "
            "(vllm_config, device, cudagraph_mode, decode_query_len)",
        ),
    ],
)
def test_the_structure_refusals_word_for_word(members: dict[str, Any] | None, message: str) -> None:
    module = make_module(None if members is None else type("ModelCudaGraphManager", (), members))
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.manager_class(module)
    assert str(caught.value) == message


def test_platform_name_and_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    platforms = pytest.importorskip("vllm.platforms")

    class OotPlatform:
        pass

    monkeypatch.setattr(platforms, "current_platform", SimpleNamespace(_enum=SimpleNamespace(name="CUDA")))
    assert compat.platform_name() == "cuda"
    compat.check_platform()
    monkeypatch.setattr(platforms, "current_platform", OotPlatform())
    assert compat.platform_name() == "ootplatform"
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.check_platform()
    assert str(caught.value) == (
        "platform 'ootplatform' is not one of cuda, rocm, cpu, unspecified; out-of-tree platforms subclass "
        "the manager with their own graph handling"
    )


def test_installed_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compat.installed_versions() == {
        "vllm": metadata.version("vllm"),
        "torch": metadata.version("torch"),
    }

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert compat.installed_versions() == {"vllm": None, "torch": None}


def test_validation_asks_the_policy_with_mode_validation(recorder: list[str]) -> None:
    policies.validate_order(Settings(order="recorder"))
    assert recorder == ["validation"]


# ---- settings: aliases and the exact refusals -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "presize"),
    [
        ("1", "on"),
        ("true", "on"),
        (" TRUE ", "on"),
        ("0", "off"),
        ("false", "off"),
        ("Off", "off"),
        ("", "on"),
    ],
)
def test_presize_aliases(raw: str, presize: str) -> None:
    assert read_settings({"STAGING_PLUGIN_PRESIZE": raw}).presize == presize


def test_booleans_ignore_case_and_spaces() -> None:
    assert read_settings({"STAGING_PLUGIN_DISABLE": " TRUE ", "STAGING_PLUGIN_STRICT": "Yes"}).disabled
    assert read_settings({"STAGING_PLUGIN_STRICT": "ON"}).strict
    assert not read_settings({"STAGING_PLUGIN_STRICT": "Off"}).strict


def test_presize_refusals_word_for_word() -> None:
    with pytest.raises(ConfigError) as bad:
        read_settings({"STAGING_PLUGIN_PRESIZE": "Half"})
    assert str(bad.value) == (
        "STAGING_PLUGIN_PRESIZE='Half'; allowed values: on, off, off-allow-crash (1/true = on, 0/false = off)"
    )
    with pytest.raises(ConfigError) as combo:
        read_settings({"STAGING_PLUGIN_PRESIZE": "off", "STAGING_PLUGIN_ORDER": "max-first"})
    assert str(combo.value) == (
        "STAGING_PLUGIN_ORDER='max-first' needs pre-sizing (STAGING_PLUGIN_PRESIZE=on): with vLLM's lazy "
        "staging any order whose first descriptor is not the largest crashes the boot at the staging copy. "
        "Allowed: STAGING_PLUGIN_PRESIZE=on, or STAGING_PLUGIN_PRESIZE=off-allow-crash to reproduce the "
        "crash on purpose, or STAGING_PLUGIN_ORDER=descending"
    )


# ---- patch: return values, the log lines, the capture-time view, growth -----------------------------


def test_patch_and_unpatch_say_whether_they_acted(plugin_log: Any) -> None:
    cls = fresh_class()
    assert patch.patch(cls) is True and patch.patch(cls) is False
    assert plugin_log.at(10) == [f"patched {cls.__module__}.ModelCudaGraphManager (__init__, capture)"]
    assert patch.unpatch(cls) is True and patch.unpatch(cls) is False


def _six(cls: type) -> Any:
    capture_descs = {PIECEWISE: descs(PIECEWISE, [1, 2, 4, 8]), FULL: descs(FULL, [1, 2])}
    return cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)


@pytest.mark.parametrize(
    ("presize", "sizing"),
    [
        ("on", "sized to 8 rows, the largest"),
        ("off-allow-crash", "left to vLLM's lazy sizing (off-allow-crash; largest is 8 rows)"),
    ],
)
def test_the_announcement_word_for_word_once_per_process(
    presize: str, sizing: str, monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    module = _fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", presize)
    vllm_staging_plugin.register()
    _six(module.ModelCudaGraphManager)
    _six(module.ModelCudaGraphManager)
    line = (
        "vllm-staging-plugin: ModelCudaGraphManager staging buffers (hidden_states, aux_hidden_states, "
        f"intermediate_tensors) {sizing} of 6 capture descriptors; capture order: ascending"
    )
    assert plugin_log.at(20) == [line]  # INFO once ...
    assert plugin_log.at(10)[-1] == line  # ... then DEBUG for every later manager


def test_ranks_are_checked_on_the_order_that_will_be_captured(
    monkeypatch: pytest.MonkeyPatch, mocker: Any
) -> None:
    module = _fake_module(monkeypatch)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    spy = mocker.patch.object(agreement, "check_coupled_ranks", return_value=None)
    manager = _six(module.ModelCudaGraphManager)
    manager.capture()
    ((settings, ordered, _),) = [c.args for c in spy.call_args_list]
    assert settings.order == "ascending"
    assert {m: [d.num_tokens for d in ds] for m, ds in ordered.items()} == {
        PIECEWISE: [1, 2, 4, 8],
        FULL: [1, 2],
    }
    spy.reset_mock()
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "descending")
    _six(module.ModelCudaGraphManager).capture()
    assert spy.call_count == 0  # vLLM's own order cannot split ranks: no check, no store round-trip


def test_the_capture_time_view_is_one_look_alike_subclass(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[type] = []

    def capture(self: Any) -> list[int]:
        seen.append(type(self))
        return []

    module = _fake_module(monkeypatch)
    cls = module.ModelCudaGraphManager
    cls.capture = capture
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    _six(cls).capture()
    _six(cls).capture()
    assert seen[0] is seen[1] and seen[0] is not cls and issubclass(seen[0], cls)
    sub = type("ModelCudaGraphManager", (cls,), {})  # an out-of-tree subclass: a view of its own
    _six(sub).capture()
    assert seen[2] is not seen[0] and issubclass(seen[2], sub)
    assert (seen[0].__name__, seen[0].__qualname__, seen[0].__module__) == (
        cls.__name__,
        cls.__qualname__,
        cls.__module__,
    )


def test_growth_keeps_buffers_that_already_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fake_module(monkeypatch)
    vllm_staging_plugin.register()
    manager = _six(module.ModelCudaGraphManager)
    manager.capture(hidden=16, aux=1)
    hidden, aux = manager.hidden_states, manager.aux_hidden_states
    assert staging.held_rows(manager) == 8 and hidden.shape == (8, 16)
    manager.graphs["recorded"] = object()
    manager.capture(hidden=16, aux=1)  # same descriptors after graphs exist: no error, same buffers
    assert manager.hidden_states is hidden and manager.aux_hidden_states[0] is aux[0]
    del manager.graphs  # a release without the attribute: growth still works
    manager._capture_descs[FULL].insert(0, descs(FULL, [16])[0])
    staging.ensure_capacity(manager, staging.state_of(manager))
    assert manager.hidden_states is None and manager.aux_hidden_states == []  # vLLM's initial values
    assert type(manager.aux_hidden_states) is list


def test_the_growth_refusal_word_for_word(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fake_module(monkeypatch)
    vllm_staging_plugin.register()
    manager = _six(module.ModelCudaGraphManager)
    manager.capture()
    manager.graphs["recorded"] = object()
    manager._capture_descs[FULL].insert(0, descs(FULL, [16])[0])
    with pytest.raises(StagingError) as caught:
        manager.capture()
    assert str(caught.value) == (
        "a capture descriptor of 16 tokens was added after CUDA graphs recorded the address of the 8-row "
        "staging buffers; replacing them would corrupt those graphs. Register all descriptors before the "
        "first capture (vLLM rebuilds the manager when it re-initialises the KV cache)."
    )


def test_rows_and_emptiness_of_every_staging_value() -> None:
    t = torch.zeros(3, 2)
    assert staging.rows_of(torch.tensor(1.0)) is None and staging.rows_of(t) == 3
    assert staging.rows_of([]) is None and staging.rows_of([t, torch.zeros(5, 2)]) == 3
    assert staging.rows_of(None) is None and staging.rows_of(SimpleNamespace(tensors=[t])) is None
    assert staging.rows_of(SimpleNamespace(tensors={"h": t})) == 3
    assert staging._is_empty(None) and staging._is_empty([])
    assert not staging._is_empty([t]) and not staging._is_empty(t)


def test_the_staging_slot_only_intercepts_the_first_assignment() -> None:
    slot = staging._StagingSlot("hidden_states")
    assert not hasattr(slot, "__get__")  # set-only: reads never run plugin code
    owner = SimpleNamespace()
    slot.__set__(owner, torch.zeros(2, 3))  # no plugin state: stored as given
    assert owner.__dict__["hidden_states"].shape == (2, 3)
    del owner.__dict__["hidden_states"]
    owner.__dict__[staging.STATE_ATTR] = staging.ManagerState(Settings(), capacity=8)
    slot.__set__(owner, torch.zeros(2, 3))  # vLLM's first, short output: grown
    assert owner.__dict__["hidden_states"].shape == (8, 3)
    later = torch.zeros(2, 3)
    slot.__set__(owner, later)  # a later assignment by vLLM itself: stored as given
    assert owner.__dict__["hidden_states"] is later


def test_capture_sequence_puts_unknown_modes_last() -> None:
    sequence = capture_sequence(
        {"NEW_MODE": descs(FULL, [3]), FULL: descs(FULL, [2]), GraphMode.PIECEWISE: descs(PIECEWISE, [1])}
    )
    assert list(sequence.items()) == [("PIECEWISE", [1]), ("FULL", [2]), ("NEW_MODE", [3])]


def test_the_hooked_loader_answers_like_the_real_one(target: str) -> None:
    """inspect, linecache, pkgutil and coverage tools ask the loader more than exec_module."""
    when_imported(target, lambda m: None)
    spec = importlib.util.find_spec(target)
    assert spec is not None and spec.loader is not None
    loader: Any = spec.loader
    assert loader.get_filename(target).endswith("target.py") and loader.is_package(target) is False
    assert loader.get_source(target) == "VALUE = 1\n"


def test_unregister_leaves_no_capture_view_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fake_module(monkeypatch)
    cls = module.ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    _six(cls).capture()
    assert installer.INSTALLER.classes[cls].views  # the capture built its look-alike subclass
    vllm_staging_plugin.unregister()
    assert cls not in installer.INSTALLER.classes and dict(cls.__dict__).get("__init__") is not None


def test_check_manager_refuses_a_manager_without_descriptors() -> None:
    with pytest.raises(compat.IncompatibleVllm) as caught:
        compat.check_manager(SimpleNamespace())
    assert str(caught.value) == "ModelCudaGraphManager._capture_descs is missing or not a dict"
    with pytest.raises(compat.IncompatibleVllm) as renamed:
        compat.check_manager(SimpleNamespace(_capture_descs={}, aux_hidden_states=[]))
    assert str(renamed.value) == "ModelCudaGraphManager.hidden_states is not set by __init__"


class _Claimer:
    """Another meta-path finder (an editable install, another plugin's hook) that can load the module."""

    def __init__(self, fullname: str) -> None:
        self.fullname = fullname

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        return importlib.machinery.PathFinder.find_spec(fullname, path) if fullname == self.fullname else None


def test_the_hook_goes_ahead_of_finders_already_installed(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "meta_path", [_Claimer(target), *sys.meta_path])
    seen: list[str] = []
    when_imported(target, lambda m: seen.append(m.__name__))
    importlib.import_module(target)
    assert seen == [target]


def test_removing_one_hook_keeps_the_others(target: str) -> None:
    when_imported(target, lambda m: None)
    when_imported("mutpkg.missing", lambda m: None)
    remove_hooks("mutpkg.missing")
    hooked = [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]
    assert target in hooked and "mutpkg.missing" not in hooked
