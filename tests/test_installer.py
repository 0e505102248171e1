"""The installer owns every change the plugin makes to a process; ``unregister()`` undoes exactly those."""

from __future__ import annotations

import functools
import gc
import os
import sys
import types
from typing import Any

import pytest
from fakes import (
    PIECEWISE,
    FakeManager,
    build,
    fix_of,
    fresh_class,
    install_fake_module,
    installed,
    installed_fix,
    make_module,
)
from stable import assert_says
from wrappers import is_patched

import vllm_staging_plugin
from vllm_staging_plugin._engine import compat, registry
from vllm_staging_plugin._engine.fix import V1_RUNNER_BUILT, ClassWrap, RuntimeFix
from vllm_staging_plugin._engine.import_hook import PostImportHook
from vllm_staging_plugin._engine.installer import RAY_PREFIXES_VARIABLE, Installer
from vllm_staging_plugin._engine.kda_fix import KdaFix
from vllm_staging_plugin._engine.runner_guard import V1_RUNNER_MODULE, V1RunnerGuard
from vllm_staging_plugin._engine.settings import Settings
from vllm_staging_plugin._engine.staging_fix import StagingFix


def plugin_hooks() -> list[str]:
    return [f.fullname for f in sys.meta_path if isinstance(f, PostImportHook)]


@pytest.fixture(autouse=True)
def kda_module_loaded(monkeypatch: pytest.MonkeyPatch) -> str:
    """The shared KDA layer's module counts as imported (a stand-in with the layer class), whatever this
    worker imported before, so its hook fires at once and the other tests see only their two hooks; the
    tests of that hook take the stand-in away."""
    name = "no_such_pkg.kimi_gdn_linear_attn"
    module = types.ModuleType(name)
    module.KimiGatedDeltaNetAttention = type(  # type: ignore[attr-defined]
        "KimiGatedDeltaNetAttention", (), {"get_kv_cache_spec": lambda self, vllm_config: None}
    )
    monkeypatch.setattr(KdaFix, "module", name)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def test_the_kda_hook_waits_and_goes_when_a_manager_is_built(
    kda_module_loaded: str, pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model (and its shared KDA layer, if any) is loaded before the first manager: a hook still
    waiting then never fires, and goes with the V1 runner's."""
    monkeypatch.delitem(sys.modules, kda_module_loaded)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    vllm_staging_plugin.register()
    assert sorted(plugin_hooks()) == sorted([compat.CUDAGRAPH_MODULE, V1_RUNNER_MODULE, kda_module_loaded])
    module = make_module(fresh_class())
    next(f for f in sys.meta_path if getattr(f, "fullname", None) == compat.CUDAGRAPH_MODULE).fire(module)
    assert sorted(plugin_hooks()) == sorted([V1_RUNNER_MODULE, kda_module_loaded])  # still waiting
    build(module.ModelCudaGraphManager)
    assert plugin_hooks() == []


@pytest.fixture
def pending_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither module vLLM would import is loaded yet: both hooks wait."""
    monkeypatch.delitem(sys.modules, compat.CUDAGRAPH_MODULE, raising=False)
    monkeypatch.delitem(sys.modules, V1_RUNNER_MODULE, raising=False)


def test_register_waits_for_vllms_import_instead_of_importing(pending_modules: None) -> None:
    """In-process half of the proof (torch and vLLM are loaded here already; the subprocess test
    ``test_register_is_import_light`` shows neither is imported): the module is not imported by register()."""
    vllm_staging_plugin.register()  # only installs the import hooks
    vllm_staging_plugin.register()  # a second register() adds none
    assert compat.CUDAGRAPH_MODULE not in sys.modules and V1_RUNNER_MODULE not in sys.modules
    assert sorted(plugin_hooks()) == sorted([compat.CUDAGRAPH_MODULE, V1_RUNNER_MODULE])
    assert installed_fix("staging").wrap is None


def test_register_then_unregister_leaves_the_process_as_it_was(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.setenv(RAY_PREFIXES_VARIABLE, "MYCO_")
    meta_path, environ = list(sys.meta_path), dict(os.environ)
    vllm_staging_plugin.register()
    assert sorted(plugin_hooks()) == sorted([compat.CUDAGRAPH_MODULE, V1_RUNNER_MODULE])
    vllm_staging_plugin.unregister()
    assert sys.meta_path == meta_path and dict(os.environ) == environ
    assert installed() is None


def test_a_hook_leaves_sys_meta_path_when_it_fires(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    vllm_staging_plugin.register()
    hook = next(
        f for f in sys.meta_path if isinstance(f, PostImportHook) and f.fullname == compat.CUDAGRAPH_MODULE
    )
    module = make_module(fresh_class())
    hook.fire(module)  # what the hooked loader does once vLLM's module body ran
    assert compat.CUDAGRAPH_MODULE not in plugin_hooks() and is_patched(module.ModelCudaGraphManager)
    build(module.ModelCudaGraphManager)  # a V2 manager: the V1 guard will never be needed here
    assert plugin_hooks() == []


def test_a_v1_runner_takes_the_patch_hook_away(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import ModuleType

    vllm_staging_plugin.register()
    v1 = ModuleType(V1_RUNNER_MODULE)
    v1.GPUModelRunner = type("GPUModelRunner", (), {"__init__": lambda self: None})  # type: ignore[attr-defined]
    next(f for f in sys.meta_path if isinstance(f, PostImportHook) and f.fullname == V1_RUNNER_MODULE).fire(
        v1
    )
    v1.GPUModelRunner()  # vLLM chose V1 in this worker: no manager will ever be built
    assert plugin_hooks() == []
    vllm_staging_plugin.unregister()
    assert v1.GPUModelRunner.__dict__["__init__"].__name__ == "<lambda>"  # vLLM's own, back


def test_unwrap_leaves_a_foreign_wrapper_and_makes_its_own_a_pass_through(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    vllm_staging_plugin.register()
    ours = cls.__dict__["capture"]

    @functools.wraps(ours)
    def theirs(self: Any, *args: Any, **kwargs: Any) -> Any:  # another tool instruments after us
        return ours(self, *args, **kwargs)

    cls.capture = theirs  # type: ignore[attr-defined]
    manager = build(cls)  # built while the plugin was active: it holds the plugin's state
    assert "_vllm_staging" in vars(manager)
    vllm_staging_plugin.unregister()
    assert cls.__dict__["capture"] is theirs  # not ours to remove
    assert cls.__dict__["__init__"] is FakeManager.__init__  # ours was still on top: restored
    (warning,) = plugin_log.warnings
    assert_says(
        warning,
        "vllm-staging-plugin: ModelCudaGraphManager.capture was wrapped by another tool",
        "left in place",
        "passes every call straight to vLLM",
    )
    manager._capture_descs[PIECEWISE].sort(key=lambda d: d.num_tokens)
    with pytest.raises(RuntimeError, match="must match the existing size"):  # our wrapper passes through
        manager.capture()
    vllm_staging_plugin.register()  # wrapping again is possible and takes effect
    assert is_patched(cls)


def test_disabled_registers_nothing_but_the_ray_prefix(
    pending_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_DISABLE", "1")
    monkeypatch.delenv(RAY_PREFIXES_VARIABLE, raising=False)
    vllm_staging_plugin.register()
    assert plugin_hooks() == [] and installed_fix("staging") is None
    assert os.environ[RAY_PREFIXES_VARIABLE] == "STAGING_PLUGIN_"  # Ray actors must see the kill switch
    vllm_staging_plugin.unregister()
    assert RAY_PREFIXES_VARIABLE not in os.environ


def test_a_fresh_installer_has_changed_nothing() -> None:
    fresh = Installer(Settings())
    assert fresh.fixes == () and not fresh.installed and fix_of(fresh, StagingFix) is None
    environ = dict(os.environ)
    fresh.uninstall()  # nothing was changed: nothing to restore
    assert dict(os.environ) == environ


def test_install_and_uninstall_own_exactly_their_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StagingFix, "module", "no_such_pkg.cudagraph_utils")
    monkeypatch.setattr(V1RunnerGuard, "module", "no_such_pkg.gpu_model_runner")
    fresh = Installer(Settings())
    fresh.install()
    assert sorted(plugin_hooks()) == ["no_such_pkg.cudagraph_utils", "no_such_pkg.gpu_model_runner"]
    fresh.uninstall()
    assert plugin_hooks() == []


def test_a_v2_manager_unwraps_the_v1_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import ModuleType

    v1 = ModuleType(V1_RUNNER_MODULE)
    original = lambda self: None  # noqa: E731
    v1.GPUModelRunner = type("GPUModelRunner", (), {"__init__": original, "__module__": V1_RUNNER_MODULE})  # type: ignore[attr-defined]
    monkeypatch.delitem(sys.modules, V1_RUNNER_MODULE, raising=False)  # vLLM's own runner: not yet imported
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    vllm_staging_plugin.register()
    guard: V1RunnerGuard = installed_fix("guard")
    guard.install(v1)
    assert v1.GPUModelRunner.__dict__["__init__"] is not original
    build(cls)
    assert v1.GPUModelRunner.__dict__["__init__"] is original and guard.wrap is None


def test_the_foreign_wrapper_warning_names_both_methods_once(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    vllm_staging_plugin.register()
    ours = {name: cls.__dict__[name] for name in ("__init__", "capture")}
    for name, wrapper in ours.items():  # another tool wraps both after us
        setattr(cls, name, functools.wraps(wrapper)(lambda self, *a, _w=wrapper, **k: _w(self, *a, **k)))
    vllm_staging_plugin.unregister()
    (warning,) = plugin_log.warnings
    assert_says(
        warning,
        "vllm-staging-plugin: ModelCudaGraphManager.__init__ and ModelCudaGraphManager.capture "
        "were wrapped by another tool",
        "left in place",
        "passes every call straight to vLLM",
    )
    manager = build(cls)  # through the foreign __init__ and the plugin's inert one: no plugin state
    assert "_vllm_staging" not in vars(manager)
    manager._capture_descs[PIECEWISE].sort(key=lambda d: d.num_tokens)
    with pytest.raises(RuntimeError, match="must match the existing size"):
        manager.capture()


def test_a_ray_variable_changed_in_a_given_mapping_is_not_restored_in_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RAY_PREFIXES_VARIABLE, raising=False)
    mapping = {"STAGING_PLUGIN_ORDER": "ascending"}
    fresh = Installer(Settings(disabled=True), environ=mapping)
    fresh.install()
    assert mapping[RAY_PREFIXES_VARIABLE] == "STAGING_PLUGIN_"
    monkeypatch.setenv(RAY_PREFIXES_VARIABLE, "MINE_")
    fresh.uninstall()  # it changed a mapping, not this process's environment
    assert os.environ[RAY_PREFIXES_VARIABLE] == "MINE_"


def test_unregister_after_the_operator_removed_the_ray_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    monkeypatch.delenv(RAY_PREFIXES_VARIABLE, raising=False)
    vllm_staging_plugin.register()
    del os.environ[RAY_PREFIXES_VARIABLE]
    vllm_staging_plugin.unregister()  # nothing to remove, and no error
    assert RAY_PREFIXES_VARIABLE not in os.environ


def test_unregister_after_managers_were_built(monkeypatch: pytest.MonkeyPatch, plugin_log: Any) -> None:
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    captured, fresh = build(cls), build(cls)
    captured.capture()
    assert captured.hidden_states.shape == (8, 8)
    vllm_staging_plugin.unregister()
    assert not is_patched(cls) and plugin_hooks() == []
    assert captured.hidden_states.shape == (8, 8) and type(captured) is cls  # its buffers stay valid
    assert fresh.capture() == [8, 4, 2, 1, 2, 1]  # built patched, captured stock: vLLM's order, lazy staging
    assert fresh.hidden_states.shape == (8, 8)
    assert type(build(cls)) is cls and plugin_log.warnings == []
    vllm_staging_plugin.register()  # and it can come back
    assert is_patched(cls)


def test_unregister_leaves_no_capture_view_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The look-alike subclass a capture runs in belongs to the process's patch and goes with it."""
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    manager = build(cls)
    manager.capture()
    assert len(cls.__subclasses__()) == 1  # the capture built its view
    vllm_staging_plugin.unregister()
    gc.collect()
    assert cls.__subclasses__() == [] and type(manager) is cls


def test_install_is_idempotent_and_uninstall_lets_it_install_again(plugin_log: Any) -> None:
    fresh = Installer(Settings(disabled=True, order="ascending"), environ={})
    fresh.install()
    fresh.install()
    (disabled,) = plugin_log.warnings
    assert_says(
        disabled,
        "vllm-staging-plugin is disabled (STAGING_PLUGIN_DISABLE)",
        end="STAGING_PLUGIN_ORDER=ascending is ignored and vLLM captures in its own descending order",
    )
    fresh.uninstall()
    fresh.install()
    assert plugin_log.warnings == [disabled, disabled]


def test_the_patch_orders_with_the_registry_register_validated_with(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    installer = installed()
    fix = fix_of(installer, StagingFix)
    assert installer.policies is not None and fix.policies is installer.policies
    build(cls).capture()
    assert fix.policies is installer.policies  # the fix did not load a registry of its own


def test_version_without_install_metadata_says_unknown(tmp_path: Any) -> None:
    """A copy without install metadata (``-S``: no site-packages) says ``0+unknown``. Receipts take
    ``__version__`` at import of the capture session, so it may not raise."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(vllm_staging_plugin.__file__).parent.parent
    ask = "import sys; sys.path.insert(0, sys.argv[1]); import vllm_staging_plugin as p; print(p.__version__)"
    copy = tmp_path / "vendored"
    shutil.copytree(root / "vllm_staging_plugin", copy / "vllm_staging_plugin",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(root / "pyproject.toml", copy / "pyproject.toml")  # a source tree reads the same
    run = subprocess.run([sys.executable, "-S", "-c", ask, str(copy)], cwd=copy,  # no egg-info in cwd
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == vllm_staging_plugin._engine.UNKNOWN_VERSION


def test_a_prefix_the_operator_listed_is_never_removed() -> None:
    environ = {"STAGING_PLUGIN_ORDER": "ascending", RAY_PREFIXES_VARIABLE: "STAGING_PLUGIN_"}
    fresh = Installer(Settings(disabled=True), environ=environ)
    fresh.install()
    fresh.uninstall()
    assert environ[RAY_PREFIXES_VARIABLE] == "STAGING_PLUGIN_"


def test_the_operators_list_gets_the_prefix_and_comes_back_exactly_as_written_once() -> None:
    env = {"STAGING_PLUGIN_ORDER": "ascending", RAY_PREFIXES_VARIABLE: " A_ , B_"}
    fresh = Installer(Settings(disabled=True), environ=env)
    fresh.install()
    assert env[RAY_PREFIXES_VARIABLE] == "A_,B_,STAGING_PLUGIN_"
    fresh.uninstall()
    fresh.uninstall()  # nothing left to restore, and no error
    assert env == {"STAGING_PLUGIN_ORDER": "ascending", RAY_PREFIXES_VARIABLE: " A_ , B_"}
    untouched: dict[str, str] = {}
    Installer(Settings(disabled=True), environ=untouched).install()  # no plugin variable: no prefix
    assert untouched == {}


def test_suspended_gives_vllm_its_own_class_and_then_the_same_wrappers(
    monkeypatch: pytest.MonkeyPatch, plugin_log: Any
) -> None:
    """An offline tool's block: vLLM's functions in the class, the hooks and the Ray variable untouched,
    then the very same wrapper functions back (one plugin layer per class, and nothing else changed)."""
    cls = install_fake_module(monkeypatch).ModelCudaGraphManager
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    ours = {name: cls.__dict__[name] for name in ("__init__", "capture")}
    hooks, environ = list(sys.meta_path), dict(os.environ)
    with vllm_staging_plugin.suspended():
        assert not is_patched(cls) and cls.__dict__["__init__"] is FakeManager.__init__
        assert "_vllm_staging" not in vars(build(cls))
        assert sys.meta_path == hooks and dict(os.environ) == environ
    assert {name: cls.__dict__[name] for name in ours} == ours and "_vllm_staging" in vars(build(cls))
    assert plugin_log.warnings == []  # nothing was refused on the way back
    vllm_staging_plugin.unregister()
    with vllm_staging_plugin.suspended():  # nothing registered: nothing to do
        assert not is_patched(cls)


def test_a_fourth_fix_is_one_class_and_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a fix touches no other fix and not the installer: its class and one registry entry do."""

    class Target:
        def step(self) -> str:
            return "vllm"

    module = types.ModuleType("vllm_fourth_module")
    module.Target = Target  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    retired: list[str] = []

    class Fourth(RuntimeFix):
        module = "vllm_fourth_module"
        target = "Target"
        methods = ("step",)
        retired_by = frozenset({V1_RUNNER_BUILT})

        def wrappers(self, wrap: ClassWrap) -> dict[str, Any]:
            original = wrap.original["step"]

            @functools.wraps(original)
            def step(obj: Any) -> str:
                return f"plugin+{original(obj)}" if wrap.live else str(original(obj))

            return {"step": step}

        def retire(self) -> None:
            retired.append(type(self).__name__)
            super().retire()

    monkeypatch.setattr(registry, "FIXES", (*registry.FIXES, Fourth))
    installer = Installer(Settings())
    try:
        installer.install()
        assert Target().step() == "plugin+vllm" and isinstance(installer.fixes[-1], Fourth)
        installer.notify(V1_RUNNER_BUILT)  # another fix's event reaches it
        assert retired == ["Fourth"]
    finally:
        installer.uninstall()
    assert Target().step() == "vllm" and not hasattr(vars(Target)["step"], "__wrapped__")
