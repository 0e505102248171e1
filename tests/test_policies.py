"""Order policies: the built-ins, name ownership (a package is asked only for the names it declared),
validation as part of the hook contract, and broken packages."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
from fakes import FULL, PIECEWISE, Desc, build, descs, install_fake_module
from stable import assert_says

import vllm_staging_plugin
from vllm_staging_plugin._engine import policies
from vllm_staging_plugin._engine.policies import PolicyError, PolicyRegistry
from vllm_staging_plugin._engine.settings import ConfigError, Settings
from vllm_staging_plugin.hookspecs import hookimpl

ALLOWED = "descending, ascending, max-first, shuffle:SEED, full-first, size-descending, interleaved"


def tokens(registry: PolicyRegistry, order: str, given: list[Desc]) -> list[int]:
    return [d.num_tokens for d in registry.order(Settings(order=order), "FULL", given)]


def test_builtin_orders() -> None:
    registry, given = PolicyRegistry([]), descs(FULL, [1, 2, 4, 8, 16])
    assert tokens(registry, "descending", given) == [16, 8, 4, 2, 1]
    assert tokens(registry, "ascending", given) == [1, 2, 4, 8, 16]
    assert tokens(registry, "max-first", given) == [16, 1, 2, 4, 8]
    assert sorted(tokens(registry, "shuffle:1", given)) == [1, 2, 4, 8, 16]
    assert tokens(registry, "shuffle:1", given) == tokens(registry, "shuffle:1", given)
    assert tokens(registry, "shuffle:1", given) != tokens(registry, "shuffle:2", given)
    assert registry.order(Settings(order="max-first"), "FULL", []) == []


def test_ascending_is_stable_and_max_first_takes_the_first_largest() -> None:
    twins = [Desc(FULL, 4, num_ubatches=1), Desc(FULL, 4, num_ubatches=2), Desc(FULL, 1)]
    registry = PolicyRegistry([])
    assert registry.order(Settings(order="ascending"), "FULL", twins) == [twins[2], twins[0], twins[1]]
    assert registry.order(Settings(order="max-first"), "FULL", twins) == [twins[0], twins[2], twins[1]]


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ("fastest", f"unknown order policy 'fastest'; allowed values: {ALLOWED}"),
        ("shuffle", "order policy 'shuffle' (builtin) refused it: ValueError: shuffle needs an integer seed, "
                    "as in shuffle:1 (got None)"),
        ("shuffle:x", "shuffle needs an integer seed"),
        ("ascending:2", "ValueError: ascending takes no argument (got '2')"),
    ],
)  # fmt: skip
def test_a_bad_order_names_the_variable_the_policy_and_the_allowed_values(order: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        PolicyRegistry([]).validate(Settings(order=order))
    assert str(info.value).startswith(f"STAGING_PLUGIN_ORDER='{order}': ") and message in str(info.value)
    if order != "fastest":
        assert str(info.value).endswith(f"allowed values: {ALLOWED}")


def steps(ordered: dict[Any, list[Desc]]) -> list[str]:
    return [f"{d.cg_mode.name[0]}{d.num_tokens}" for lst in ordered.values() for d in lst]


PLAN = {PIECEWISE: descs(PIECEWISE, [512, 256, 128, 8, 4]), FULL: descs(FULL, [384, 256, 48, 9])}


@pytest.mark.parametrize(
    ("order", "key", "expected"),
    [
        ("full-first", FULL, "F384 F256 F48 F9 P512 P256 P128 P8 P4"),
        ("size-descending", PIECEWISE, "P512 F384 P256 F256 P128 F48 F9 P8 P4"),  # ties: PIECEWISE first
        ("interleaved", PIECEWISE, "P512 F384 P256 F256 P128 F48 P8 F9 P4"),
    ],
)
def test_orders_across_the_modes_give_one_list_under_the_first_graphs_mode(
    order: str, key: Any, expected: str
) -> None:
    registry = PolicyRegistry([])
    registry.validate(Settings(order=order))
    ordered = registry.reordered(Settings(order=order), dict(reversed(PLAN.items())))  # FULL key first
    assert list(ordered) == [key] and steps(ordered) == expected.split()
    assert sorted(map(id, ordered[key])) == sorted(id(d) for lst in PLAN.values() for d in lst)
    assert registry.sequence(Settings(order="ascending"), PLAN) is None  # within-mode orders: none
    one_mode = registry.reordered(Settings(order=order), {FULL: PLAN[FULL]})
    assert steps(one_mode) == ["F384", "F256", "F48", "F9"]  # one mode: vLLM's own order
    assert registry.reordered(Settings(order=order), {}) == {}
    assert registry.reordered(Settings(order=order), {FULL: [], PIECEWISE: []}) == {PIECEWISE: [], FULL: []}
    with pytest.raises(ConfigError, match=f"{order} takes no argument"):
        registry.validate(Settings(order=f"{order}:1"))


class Sequencer:
    """A package with one order across the modes (reversed whole), and ``None`` for another name."""

    def __init__(self, result: Any = None) -> None:
        self.result, self.asked = result, []  # type: list[Any] | None, list[Any]

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["backwards", "per-mode"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        return list(descriptors)[::-1]

    @hookimpl
    def staging_capture_sequence(self, policy: str, argument: Any, descriptors: Any) -> Any:
        self.asked.append(
            (policy, argument, {m: [d.num_tokens for d in ds] for m, ds in descriptors.items()})
        )
        if policy == "per-mode":
            return None
        if self.result is not None:
            return self.result(descriptors)
        return [d for ds in descriptors.values() for d in ds][::-1]


def test_a_package_order_across_the_modes_is_told_every_mode_by_name_in_vllms_order() -> None:
    package = Sequencer()
    registry = PolicyRegistry([("seq", package)])
    registry.validate(Settings(order="backwards"))  # no validate hook: asked once with nothing
    assert package.asked == [("backwards", None, {})]
    ordered = registry.reordered(Settings(order="backwards:x"), dict(reversed(PLAN.items())))
    assert package.asked[-1] == (
        "backwards",
        "x",
        {"PIECEWISE": [512, 256, 128, 8, 4], "FULL": [384, 256, 48, 9]},
    )
    assert list(ordered) == [FULL] and steps(ordered)[:2] == ["F9", "F48"]
    per_mode = registry.reordered(Settings(order="per-mode"), PLAN)  # None: one mode at a time
    assert steps(per_mode) == ["P4", "P8", "P128", "P256", "P512", "F9", "F48", "F256", "F384"]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (lambda d: list(d["FULL"]), "order policy 'backwards' returned 4 descriptors that are not a "
                                    "permutation of the 9 it was given for the capture sequence"),
        (lambda d: [*d["FULL"], *d["FULL"], d["PIECEWISE"][0]], "returned 9 descriptors that are not"),
        (lambda d: 1 / 0, "order policy 'backwards' failed for the capture sequence: ZeroDivisionError"),
    ],
)  # fmt: skip
def test_an_order_across_the_modes_must_be_a_permutation(result: Any, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        PolicyRegistry([("seq", Sequencer(result))]).reordered(Settings(order="backwards"), PLAN)
    assert message in str(info.value)
    with pytest.raises(
        ConfigError, match=r"'backwards' \(seq\) refused it"
    ):  # at start-up, if it fails there
        PolicyRegistry([("seq", Sequencer(lambda d: 1 / 0))]).validate(Settings(order="backwards"))


class Greedy:
    """A sloppy package: declares one name, answers every name (and validates nothing it does not own)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["greedy"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        self.asked.append(policy)
        return list(descriptors)[::-1]

    @hookimpl
    def staging_validate_order(self, policy: str, argument: Any) -> None:
        self.asked.append(f"validate {policy}")
        raise ValueError("greedy refuses everything")


def test_a_package_answering_every_name_cannot_take_over_a_builtin() -> None:
    greedy = Greedy()
    registry = PolicyRegistry([("greedy-package", greedy)])
    registry.validate(Settings(order="ascending"))  # the greedy validator is not asked
    assert tokens(registry, "ascending", descs(FULL, [1, 2, 4])) == [1, 2, 4]
    assert greedy.asked == []
    assert tokens(registry, "greedy", descs(FULL, [1, 2, 4])) == [1, 2, 4]  # its own name: it is asked
    assert greedy.asked == ["greedy"]
    assert registry.names() == [*policies.BuiltinPolicies.NAMES, "greedy"]


class Claims:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return self.names

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        return [descriptors[-1], *descriptors[:-1]] if descriptors else []


def test_a_builtin_name_stays_builtin_and_a_shared_name_stays_with_the_first_package(plugin_log: Any) -> None:
    registry = PolicyRegistry([("first", Claims(["rotate", "ascending"])), ("second", Claims(["rotate"]))])
    assert (registry.owner("ascending"), registry.owner("rotate")) == ("builtin", "first")
    assert tokens(registry, "ascending", descs(FULL, [1, 2, 4])) == [1, 2, 4]
    builtin, first = plugin_log.warnings
    assert_says(
        builtin,
        "vllm-staging-plugin: order policy 'ascending' is declared by 'builtin' and by 'first'",
        end="'builtin' keeps it",
    )
    assert_says(
        first,
        "vllm-staging-plugin: order policy 'rotate' is declared by 'first' and by 'second'",
        end="'first' keeps it",
    )


class Raising:
    """Validation by dry run (no validate hook): its IndexError must become a ConfigError."""

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["first-only"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        return [descriptors[0]]


def test_an_exception_during_validation_is_a_config_error_naming_the_policy_and_the_exception() -> None:
    registry = PolicyRegistry([("raising-package", Raising())])
    with pytest.raises(ConfigError) as info:
        registry.validate(Settings(order="first-only"))
    text = str(info.value)
    assert "STAGING_PLUGIN_ORDER='first-only': order policy 'first-only' (raising-package) refused it" in text
    assert "PolicyError: order policy 'first-only' failed for mode validation: IndexError" in text


def test_register_turns_a_policy_exception_into_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [_EntryPoint("raising-package", "raising", Raising())]
    monkeypatch.setattr(
        policies, "entry_points", lambda group: found if group == policies.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "first-only")
    with pytest.raises(ConfigError, match=r"order policy 'first-only' \(raising-package\) refused it"):
        vllm_staging_plugin.register()
    assert vllm_staging_plugin._installed is None


def test_a_validate_hook_is_asked_with_the_argument() -> None:
    greedy = Greedy()
    with pytest.raises(ConfigError, match="ValueError: greedy refuses everything"):
        PolicyRegistry([("g", greedy)]).validate(Settings(order="greedy:7"))
    assert greedy.asked == ["validate greedy"]


class Dropping:
    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["dropper", "duplicator", "silent"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        if policy == "dropper":
            return list(descriptors)[1:]
        if policy == "duplicator":  # same length, not the same objects
            return [descriptors[0], *descriptors[:-1]] if descriptors else []
        return None


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ("dropper", "order policy 'dropper' returned 2 descriptors that are not a permutation of the 3 it "
                    "was given for mode FULL"),
        ("duplicator", "order policy 'duplicator' returned 3 descriptors that are not a permutation of "
                       "the 3"),
        ("silent", "order policy 'silent' (bad) returned nothing for mode FULL"),
    ],
)  # fmt: skip
def test_a_result_must_be_a_permutation(order: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        PolicyRegistry([("bad", Dropping())]).order(Settings(order=order), "FULL", descs(FULL, [1, 2, 3]))
    assert message in str(info.value)


def test_a_policy_is_told_each_mode_by_name() -> None:
    seen: list[str] = []

    class Recorder:
        @hookimpl
        def staging_order_policies(self) -> list[str]:
            return ["recorder"]

        @hookimpl
        def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
            seen.append(mode)
            return list(descriptors)

    class GraphMode(enum.Enum):  # vLLM's CUDAGraphMode is an enum: its str() is not its name
        PIECEWISE = 1

    registry = PolicyRegistry([("r", Recorder())])
    capture_descs = {GraphMode.PIECEWISE: descs(PIECEWISE, [2]), "FULL": []}
    ordered = registry.reordered(Settings(order="recorder"), capture_descs)
    assert seen == ["PIECEWISE", "FULL"] and list(ordered) == [GraphMode.PIECEWISE, "FULL"]


def test_a_package_registered_twice_under_one_name_is_kept_once_without_a_word(plugin_log: Any) -> None:
    registry = PolicyRegistry([("same", Claims(["rotate"])), ("same", Claims(["other"]))])
    assert registry.names()[-1] == "rotate" and "other" not in registry.names()
    assert plugin_log.warnings == []


def test_load_passes_strict_on_to_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [_EntryPoint("bad-names", "bad", BadNames([3]))]
    monkeypatch.setattr(
        policies, "entry_points", lambda group: found if group == policies.ENTRY_POINT_GROUP else []
    )
    assert PolicyRegistry.load().names() == list(policies.BuiltinPolicies.NAMES)
    with pytest.raises(ConfigError, match="order-policy package 'bad-names' cannot be used") as raised:
        PolicyRegistry.load(strict=True)
    assert isinstance(raised.value.__cause__, TypeError)


class _EntryPoint:
    def __init__(self, name: str, value: str, loaded: Any) -> None:
        self.name, self.value, self._loaded = name, value, loaded

    def load(self) -> Any:
        if isinstance(self._loaded, Exception):
            raise self._loaded
        return self._loaded


@pytest.fixture
def broken_and_good_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    found = [
        _EntryPoint("broken", "no_such_module", ModuleNotFoundError("No module named 'no_such_module'")),
        _EntryPoint("good", "good_policies", Dropping()),
    ]
    monkeypatch.setattr(
        policies, "entry_points", lambda group: found if group == policies.ENTRY_POINT_GROUP else []
    )


@pytest.mark.parametrize("policy", ["dropper", "duplicator"])
def test_a_non_permutation_stops_the_capture_before_anything_is_captured(
    policy: str, broken_and_good_packages: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", policy)
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(tmp_path))
    vllm_staging_plugin.register()  # on no descriptors the policy looks fine: validation passes
    manager = build(cls)
    stock_descs = {mode: list(d) for mode, d in manager._capture_descs.items()}
    with pytest.raises(
        PolicyError, match=rf"order policy '{policy}' returned \d descriptors that are not a permutation"
    ):
        manager.capture()
    assert manager.hidden_states is None  # nothing captured, nothing allocated
    assert manager._capture_descs == stock_descs and type(manager) is cls
    assert list(tmp_path.iterdir()) == []  # no receipt of a capture that never started


def test_a_package_failing_to_import_is_skipped_with_one_warning(
    broken_and_good_packages: None, plugin_log: Any
) -> None:
    names = PolicyRegistry.load().names()
    assert "dropper" in names and "descending" in names  # the good package and the built-ins still load
    (warning,) = plugin_log.warnings
    assert_says(
        warning,
        "vllm-staging-plugin: order-policy entry point 'broken' (no_such_module) failed to load",
        "skipped",
        end="No module named 'no_such_module'",
    )


def test_a_package_failing_to_import_is_an_error_in_strict_mode(broken_and_good_packages: None) -> None:
    with pytest.raises(ConfigError) as raised:
        PolicyRegistry.load(strict=True)
    assert_says(
        str(raised.value),
        "order-policy entry point 'broken' (no_such_module) failed to load",
        "STAGING_PLUGIN_STRICT",
        end="ModuleNotFoundError: No module named 'no_such_module'",
    )
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)


class BadNames:
    def __init__(self, declared: Any) -> None:
        self.declared = declared

    @hookimpl
    def staging_order_policies(self) -> Any:
        return self.declared


def test_a_package_may_declare_its_names_as_a_tuple(plugin_log: Any) -> None:
    registry = PolicyRegistry([("tuple-names", BadNames(("evens-first",)))])
    assert registry.owner("evens-first") == "tuple-names" and plugin_log.warnings == []


@pytest.mark.parametrize(
    ("declared", "shown"),
    [([3], "[[3]]"), ("evens-first", "['evens-first']")],
    ids=["a number", "a bare string, not a list"],
)
def test_a_package_declaring_no_names_is_skipped(plugin_log: Any, declared: Any, shown: str) -> None:
    registry = PolicyRegistry([("bad-names", BadNames(declared))])
    assert registry.names() == list(policies.BuiltinPolicies.NAMES)  # no one-letter policies from a string
    (warning,) = plugin_log.warnings
    assert_says(
        warning,
        "vllm-staging-plugin: order-policy package 'bad-names' is skipped",
        f"staging_order_policies returned {shown}, not a list of names",
    )
    with pytest.raises(ConfigError) as raised:
        PolicyRegistry([("bad-names", BadNames(declared))], strict=True)
    assert_says(
        str(raised.value),
        "order-policy package 'bad-names' cannot be used",
        "STAGING_PLUGIN_STRICT",
        end=f"TypeError: staging_order_policies returned {shown}, not a list of names",
    )
