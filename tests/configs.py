"""Config-only model shapes the pre-flight tests write into model folders (no weights are read), and the
`vllm serve` arguments they check them with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_0_6B: dict[str, Any] = {  # public Qwen3-0.6B config.json shape
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip
# Kimi-Linear-48B-A3B's config.json shape, cut to 4 layers (3 KDA, 1 MLA) and 32 experts (tests/data)
KIMI_LINEAR_4L = Path(__file__).parent / "data" / "kimi-linear-4l"
KIMI_LINEAR_4_LAYERS: dict[str, Any] = json.loads((KIMI_LINEAR_4L / "config.json").read_text())
# A config-only EAGLE drafter at the Kimi-Linear widths (vLLM's EagleLlamaForCausalLM, one layer)
KIMI_LINEAR_EAGLE: dict[str, Any] = {
    "architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "hidden_size": 2304,
    "intermediate_size": 9216, "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 72, "vocab_size": 163840, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip
NO_WEIGHTS = ["--load-format", "dummy", "--skip-tokenizer-init"]
KIMI_CRASH = [  # the small recover-SSM configuration: n-gram 2 tokens, 4 sequences, an operator-set grid
    "--max-num-seqs", "4", "--use-replayssm",
    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}',
    "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}',
]  # fmt: skip
K3_4_LAYERS = Path(__file__).parent / "data" / "kimi-k3-4l"  # Kimi-K3's published structure, 4 layers
K3: dict[str, Any] = json.loads((K3_4_LAYERS / "config.json").read_text())
# Config-only K3 DSpark drafters (tests/data/kimi-k3-dspark-bN/README.md): N is the block size
K3_DRAFTERS = {b: Path(__file__).parent / "data" / f"kimi-k3-dspark-b{b}" for b in (5, 7, 8)}
_DRAFTER_CONFIGS = [json.loads((path / "config.json").read_text()) for path in K3_DRAFTERS.values()]
# The architectures the tests' models and drafters name, and those vLLM gives a drafter it builds itself.
ARCHITECTURES = sorted(
    {
        a
        for c in (QWEN3_0_6B, KIMI_LINEAR_4_LAYERS, KIMI_LINEAR_EAGLE, K3, *_DRAFTER_CONFIGS)
        for a in c["architectures"]
    }
    | {"ExtractHiddenStatesModel", "Eagle3Qwen3ForCausalLM", "Eagle3LlamaForCausalLM"}
)


def model_folder(root: Path, config: dict[str, Any]) -> str:
    """``root`` made a local model, a folder holding only ``config.json``; its path, for `vllm serve`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return str(root)
