"""Configuration: every ``STAGING_PLUGIN_*`` variable parsed in one place, read once at ``register()``, and
every bad value refused at ``register()`` with a message naming the variable and the allowed values."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fakes import installed
from stable import assert_says

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, installer
from vllm_staging_plugin._engine.import_hook import PostImportHook
from vllm_staging_plugin._engine.settings import ConfigError, Settings, read_settings

MODULE = compat.CUDAGRAPH_MODULE
BOOLEAN = "allowed values: 0, false, no, off, 1, true, yes, on (or unset)"


def hooks() -> list[str]:
    return [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]


def test_defaults_and_the_order_spec() -> None:
    assert read_settings({}) == Settings()
    assert Settings() == Settings(False, False, "descending", None, "on")
    assert (Settings().order_name, Settings().order_argument) == ("descending", None)
    off = read_settings({"STAGING_PLUGIN_PRESIZE": "0", "STAGING_PLUGIN_ORDER": " descending "})
    assert off.presize == "off" and off.order == "descending"
    crash = read_settings({"STAGING_PLUGIN_PRESIZE": "off-allow-crash", "STAGING_PLUGIN_ORDER": "shuffle:3"})
    assert (crash.order, crash.order_name, crash.order_argument) == ("shuffle:3", "shuffle", "3")
    assert Settings(order="x:").order_argument == ""  # an empty argument is given, not absent
    assert read_settings({"STAGING_PLUGIN_RECEIPTS_DIR": " /tmp/r "}).receipts_dir == Path("/tmp/r")
    assert read_settings({"STAGING_PLUGIN_RECEIPTS_DIR": "  "}).receipts_dir is None


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
    assert not read_settings({"STAGING_PLUGIN_DISABLE": ""}).disabled


@pytest.mark.parametrize(
    ("env", "parts"),
    [
        ({"STAGING_PLUGIN_DISABLE": "maybe"}, ["STAGING_PLUGIN_DISABLE='maybe' is not a boolean", BOOLEAN]),
        ({"STAGING_PLUGIN_STRICT": "2"}, ["STAGING_PLUGIN_STRICT='2' is not a boolean", BOOLEAN]),
        (
            {"STAGING_PLUGIN_PRESIZE": "Half"},
            [
                "STAGING_PLUGIN_PRESIZE='Half'",
                "allowed values: on, off, off-allow-crash (1/true = on, 0/false = off)",
            ],
        ),
        (
            {"STAGING_PLUGIN_PRESIZE": "off", "STAGING_PLUGIN_ORDER": "max-first"},
            [
                "STAGING_PLUGIN_ORDER='max-first' needs pre-sizing (STAGING_PLUGIN_PRESIZE=on)",
                "crashes the boot at the staging copy",
                "Allowed: STAGING_PLUGIN_PRESIZE=on, or STAGING_PLUGIN_PRESIZE=off-allow-crash",
                "or STAGING_PLUGIN_ORDER=descending",
            ],
        ),
    ],
    ids=["disable", "strict", "presize", "presize off with an order"],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_allowed_values(
    env: dict[str, str], parts: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        read_settings(env)
    assert_says(str(caught.value), *parts)


BAD_VALUES = {
    "STAGING_PLUGIN_DISABLE": ({"STAGING_PLUGIN_DISABLE": "maybe"}, BOOLEAN),
    "STAGING_PLUGIN_STRICT": ({"STAGING_PLUGIN_STRICT": "2"}, BOOLEAN),
    "STAGING_PLUGIN_ORDER": (
        {"STAGING_PLUGIN_ORDER": "fastest"},
        "allowed values: descending, ascending, max-first, shuffle:SEED, "
        "full-first, size-descending, interleaved",
    ),
    "STAGING_PLUGIN_ORDER argument": (
        {"STAGING_PLUGIN_ORDER": "shuffle:x"},
        "shuffle needs an integer seed, as in shuffle:1 (got 'x'); allowed values: descending,",
    ),
    "STAGING_PLUGIN_PRESIZE": (
        {"STAGING_PLUGIN_PRESIZE": "half"},
        "allowed values: on, off, off-allow-crash",
    ),
    "STAGING_PLUGIN_PRESIZE=off with an order": (
        {"STAGING_PLUGIN_PRESIZE": "off", "STAGING_PLUGIN_ORDER": "ascending"},
        "Allowed: STAGING_PLUGIN_PRESIZE=on, or STAGING_PLUGIN_PRESIZE=off-allow-crash",
    ),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_variable_value_refuses_at_register(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env, allowed = BAD_VALUES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(installer.RAY_PREFIXES_VARIABLE, raising=False)
    variable = case.split()[0].split("=")[0]
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    with pytest.raises(ConfigError) as caught:
        vllm_staging_plugin.register()
    text = str(caught.value)
    assert text.startswith(f"{variable}=") or f" {variable}=" in text, text
    assert allowed in text
    assert installed() is None and hooks() == []  # nothing half-registered: no installer, no hook ...
    assert installer.RAY_PREFIXES_VARIABLE not in os.environ  # ... and no Ray forwarding


def test_vllms_plugin_loader_passes_the_refusal_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own loader (what every engine process runs at start-up) does not swallow the ConfigError."""
    plugins = pytest.importorskip("vllm.plugins")
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_staging_plugin")
    monkeypatch.setenv("STAGING_PLUGIN_PRESIZE", "half")
    with pytest.raises(ConfigError, match="STAGING_PLUGIN_PRESIZE='half'; allowed values: on, off"):
        plugins.load_general_plugins()


def test_receipts_dir_accepts_any_path_at_register(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STAGING_PLUGIN_RECEIPTS_DIR has no bad value at start-up: a path that cannot be written is a warning
    at capture (test_capture_session.py, the receipt-directory faults), never a refused boot."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STAGING_PLUGIN_RECEIPTS_DIR", str(blocker / "receipts"))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    vllm_staging_plugin.register()
    assert MODULE in hooks()
    assert installed().settings.receipts_dir == blocker / "receipts"


def test_the_environment_is_read_once_at_register(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable changed after register() is not seen until the plugin is registered again."""
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "max-first")
    monkeypatch.setenv("STAGING_PLUGIN_STRICT", "1")
    vllm_staging_plugin.register()  # a second register() is a no-op: it reads nothing
    assert installed().settings == Settings(order="ascending")
    vllm_staging_plugin.unregister()
    vllm_staging_plugin.register()
    assert installed().settings == Settings(order="max-first", strict=True)


@pytest.mark.parametrize(
    ("raw", "value"), [("", "on"), ("on", "on"), (" OFF ", "off"), ("0", "off"), ("true", "on")]
)
def test_the_kda_fix_switch(raw: str, value: str) -> None:
    assert read_settings({"STAGING_PLUGIN_KDA_FIX": raw}).kda_fix == value


def test_a_bad_kda_fix_value_names_the_variable_and_the_values() -> None:
    with pytest.raises(ConfigError) as caught:
        read_settings({"STAGING_PLUGIN_KDA_FIX": "maybe"})
    assert str(caught.value) == (
        "STAGING_PLUGIN_KDA_FIX='maybe'; allowed values: on, off (1/true = on, 0/false = off)"
    )
