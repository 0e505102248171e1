"""The study's in-process probes for one boot, switched on by variables (study.boot.variant_env):

- ``STUDY_SHIM_PDL_OFF=1``: ``vllm.platforms.cuda.CudaPlatform.is_arch_support_pdl`` returns False.
- ``STUDY_SHIM_STEPS=1``: the model runner prints the first steps that mix a speculative decode with a
  prefill (the scheduler's own token counts), so a record shows the traffic reached the engine as planned.
- ``STUDY_SHIM_KDA=log``: the shared Kimi-Linear KDA layer prints, for each speculative call beside a
  prefill, the state-index tensor ``fused_recurrent_kda`` gets (shape, strides), the words its kernel reads
  against the words allocated, the values of those words and the state-pool size. ``pad``: the same, and
  for a one-request call the index is handed over as a ``(1, 1)`` view whose storage holds the query length
  in words, each the request's slot (the kernel specialization stays the same; only the words after the
  index change): the padding control.

Loaded only when a variant puts this folder first on PYTHONPATH, so every process of the boot (front end,
engine core, workers, forked or spawned) runs it before vLLM is imported. Each target module is patched
right after it runs. Any sitecustomize this one shadows is still run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_LINES = 12  # per process and probe: enough to see the first mixed steps, not a flood


def _say(text: str) -> None:
    print(f"study-shim: {text} pid {os.getpid()}", file=sys.stderr, flush=True)


def _pdl_off(module: ModuleType) -> None:
    def is_arch_support_pdl(cls: Any) -> bool:
        return False

    module.CudaPlatform.is_arch_support_pdl = classmethod(is_arch_support_pdl)  # type: ignore[attr-defined]
    _say("PDL off (is_arch_support_pdl -> False)")


def _steps(module: ModuleType) -> None:
    cls = module.GPUModelRunner
    run = cls.execute_model
    seen = [0]

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        counts = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        others = {r: n for r, n in counts.items() if r not in spec}
        if spec and others and seen[0] < MAX_LINES:
            seen[0] += 1
            new = getattr(scheduler_output, "scheduled_new_reqs", None) or []
            line = {
                "speculative": {r: counts.get(r) for r in spec},
                "other": others,
                "new_requests": len(new),
            }
            _say(f"mixed step {json.dumps(line)}")
        return run(self, scheduler_output, *args, **kwargs)

    cls.execute_model = execute_model
    _say("steps probe on")


def _device_words(ptr: int, count: int) -> list[int] | None:
    """``count`` int32 words of device memory from ``ptr``, past any tensor's end (CuPy, if importable)."""
    try:
        import cupy  # the GPU image's own

        memory = cupy.cuda.UnownedMemory(ptr, count * 4, owner=None)
        words = cupy.ndarray((count,), dtype=cupy.int32, memptr=cupy.cuda.MemoryPointer(memory, 0))
        return [int(w) for w in words.get()]
    except Exception:
        return None


def _kda(module: ModuleType, mode: str) -> None:
    import torch
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture
    from vllm.forward_context import get_forward_context

    cls = module.KimiGatedDeltaNetAttention
    # vLLM's eager-break decorator records the function it wraps for graph replay: wrap inside it, so
    # that replays of PIECEWISE graphs run the probe too, then decorate again.
    run: Callable[..., Any] = getattr(cls._forward, "__wrapped__", cls._forward)
    seen = [0]

    def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = getattr(get_forward_context(), "attn_metadata", None)
        m = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        mixed = m is not None and m.spec_sequence_masks is not None and (m.num_prefills or m.num_decodes)
        if mixed and not torch.cuda.is_current_stream_capturing():
            index, n = m.spec_state_indices_tensor, m.num_spec_decodes
            lengths = m.spec_query_start_loc[: n + 1].diff().tolist()
            longest = max(lengths)
            # fused_recurrent_kda_fwd_kernel reads state_indices[i_n * stride(0) + t], t < query length
            read = (n - 1) * index.stride(0) + longest
            allocated = index.untyped_storage().nbytes() // index.element_size() - index.storage_offset()
            if seen[0] < MAX_LINES:
                seen[0] += 1
                pool = self.kv_cache[1].shape[0]
                words = _device_words(index.data_ptr(), read)
                outside = None if words is None else sum(not 0 <= w < pool for w in words)
                info = {"layer": self.prefix, "shape": list(index.shape), "stride": list(index.stride()),
                        "query_lengths": lengths, "words_read": read, "words_allocated": allocated,
                        "words": words, "state_slots": pool, "out_of_pool": outside}  # fmt: skip
                _say(f"kda-call {json.dumps(info)}")
            if mode == "pad" and n == 1 and index.shape[1] < longest:
                padded = index[0, 0].repeat(longest)  # the request's slot, query-length words
                m.spec_state_indices_tensor = padded[:1].view(1, 1)
                if seen[0] <= MAX_LINES:
                    _say(f"kda-pad {self.prefix}: (1, 1) index over {longest} words")
        return run(self, *args, **kwargs)

    cls._forward = eager_break_during_capture(_forward)
    _say(f"kda probe on ({mode})")


TARGETS: dict[str, Callable[[ModuleType], None]] = {}
if os.environ.get("STUDY_SHIM_PDL_OFF") == "1":
    TARGETS["vllm.platforms.cuda"] = _pdl_off
if os.environ.get("STUDY_SHIM_STEPS") == "1":
    TARGETS["vllm.v1.worker.gpu.model_runner"] = _steps
if os.environ.get("STUDY_SHIM_KDA") in ("log", "pad"):
    _mode = os.environ["STUDY_SHIM_KDA"]
    TARGETS["vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"] = lambda m: _kda(m, _mode)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds each target through the other finders and patches it once its module has run."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = TARGETS.pop(name, None)
        if patch is None:
            return None
        if not TARGETS:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run_then_patch(module: ModuleType) -> None:
            exec_module(module)
            try:
                patch(module)
            except Exception as exc:
                _say(f"probe for {name} not applied: {type(exc).__name__}: {exc}")

        spec.loader.exec_module = run_then_patch  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the sitecustomize this file shadows, if any (Python imports only the first one on sys.path)."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


for _name in [t for t in TARGETS if t in sys.modules]:
    TARGETS.pop(_name)(sys.modules[_name])
if TARGETS:
    sys.meta_path.insert(0, _AfterImport())
_chain()
