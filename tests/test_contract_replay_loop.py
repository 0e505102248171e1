"""The CPU replay's capture loop is pinned to vLLM's own, on every release the compat matrix runs.

``cpu_replay.cpu_stubs`` replaces the base ``CudaGraphManager.capture`` loop (its ``torch.cuda.graph``
capture cannot run without a GPU), and every replay verdict, the atlas's 88,144 among them, rests on that
loop. Here vLLM's own loop runs with only its CUDA edges stubbed (graph objects, the capture context and
pool, the capture stream, the offloader, the progress bar, memory readings), and must visit exactly the
descriptors, modes and profiling cut that the replay's loop visits, in the same order.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import pytest
from atlas import probes

from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig

pytestmark = pytest.mark.contract
cu = pytest.importorskip("vllm.v1.worker.gpu.cudagraph_utils")
VLLM_LOOP = cu.CudaGraphManager.__dict__["capture"]  # before any stub replaces it


class _Forward:
    """What ``create_forward_fn`` returns: callable, and unpackable as (forward_fn, attention state)."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        return iter((self, None))


class _TorchWithoutGraphs:
    """``torch`` as the loop sees it, with the CUDA graph parts answered on CPU."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.cuda = types.SimpleNamespace(
            CUDAGraph=lambda *a, **k: object(),
            graph=lambda *a, **k: contextlib.nullcontext(),
            synchronize=lambda *a, **k: None,
            mem_get_info=lambda *a, **k: (0, 0),
            current_stream=lambda *a, **k: None,
            Stream=object,
        )
        self.accelerator = types.SimpleNamespace(
            synchronize=lambda *a, **k: None, get_memory_info=lambda *a, **k: (0, 0)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)


@contextlib.contextmanager
def cuda_edges(manager: Any) -> Iterator[None]:
    """Stub only what needs a GPU; every name is optional (releases differ)."""
    names = {
        "torch": _TorchWithoutGraphs(cu.torch),
        "graph_capture": lambda *a, **k: contextlib.nullcontext(types.SimpleNamespace(stream=None)),
        "capture_pool": lambda pool, *a, **k: contextlib.nullcontext(pool),
        "get_offloader": lambda: types.SimpleNamespace(
            sync_prev_onload=lambda: None, join_after_forward=lambda: None
        ),
        "is_global_first_rank": lambda: False,
        "current_stream": lambda *a, **k: None,
    }
    saved = {name: cu.__dict__[name] for name in names if name in cu.__dict__}
    instance = {"_capture_stream": lambda desc: None}
    try:
        for name in saved:
            setattr(cu, name, names[name])
        for name, value in instance.items():
            if hasattr(manager, name):
                manager.__dict__[name] = value
        yield
    finally:
        for name, value in saved.items():
            setattr(cu, name, value)
        for name in instance:
            manager.__dict__.pop(name, None)


def _visits(manager: Any, loop: Any) -> list[tuple[str, int, int]]:
    """The descriptors ``loop`` prepares, in order, once each (warm-up and capture of one are one visit)."""
    seen: list[tuple[str, int, int]] = []

    def create_forward_fn(desc: Any, warmup: bool = True) -> _Forward:
        visit = (str(desc.cg_mode.name), int(desc.num_tokens), id(desc))
        if not seen or seen[-1] != visit:
            seen.append(visit)
        return _Forward()

    params = list(inspect.signature(loop).parameters)
    if "create_forward_fn" not in params:
        pytest.skip(f"this release's base capture takes ({', '.join(params)})")
    loop(manager, create_forward_fn)
    return seen


CONFIGS = {
    "default grid": ReplayConfig(hidden_size=64),
    "FULL only": ReplayConfig(mode="FULL", hidden_size=64),
    "speculative": ReplayConfig(sizes=(1, 2, 4, 8, 16), max_num_seqs=4, decode_query_len=3, hidden_size=64),
    "recover-SSM": probes.KnobbedReplay(
        sizes=(1, 2, 4, 8, 16), max_num_seqs=4, decode_query_len=3, hidden_size=64, use_kda_recoverssm=True
    ),
    "LoRA": ReplayConfig(sizes=(1, 2, 4, 8), hidden_size=64, lora_capture_cases=[0, 1]),
}


@pytest.mark.parametrize("profiling", [False, True], ids=["real capture", "profiling pass"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_replay_visits_what_vllms_loop_visits(name: str, profiling: bool) -> None:
    cfg = CONFIGS[name]
    if (
        cfg.lora_capture_cases
        and "lora_capture_cases" not in inspect.signature(cu.ModelCudaGraphManager).parameters
    ):
        pytest.skip("no LoRA capture cases in this release")
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
        if profiling:
            if not hasattr(manager, "_max_full_descs_to_capture"):
                pytest.skip("no profiling pass in this release")
            manager._max_full_descs_to_capture = 2
        replayed = _visits(manager, cu.CudaGraphManager.capture)  # the replay's stored-order loop
        with cuda_edges(manager):
            vllms = _visits(manager, VLLM_LOOP)
    assert replayed and vllms == replayed
    modes = [mode for mode, _, _ in vllms]
    assert modes == sorted(modes, key=("PIECEWISE", "FULL").index)  # PIECEWISE first, then FULL
    if profiling:
        assert modes.count("FULL") == min(2, len(manager._capture_descs.get(cu.CUDAGraphMode.FULL, [])))


@pytest.mark.parametrize("order", ["full-first", "size-descending", "interleaved"])
def test_vllms_loop_captures_a_mixed_list_in_order_each_graph_in_its_own_mode(order: str) -> None:
    """An order across the modes hands vLLM's loop one list under one key: its loop visits that list in
    order and takes each descriptor's mode from the descriptor (FULL ones become graphs of their own)."""
    from vllm_staging_plugin._engine.policies import PolicyRegistry
    from vllm_staging_plugin._engine.settings import Settings

    cfg = CONFIGS["default grid"]
    with cpu_replay.cpu_stubs(cfg), cpu_replay.stock_or_patched(False):
        manager = cpu_replay.build_manager(cfg)
        mixed = PolicyRegistry([]).reordered(Settings(order=order), manager._capture_descs)
        (descs,) = mixed.values()
        manager._capture_descs = mixed
        replayed = _visits(manager, cu.CudaGraphManager.capture)
        with cuda_edges(manager):
            vllms = _visits(manager, VLLM_LOOP)
    assert vllms == replayed == [(d.cg_mode.name, d.num_tokens, id(d)) for d in descs]
    assert {m for m, _, _ in vllms} == {"PIECEWISE", "FULL"}
    full = [d for d in descs if d.cg_mode.name == "FULL"]
    assert list(manager.graphs) == full  # vLLM recorded a FULL graph for each FULL descriptor, in order
