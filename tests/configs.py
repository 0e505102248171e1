"""Config-only model shapes the pre-flight tests write into model folders (no weights are read)."""

from __future__ import annotations

from typing import Any

QWEN3_0_6B: dict[str, Any] = {  # public Qwen3-0.6B config.json shape
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip
