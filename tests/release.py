"""The installed vLLM's release shape, as the plugin reads it (``_engine/compat.SHAPES``): tests whose answer
differs between a vLLM that stages lazily (0.18.0-0.33.0) and one that sizes its staging buffers itself
(0.34.0) branch on :data:`SIZES_STAGING` and pin both answers."""

from __future__ import annotations

from vllm_staging_plugin._engine import compat
from vllm_staging_plugin._offline import seams

SIZES_STAGING = compat.release_shape(seams.cudagraph_module().ModelCudaGraphManager).vllm_sizes_staging
