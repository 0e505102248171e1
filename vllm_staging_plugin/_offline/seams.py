"""The offline code's door into vLLM's private internals: each function here names the private it uses, the
release it was read on, and what happens when vLLM changes it. Contract tests run each against the installed
vLLM (tests/test_seams.py).

A changed private makes a function here raise (``SeamChanged``, or vLLM's own AttributeError), or return
"does not apply", never a wrong answer: the caller reports that the check could not be made. Still reached
from elsewhere (to move here): the pre-flight's emulated platform (``preflight/platform.py``: vLLM's CUDA
platform class, ``current_platform`` bindings, ``HAS_TRITON``, ``vllm._custom_ops``), the pre-flight's
classification of vLLM's error texts and its copy of Model Runner V2's manager set-up
(``preflight/configure.py``), the CPU replay's CUDA edges (``cpu_replay.cpu_stubs``), and the manager's
``_capture_descs`` (read in ``cpu_replay.run_capture``, ``preflight/replay.py``, ``atlas/replay.py``; the
engine's own structure check requires it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Iterator
from typing import Any

from .scoped import attributes


class SeamChanged(Exception):
    """The installed vLLM no longer has a private this module relies on; the message names it."""


@dataclasses.dataclass(frozen=True)
class KdaMixedStep:
    """What vLLM's shared KDA layer gets on a step that mixes one speculative decode with one prefill."""

    layer: str  # the KDA layer class vLLM builds for this model
    builder: str  # its attention-metadata builder
    index_columns: int  # columns of the state index handed to the speculative kernel
    query_length: int  # tokens of the speculative decode: 1 + num_speculative_tokens
    kda_layers: int  # KDA layers of the model
    slot_bytes: int  # one request's state in one KDA layer on one GPU (conv + recurrent)

    @property
    def faults(self) -> bool:
        """The kernel reads one index word per query token: fewer columns means reads past the index."""
        return self.index_columns < self.query_length

    @property
    def extra_bytes_per_request(self) -> int:
        """What one slot per draft token costs in every KDA layer (vLLM without ``--use-replayssm``)."""
        return (self.query_length - 1) * self.slot_bytes * self.kda_layers


class _Built(Exception):
    def __init__(self, cls: type) -> None:
        super().__init__(cls.__qualname__)
        self.cls = cls


def derive_capture_sizes(vllm_config: Any) -> list[int]:
    """The capture grid vLLM derives for ``vllm_config`` (which holds no explicit sizes), set on its
    compilation config and returned. Private: ``VllmConfig._set_cudagraph_sizes`` (0.18.0-0.33.0), the
    method vLLM's own ``__post_init__`` calls; renamed or gone, AttributeError names it."""
    vllm_config._set_cudagraph_sizes()
    return list(vllm_config.compilation_config.cudagraph_capture_sizes)


@contextlib.contextmanager
def capability_family(family: int) -> Iterator[None]:
    """For the block, the platform answers ``is_device_capability_family(family)`` with yes (e.g. 100:
    data-centre Blackwell, whose derived-grid ceiling is 1024 where others have 512). Private: the
    classmethod on the platform class of ``current_platform``, which ``_set_cudagraph_sizes`` asks
    (0.28.0-0.33.0); gone, the question is not asked and the answer changes nothing."""
    from vllm.platforms import current_platform

    answer = classmethod(lambda _, capability, device_id=0: capability // 10 == family // 10)
    with attributes(type(current_platform), {"is_device_capability_family": answer}):
        yield


@contextlib.contextmanager
def graph_pool_stub(platform: Any, pool: Any) -> Iterator[None]:
    """For the block, ``platform.get_global_graph_pool()`` returns ``pool`` without CUDA (a manager built
    on CPU asks the platform its module bound, in ``__init__``). Private: the platform class's
    ``_global_graph_pool`` cache (0.18.0-0.33.0), which that getter returns when set."""
    with attributes(type(platform), {"_global_graph_pool": pool}):
        yield


def capture_plan(manager: Any) -> dict[Any, list[Any]]:
    """The manager's capture plan: CUDA-graph mode -> its batch descriptors, in the order vLLM captures
    them; reordering a list in place changes what ``capture()`` runs. Private:
    ``ModelCudaGraphManager._capture_descs`` (0.18.0-0.33.0), which the engine's structure check
    (``_engine/compat.check_manager``) requires too: a vLLM without it is refused before this is asked."""
    return manager._capture_descs  # type: ignore[no-any-return]


def manager_features(cudagraph_module: Any) -> dict[str, bool]:
    """Which descriptor knobs the release's graph manager has, read from its structure (not its version).
    Privates: ``ModelCudaGraphManager.__init__``'s parameters and the source text of
    ``CudaGraphManager._init_candidates`` and ``ModelCudaGraphManager.__init__`` (0.18.0-0.33.0); a knob
    renamed there reads as absent, and the search then runs at that knob's default only."""
    import inspect

    params = inspect.signature(cudagraph_module.ModelCudaGraphManager.__init__).parameters
    candidates = inspect.getsource(cudagraph_module.CudaGraphManager._init_candidates)
    init = inspect.getsource(cudagraph_module.ModelCudaGraphManager.__init__)
    return {
        "lora_capture_cases": "lora_capture_cases" in params,
        "varlen_decode": "varlen_decode" in params,
        "dbo": "ubatch_runner" in params and "_maybe_ubatch_twin" in candidates,
        "kda_recoverssm": "use_kda_recoverssm" in candidates,
        "dense_schedule": "uses_dynamic_speculative_decoding" in candidates,
        "intermediate_tensors": "intermediate_tensors" in init,
    }


def inspect_architecture(architecture: str) -> None:
    """Have vLLM's registry inspect ``architecture`` (its subprocess the first time, then its cache).
    Private: ``ModelRegistry._try_inspect_model_cls`` (0.18.0-0.33.0); the configuration build calls it
    anyway, so without it the inspection happens there instead."""
    from vllm.model_executor.models.registry import ModelRegistry

    if architecture in ModelRegistry.models:
        inspect = getattr(ModelRegistry, "_try_inspect_model_cls", None)
        if inspect is not None:
            inspect(architecture)


def model_class(vllm_config: Any) -> Any:
    """The model class vLLM resolves for the configuration (``ModelRegistry.resolve_model_cls``, 0.18+)."""
    from vllm.model_executor.models import ModelRegistry

    model_config = vllm_config.model_config
    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config)
    return cls


def kda_layer_class(vllm_config: Any) -> Any:
    """The KDA layer class vLLM's Kimi decoder builds for this model, or None when the model has none.

    Private: ``KimiDecoderLayer`` in the model class's module (``vllm/models/kimi_k3/nvidia/model.py``;
    read on 0.33.0, present from 0.28.0), which picks the layer: Kimi-K3's own ``KimiK3DeltaAttention``
    for a full-rank gate, the shared ``KimiGatedDeltaNetAttention`` otherwise. The decoder is built for the
    first KDA layer with every Mamba-layer class of that module replaced by a recorder, so the class it
    asks for is read from vLLM's own choice; nothing else of the decoder is built. A module without
    ``KimiDecoderLayer`` (another model, or a renamed decoder) gives None; a decoder that builds no Mamba
    layer raises SeamChanged.
    """
    return _kda_layer_class(vllm_config, model_class(vllm_config))


def _kda_layer_class(vllm_config: Any, model_cls: Any) -> Any:
    text = vllm_config.model_config.hf_text_config
    module = sys.modules[model_cls.__module__]
    decoder = getattr(module, "KimiDecoderLayer", None)
    is_kda = getattr(text, "is_kda_layer", None)
    if decoder is None or is_kda is None or not getattr(text, "linear_attn_config", None):
        return None
    index = next((i for i in range(text.num_hidden_layers) if is_kda(i)), None)
    if index is None:
        return None
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    def recorder(cls: type) -> type:
        def build(*args: Any, **kwargs: Any) -> Any:
            raise _Built(cls)

        return type(cls.__name__, (), {"__new__": build})

    layers = {name: recorder(obj) for name, obj in vars(module).items()
              if isinstance(obj, type) and issubclass(obj, MambaBase)}  # fmt: skip
    try:
        with attributes(module, layers), set_current_vllm_config(vllm_config):
            decoder(text, vllm_config, prefix=f"model.layers.{index}")
    except _Built as built:
        return built.cls
    raise SeamChanged(f"{module.__name__}.KimiDecoderLayer built no Mamba layer for KDA layer {index}")


@contextlib.contextmanager
def _host_copies() -> Iterator[None]:
    """vLLM's host-to-device helper stages copies in pinned memory when its platform says CUDA; on this
    CPU-only machine nothing can be pinned. Private: ``PIN_MEMORY`` of ``vllm.utils.torch_utils`` and its
    copy in ``vllm.v1.attention.backends.utils`` (0.33.0), read at each call."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.attention.backends.utils as backend_utils

    with attributes(torch_utils, {"PIN_MEMORY": False}), attributes(backend_utils, {"PIN_MEMORY": False}):
        yield


def kda_mixed_step(vllm_config: Any) -> KdaMixedStep | None:
    """Build the installed vLLM's real KDA metadata for a step that mixes a speculative decode with a
    prefill, on CPU, and report the state index the speculative kernel gets. None where it does not apply:
    no speculative decoding, no Kimi KDA layer, or a layer with its own metadata (Kimi-K3's, whose
    RecoverSSM kernels read the one slot it gives).

    Privates: the layer's ``get_kv_cache_spec`` (its state slots per request; ``--use-replayssm`` gives
    one, ``vllm/model_executor/layers/mamba/abstract.py``), ``GDNAttentionMetadataBuilder``
    (``vllm/v1/attention/backends/gdn_attn.py``; read on 0.33.0, present from 0.28.0), its ``build``
    arguments ``num_accepted_tokens`` / ``num_decode_draft_tokens_cpu`` and ``CommonAttentionMetadata``'s
    fields. A builder or metadata that changes shape raises SeamChanged, which the caller reports.
    """
    num_spec = int(getattr(vllm_config.speculative_config, "num_speculative_tokens", None) or 0)
    if not num_spec:
        return None
    model_cls = model_class(vllm_config)
    layer_cls = _kda_layer_class(vllm_config, model_cls)
    if layer_cls is None:
        return None
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    shapes = tuple(model_cls.get_mamba_state_shape_from_config(vllm_config))
    dtypes = tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config))
    layer = layer_cls.__new__(layer_cls)
    torch.nn.Module.__init__(layer)
    layer.get_state_shape = lambda: shapes  # what the built layer answers, from the model's own classmethods
    layer.get_state_dtype = lambda: dtypes
    builder_cls = layer.get_attn_backend().get_builder_cls()
    if builder_cls is not GDNAttentionMetadataBuilder:
        return None
    with set_current_vllm_config(vllm_config):
        spec = layer.get_kv_cache_spec(vllm_config)
    query = 1 + num_spec
    prefill = 12
    blocks = math.ceil((16 + query) / spec.block_size) + 1 + spec.num_speculative_blocks
    starts = torch.tensor([0, query, query + prefill], dtype=torch.int32)
    seq_lens = torch.tensor([16 + query, prefill], dtype=torch.int32)
    batch = CommonAttentionMetadata(
        query_start_loc=starts, query_start_loc_cpu=starts.clone(), seq_lens=seq_lens, num_reqs=2,
        num_actual_tokens=query + prefill, max_query_len=prefill, max_seq_len=16 + query,
        block_table_tensor=torch.arange(1, 1 + 2 * blocks, dtype=torch.int32).view(2, blocks),
        slot_mapping=torch.zeros(query + prefill, dtype=torch.int64),
        is_prefilling=torch.tensor([False, True]), seq_lens_cpu_upper_bound=seq_lens.clone(),
    )  # fmt: skip
    with set_current_vllm_config(vllm_config), _host_copies():
        builder = builder_cls(spec, ["kda-probe"], vllm_config, torch.device("cpu"))
        metadata = builder.build(
            0, batch, num_accepted_tokens=torch.ones(2, dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor([num_spec, -1], dtype=torch.int32),
        )  # fmt: skip
    index = metadata.spec_state_indices_tensor
    if index is None or metadata.num_spec_decodes != 1 or not metadata.num_prefills:
        raise SeamChanged(
            f"{builder_cls.__name__}.build did not split the batch into one decode and a prefill"
        )
    text = vllm_config.model_config.hf_text_config
    return KdaMixedStep(
        layer=layer_cls.__qualname__,
        builder=builder_cls.__qualname__,
        index_columns=int(index.shape[1]),
        query_length=query,
        kda_layers=sum(bool(text.is_kda_layer(i)) for i in range(text.num_hidden_layers)),
        slot_bytes=sum(math.prod(s) * d.itemsize for s, d in zip(shapes, dtypes, strict=True)),
    )
