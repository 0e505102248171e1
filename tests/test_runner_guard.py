"""The V1 runner guard (``V1RunnerGuard``): one warning per process when vLLM builds the V1 runner, an error
in strict mode, odd modules left alone, and vLLM's constructor back exactly on uninstall."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, ClassVar

import pytest
from stable import assert_says

from vllm_staging_plugin._engine import fix, runner_guard
from vllm_staging_plugin._engine.runner_guard import V1_RUNNER_MODULE, V1RunnerError, V1RunnerGuard
from vllm_staging_plugin._engine.settings import Settings


@pytest.mark.parametrize(
    ("order", "ignored"), [("descending", "pre-sizing"), ("max-first", "STAGING_PLUGIN_ORDER=max-first")]
)
def test_the_v1_runner_message_names_the_runner_what_does_not_apply_and_the_switches(
    order: str, ignored: str
) -> None:
    assert_says(
        V1RunnerGuard(Settings(order=order)).message(),
        "vllm-staging-plugin is inactive in this worker: vLLM chose the V1 model runner",
        "(vllm.v1.worker.gpu_model_runner.GPUModelRunner)",
        "Model Runner V2's ModelCudaGraphManager",
        f"{ignored} and receipts do not apply",
        "VLLM_USE_V2_MODEL_RUNNER=1",
        end="Set STAGING_PLUGIN_STRICT=1 to fail instead.",
    )


class _Runner:
    """Stands in for vLLM's V1 ``GPUModelRunner``: records that its own ``__init__`` ran."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, *args: Any) -> None:
        type(self).calls.append(args)


def v1_module() -> ModuleType:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    module.GPUModelRunner = type("GPUModelRunner", (_Runner,), {"__init__": _Runner.__init__, "calls": []})  # type: ignore[attr-defined]
    return module


def test_the_v1_guard_runs_vllms_init_and_warns_once(plugin_log: Any) -> None:
    module = v1_module()
    cls = module.GPUModelRunner
    original = cls.__dict__["__init__"]
    built: list[str] = []
    guard = V1RunnerGuard(Settings(), notify=built.append)
    guard.install(module)
    wrapped = cls.__dict__["__init__"]
    guard.install(module)  # idempotent: wrapped once
    assert cls.__dict__["__init__"] is wrapped is not original
    cls(1, 2)
    cls(3)
    type("CPUModelRunner", (cls,), {})(4)  # a subclass (CPU/XPU runner): no warning, vLLM's init runs
    assert cls.calls == [(1, 2), (3,), (4,)]
    assert plugin_log.warnings == [guard.message()]  # once
    assert built == ["v1-runner-built"] * 2  # the installer is told at every V1 runner (hooks then go)
    assert guard.uninstall() == [] and guard.wrap is None
    assert cls.__dict__["__init__"] is original
    assert guard.uninstall() == []  # nothing held: nothing to restore


def test_strict_mode_refuses_the_v1_runner_before_it_is_built() -> None:
    module = v1_module()
    built: list[str] = []
    guard = V1RunnerGuard(Settings(strict=True), notify=built.append)
    guard.install(module)
    with pytest.raises(V1RunnerError) as caught:
        module.GPUModelRunner(1)
    assert str(caught.value) == guard.message()
    assert module.GPUModelRunner.calls == [] and built == ["v1-runner-built"]
    guard.uninstall()


def test_a_foreign_wrapper_on_the_runner_is_left_and_named(plugin_log: Any) -> None:
    module = v1_module()
    cls = module.GPUModelRunner
    guard = V1RunnerGuard(Settings())
    guard.install(module)
    ours = cls.__dict__["__init__"]
    theirs = functools.wraps(ours)(lambda self, *a: ours(self, *a))
    cls.__init__ = theirs
    assert guard.uninstall() == ["GPUModelRunner.__init__"]
    assert cls.__dict__["__init__"] is theirs
    cls(5)  # through the foreign wrapper and the plugin's inert one: vLLM's init, no warning
    assert cls.calls == [(5,)] and plugin_log.warnings == []


@pytest.mark.parametrize("runner", ["absent", None, "not a class"])
def test_the_v1_guard_leaves_odd_modules_alone(runner: Any) -> None:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    if runner != "absent":
        module.GPUModelRunner = runner  # type: ignore[attr-defined]
    guard = V1RunnerGuard(Settings())
    guard.install(module)  # never breaks the import of vLLM's module
    assert guard.wrap is None
    assert getattr(module, "GPUModelRunner", "absent") == runner


def test_a_class_without_its_own_init_is_not_guarded(plugin_log: Any) -> None:
    module = ModuleType(runner_guard.V1_RUNNER_MODULE)
    module.GPUModelRunner = type("GPUModelRunner", (_Runner,), {})  # type: ignore[attr-defined]
    guard = V1RunnerGuard(Settings())
    guard.install(module)
    assert "__init__" not in module.GPUModelRunner.__dict__ and guard.wrap is None
    guard.install(ModuleType(V1_RUNNER_MODULE))  # no runner class at all: nothing to watch, nothing said
    assert guard.wrap is None and plugin_log.warnings == []


def test_a_runner_the_guard_cannot_wrap_keeps_vllms_import_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    def cannot(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("odd class")

    monkeypatch.setattr(fix, "ClassWrap", cannot)
    module = v1_module()
    original = module.GPUModelRunner.__dict__["__init__"]
    guard = V1RunnerGuard(Settings())
    guard.install(module)  # vLLM's import of the module goes on
    assert guard.wrap is None and module.GPUModelRunner.__dict__["__init__"] is original
    (line,) = plugin_log.warnings
    assert_says(line, "vllm-staging-plugin: cannot watch for vLLM's V1 model runner (TypeError: odd class)",
                end="Set STAGING_PLUGIN_STRICT=1 to fail instead.")  # fmt: skip
    with pytest.raises(V1RunnerError, match=r"strict mode.*TypeError: odd class"):
        V1RunnerGuard(Settings(strict=True)).install(module)
