"""A stand-in for vLLM's ModelCudaGraphManager with the same structure and the same lazy staging.

Its capture loop mirrors vLLM 0.33.0's ``store_capture_output``: allocate ``empty_like`` of the first
output when the buffer is empty, then copy ``[:num_tokens]``. Unit tests use it for speed and faults;
the claims rest on the contract tests against the real class.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Desc:
    cg_mode: str
    num_tokens: int
    num_active_loras: int = 0
    num_ubatches: int = 1


class Mode(str):
    @property
    def name(self) -> str:
        return str(self)


PIECEWISE, FULL = Mode("PIECEWISE"), Mode("FULL")


def descs(mode: Mode, sizes: list[int], **extra: Any) -> list[Desc]:
    return [Desc(mode, n, **extra) for n in sorted(sizes, reverse=True)]


class FakeManager:
    def __init__(
        self, vllm_config: Any, device: Any, cudagraph_mode: Any, decode_query_len: int, **kwargs: Any
    ) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.cudagraph_mode = Mode(str(cudagraph_mode))
        self.is_last_pp_rank = True
        self.graphs: dict[Any, Any] = {}
        self._max_full_descs_to_capture: int | None = None
        self._capture_descs: dict[Mode, list[Desc]] = kwargs.get("capture_descs", {})
        self.hidden_states: torch.Tensor | None = None
        self.aux_hidden_states: list[torch.Tensor] = []
        self.intermediate_tensors: Any = None
        self.use_aux_hidden_state_outputs = False

    def _descs_for(self, mode: Mode) -> list[Desc]:
        return self._capture_descs.get(mode, [])

    def capture(self, hidden: int = 8, aux: int = 0) -> list[int]:
        self.use_aux_hidden_state_outputs = aux > 0
        seen = []
        for mode in (PIECEWISE, FULL):
            for desc in self._descs_for(mode):
                n = desc.num_tokens
                seen.append(n)
                out = torch.ones(n, hidden)
                if self.hidden_states is None:
                    self.hidden_states = torch.empty_like(out)
                self.hidden_states[:n] = out
                if aux and not self.aux_hidden_states:
                    self.aux_hidden_states = [torch.empty_like(out) for _ in range(aux)]
                for buf in self.aux_hidden_states if aux else []:
                    buf[:n] = out
        return seen


def make_module(cls: type | None = FakeManager) -> types.ModuleType:
    module = types.ModuleType("vllm.v1.worker.gpu.cudagraph_utils")
    if cls is not None:
        module.ModelCudaGraphManager = cls  # type: ignore[attr-defined]
    return module


def install_fake_module(monkeypatch: Any) -> types.ModuleType:
    """A fresh fake class where register() looks for vLLM's module, on a supported platform."""
    from vllm_staging_plugin._engine import compat

    module = make_module(fresh_class())
    monkeypatch.setitem(sys.modules, compat.CUDAGRAPH_MODULE, module)
    monkeypatch.setattr(compat, "platform_name", lambda: "cuda")
    return module


def fresh_class(**overrides: Any) -> type:
    """A new subclass-free copy of FakeManager (so patching one test's class leaks nowhere)."""
    return type(
        "ModelCudaGraphManager",
        (FakeManager,),
        {"__init__": FakeManager.__init__, "capture": FakeManager.capture, **overrides},
    )


def build(cls: type, piecewise: list[int] | None = None, full: list[int] | None = None) -> Any:
    """A manager of ``cls`` with six descriptors by default: PIECEWISE 8, 4, 2, 1 and FULL 2, 1."""
    capture_descs = {
        PIECEWISE: descs(PIECEWISE, [1, 2, 4, 8] if piecewise is None else piecewise),
        FULL: descs(FULL, [1, 2] if full is None else full),
    }
    return cls(config(), "cpu", "FULL_AND_PIECEWISE", 1, capture_descs=capture_descs)


def config() -> Any:
    sizes = [1, 2, 4, 8]
    compilation = types.SimpleNamespace(cudagraph_capture_sizes=sizes)
    return types.SimpleNamespace(compilation_config=compilation, model_config=None)


def installed() -> Any:
    """The process's installer that ``register()`` built (None before it, or after ``unregister()``)."""
    import vllm_staging_plugin

    return vllm_staging_plugin._installed


def installed_fix(name: str) -> Any:
    """The registered installer's fix: ``staging``, ``kda`` or ``guard`` (None: the settings leave it out)."""
    from vllm_staging_plugin._engine.kda_fix import KdaFix
    from vllm_staging_plugin._engine.runner_guard import V1RunnerGuard
    from vllm_staging_plugin._engine.staging_fix import StagingFix

    kind = {"staging": StagingFix, "kda": KdaFix, "guard": V1RunnerGuard}[name]
    return fix_of(installed(), kind)


def fix_of(installer: Any, kind: type) -> Any:
    """``installer``'s fix of class ``kind`` (None when the settings leave it out)."""
    return next((f for f in installer.fixes if isinstance(f, kind)), None)


def policy_order(order: str, mode: str, descriptors: Any) -> list[Any]:
    """The descriptors in the order the named policy (built-in or installed) chooses."""
    from vllm_staging_plugin._engine.policies import PolicyRegistry
    from vllm_staging_plugin._engine.settings import Settings

    return PolicyRegistry.load().order(Settings(order=order), mode, descriptors)


def patched_copy(stock: types.ModuleType, patch: Path, root: Path) -> types.ModuleType:
    """``stock`` (a vLLM module) with a bundled patch applied: its file copied under ``root`` at its package
    path, ``patch -p1 --fuzz=0`` there, and executed as a new module of the same name (not put in
    ``sys.modules``: the caller decides where vLLM finds it)."""
    target = root / Path(*stock.__name__.split(".")).with_suffix(".py")
    target.parent.mkdir(parents=True)
    assert stock.__file__ is not None
    shutil.copy(stock.__file__, target)
    subprocess.run(["patch", "-p1", "-s", "--fuzz=0", "-i", str(patch)], cwd=root, check=True)
    spec = importlib.util.spec_from_file_location(stock.__name__, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
