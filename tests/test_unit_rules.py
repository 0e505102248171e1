"""Pure rules: the sizing rule over every descriptor kind, configuration parsing, built-in policies."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FULL, PIECEWISE, Desc, descs

from vllm_staging_plugin._engine.policies import (
    PolicyError,
    order_descriptors,
    plugin_manager,
    validate_order,
)
from vllm_staging_plugin._engine.settings import ConfigError, Settings, read_settings
from vllm_staging_plugin._engine.sizing import capture_sequence, staging_bytes, staging_capacity


def test_capacity_is_max_over_all_modes_lora_cases_and_dbo_twins() -> None:
    capture_descs = {
        PIECEWISE: descs(PIECEWISE, [1, 8, 64]) + descs(PIECEWISE, [96], num_active_loras=1),
        FULL: [*descs(FULL, [4, 32]), Desc(FULL, 128, num_ubatches=2)],
    }
    assert staging_capacity(capture_descs) == 128


@pytest.mark.parametrize("capture_descs", [{}, {FULL: []}, {PIECEWISE: [], FULL: []}])
def test_capacity_is_zero_when_nothing_is_captured(capture_descs: dict[Any, Any]) -> None:
    assert staging_capacity(capture_descs) == 0


def test_capture_sequence_lists_piecewise_first() -> None:
    seq = capture_sequence({FULL: descs(FULL, [2, 1]), PIECEWISE: descs(PIECEWISE, [4])})
    assert list(seq) == ["PIECEWISE", "FULL"] and seq["FULL"] == [2, 1]


def test_staging_bytes() -> None:
    assert staging_bytes(512, [4096], 2) == 512 * 4096 * 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STAGING_PLUGIN_DISABLE": "maybe"}, "STAGING_PLUGIN_DISABLE='maybe' is not a boolean; allowed"),
        ({"STAGING_PLUGIN_STRICT": "2"}, "STAGING_PLUGIN_STRICT='2' is not a boolean"),
        (
            {"STAGING_PLUGIN_PRESIZE": "half"},
            "STAGING_PLUGIN_PRESIZE='half'; allowed values: on, off, off-allow-crash",
        ),
        (
            {"STAGING_PLUGIN_PRESIZE": "off", "STAGING_PLUGIN_ORDER": "ascending"},
            "STAGING_PLUGIN_ORDER='ascending' needs pre-sizing (STAGING_PLUGIN_PRESIZE=on)",
        ),
    ],
)
def test_bad_configuration_names_variable_and_allowed_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        read_settings(env)
    assert message in str(info.value)


def test_defaults() -> None:
    assert read_settings({}) == Settings()
    s = read_settings(
        {"STAGING_PLUGIN_ORDER": "shuffle:3", "STAGING_PLUGIN_PRESIZE": "0"}
        | {"STAGING_PLUGIN_ORDER": "descending"}
    )
    assert s.presize == "off" and s.order == "descending"
    crash = read_settings({"STAGING_PLUGIN_PRESIZE": "off-allow-crash", "STAGING_PLUGIN_ORDER": "shuffle:3"})
    assert (crash.order_name, crash.order_argument) == ("shuffle", "3")


@pytest.mark.parametrize(
    ("order", "message"),
    [
        (
            "fastest",
            "unknown order policy 'fastest'; allowed values: descending, ascending, max-first, shuffle:SEED",
        ),
        ("shuffle", "shuffle needs an integer seed, as in shuffle:1 (got None)"),
        ("shuffle:x", "shuffle needs an integer seed"),
        ("ascending:2", "ascending takes no argument"),
    ],
)
def test_bad_order_fails_with_variable_and_allowed_values(order: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_order(Settings(order=order))
    assert f"STAGING_PLUGIN_ORDER='{order}'" in str(info.value) and message in str(info.value)


def test_builtin_policies_on_fake_descriptors() -> None:
    given = descs(FULL, [1, 2, 4, 8, 16])

    def tokens(order: str) -> list[int]:
        return [d.num_tokens for d in order_descriptors(Settings(order=order), "FULL", given)]

    assert tokens("descending") == [16, 8, 4, 2, 1]
    assert tokens("ascending") == [1, 2, 4, 8, 16]
    assert tokens("max-first") == [16, 1, 2, 4, 8]
    assert sorted(tokens("shuffle:1")) == [1, 2, 4, 8, 16] and tokens("shuffle:1") == tokens("shuffle:1")
    assert tokens("shuffle:1") != tokens("shuffle:2")


class _DroppingPolicy:
    from vllm_staging_plugin.hookspecs import hookimpl

    @hookimpl
    def staging_order_policies(self) -> list[str]:
        return ["dropper"]

    @hookimpl
    def staging_capture_order(self, policy: str, argument: Any, mode: str, descriptors: Any) -> Any:
        return list(descriptors)[1:] if policy == "dropper" else None


def test_policy_result_must_be_a_permutation() -> None:
    pm = plugin_manager()
    pm.register(_DroppingPolicy(), name="dropper")
    try:
        with pytest.raises(
            PolicyError,
            match="order policy 'dropper' returned 2 descriptors that are not a permutation of the 3",
        ):
            order_descriptors(Settings(order="dropper"), "FULL", descs(FULL, [1, 2, 3]))
    finally:
        pm.unregister(name="dropper")
