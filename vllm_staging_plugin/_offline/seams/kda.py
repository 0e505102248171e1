"""Seams into vLLM's Kimi KDA layers: which layer a model builds, and the state index its speculative kernel
gets on a step that mixes a speculative decode with a prefill (built on CPU from vLLM's own metadata)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ... import suspended
from ..internal import SeamChanged
from ..scoped import attributes
from .config import model_class


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


def kda_layer_class(vllm_config: Any, model_cls: Any = None) -> Any:
    """The KDA layer class vLLM's Kimi decoder builds for this model, or None when the model has none.

    Private: ``KimiDecoderLayer`` of the model's module, which picks Kimi-K3's own layer or the shared
    one. It is built for the first KDA layer with every Mamba-layer class replaced by a recorder, so the
    answer is vLLM's own choice. No such decoder: None; one that builds no Mamba layer: SeamChanged.
    ``model_cls``: the model class vLLM resolves, when the caller has it.
    """
    model_cls = model_cls or model_class(vllm_config)
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

    layers = {
        name: recorder(obj)
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, MambaBase)
    }
    try:
        with attributes(module, layers), set_current_vllm_config(vllm_config):
            decoder(text, vllm_config, prefix=f"model.layers.{index}")
    except _Built as built:
        return built.cls
    raise SeamChanged(f"{module.__name__}.KimiDecoderLayer built no Mamba layer for KDA layer {index}")


@contextlib.contextmanager
def _host_copies() -> Iterator[None]:
    """No pinned host copies (vLLM pins them when its platform says CUDA; nothing can be pinned here).
    Privates: ``PIN_MEMORY`` and ``is_pin_memory_available`` where vLLM reads them; moved, the metadata build
    fails and the serving check reports that it could not be made."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.attention.backends.utils as backend_utils

    def no_pinning() -> bool:
        return False

    with (
        attributes(torch_utils, {"PIN_MEMORY": False, "is_pin_memory_available": no_pinning}),
        attributes(backend_utils, {"PIN_MEMORY": False}),
    ):
        yield


def fault_at_boot() -> bool:
    """Whether this vLLM's worker runs a speculative decode beside a prefill before it serves, so the
    shared KDA layer's fault ends the boot. Read by structure: ``run_kv_cache_sizing_warmup`` in
    ``vllm/v1/worker/gpu/warmup.py``."""
    try:
        import vllm.v1.worker.gpu.warmup as warmup
    except ImportError:
        return False
    return hasattr(warmup, "run_kv_cache_sizing_warmup")


def kda_mixed_step(vllm_config: Any, adjust: Callable[[Any], Any] | None = None) -> KdaMixedStep | None:
    """Build vLLM's real KDA metadata on CPU for a step that mixes a speculative decode with a prefill, and
    report the state index the speculative kernel gets. None where it does not apply (no speculation, no
    Kimi KDA layer, or Kimi-K3's own layer and metadata).

    The spec is vLLM's own (registered fixes suspended); ``adjust`` (the pre-flight's plugin arm) turns
    it into the one the builder gets. Privates: ``get_kv_cache_spec``, ``GDNAttentionMetadataBuilder``,
    its ``build`` arguments and ``CommonAttentionMetadata``'s fields; a changed shape raises, and the
    caller reports it.
    """
    num_spec = int(getattr(vllm_config.speculative_config, "num_speculative_tokens", None) or 0)
    if not num_spec:
        return None
    model_cls = model_class(vllm_config)
    layer_cls = kda_layer_class(vllm_config, model_cls)
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
    with set_current_vllm_config(vllm_config), suspended():
        spec = type(layer).get_kv_cache_spec(layer, vllm_config)
    if adjust is not None:
        spec = adjust(spec)
    query = 1 + num_spec
    prefill = 12
    blocks = math.ceil((16 + query) / spec.block_size) + 1 + spec.num_speculative_blocks
    starts = torch.tensor([0, query, query + prefill], dtype=torch.int32)
    seq_lens = torch.tensor([16 + query, prefill], dtype=torch.int32)
    batch = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts.clone(),
        seq_lens=seq_lens,
        num_reqs=2,
        num_actual_tokens=query + prefill,
        max_query_len=prefill,
        max_seq_len=16 + query,
        block_table_tensor=torch.arange(1, 1 + 2 * blocks, dtype=torch.int32).view(2, blocks),
        slot_mapping=torch.zeros(query + prefill, dtype=torch.int64),
        is_prefilling=torch.tensor([False, True]),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )
    with set_current_vllm_config(vllm_config), _host_copies():
        builder = builder_cls(spec, ["kda-probe"], vllm_config, torch.device("cpu"))
        metadata = builder.build(
            0,
            batch,
            num_accepted_tokens=torch.ones(2, dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor([num_spec, -1], dtype=torch.int32),
        )
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
