"""Model shapes for dummy-weight boots: each a ``config.json`` written to disk, plus the engine arguments
and variables it boots with. No model hub is reachable on the GPU machine, so configs travel as code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN3_06B = QWEN3_COMMON | {
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "max_window_layers": 28, "tie_word_embeddings": True,
}  # fmt: skip
QWEN3_8B = QWEN3_COMMON | {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "max_window_layers": 36, "tie_word_embeddings": False,
}  # fmt: skip
# Kimi-Linear-48B-A3B's config.json, cut to 4 layers (KDA 1-3, MLA 4; 1-based as vLLM's is_kda_layer reads
# them), hidden 2048 and 16 experts (top-2, as vLLM's grouped-topk kernel tests use). KDA heads stay 32 x 128
# and MLA keeps kv_lora_rank 512 / rope 64, the shapes its fused kernels (_flashkda_C, FlashMLA) support.
KIMI_LINEAR_4L: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "torch_dtype": "bfloat16",
    "vocab_size": 163840, "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 32, "hidden_act": "silu", "rms_norm_eps": 1e-05, "initializer_range": 0.02,
    "max_position_embeddings": 8192, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "use_cache": True, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "num_nextn_predict_layers": 0,
    "num_experts": 16, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True, "num_expert_group": 1,
    "topk_group": 1,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 128, "num_heads": 32,
                           "short_conv_kernel_size": 4},
}  # fmt: skip
# One-layer EAGLE3 draft for the Qwen3-0.6B target: hidden and target_hidden_size match the target, the
# draft vocabulary is the target's (no draft-to-target id map).
EAGLE3_DRAFT_06B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 1024, "target_hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 1,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "max_position_embeddings": 40960, "rope_theta": 1000000, "vocab_size": 151936,
    "draft_vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False,
}  # fmt: skip
KIMI_LINEAR_DENSE = KIMI_LINEAR_4L | {"num_experts": None}


def _kimi_k3_4l() -> dict[str, Any]:
    """tests/data/kimi-k3-4l (Kimi-K3's published structure, 4 layers) cut to fit beside two other boots
    on one GPU: hidden 2048, 32 attention and 32 KDA heads, 16 experts top-2, MoE and routed-expert hidden
    1024, 8192 positions, no quantization_config (bf16); the vision tower projects to 2048. Kept: the
    full-rank KDA gate (so vLLM builds Kimi-K3's own KDA layer and metadata), the MLA output gate, the
    latent MoE and the situ activation."""
    config = json.loads(
        (Path(__file__).resolve().parents[2] / "tests/data/kimi-k3-4l/config.json").read_text()
    )
    text = config["text_config"]
    text.pop("quantization_config")
    text |= {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 32, "num_experts": 16,
             "num_experts_per_token": 2, "moe_intermediate_size": 1024, "routed_expert_hidden_size": 1024,
             "max_position_embeddings": 8192}  # fmt: skip
    text["linear_attn_config"] = text["linear_attn_config"] | {"num_heads": 32}
    config["vision_config"]["text_hidden_size"] = 2048
    return config


KIMI_K3_ARCH = _kimi_k3_4l()
# Small recover-SSM settings: n-gram 2 tokens, --use-replayssm, max_num_seqs 4, a grid to 16.
KIMI_SMALL: dict[str, Any] = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
                           "prompt_lookup_min": 1},
    "use_replayssm": True,
    "max_num_seqs": 4,
    "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
}  # fmt: skip
POWERS_TO_256 = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KIMI_K3_WIDTHS: dict[str, Any] = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2,
                           "prompt_lookup_min": 1},
    "use_replayssm": True,
    "max_num_seqs": 48,
    "compilation_config": {"cudagraph_capture_sizes": [*POWERS_TO_256, 512]},
}  # fmt: skip
# The pre-flight's verified workaround at the K3 widths: `check` adds 261 (the widest FULL descriptor) to
# the grid, so PIECEWISE 261 is captured first and stock boots.
K3_WORKAROUND = KIMI_K3_WIDTHS | {
    "compilation_config": {"cudagraph_capture_sizes": [*POWERS_TO_256, 261, 512]}
}
KIMI_ENV = {"VLLM_KIMI_K3_GEMM_AR": "0", "VLLM_ENABLE_GEMM_RS": "0"}


def _widths(tokens: int, max_num_seqs: int, grid: list[int]) -> dict[str, Any]:
    """Recover-SSM settings at other widths (n-gram ``tokens``, ``max_num_seqs``, an explicit grid)."""
    return KIMI_K3_WIDTHS | {
        "speculative_config": KIMI_K3_WIDTHS["speculative_config"] | {"num_speculative_tokens": tokens},
        "max_num_seqs": max_num_seqs, "compilation_config": {"cudagraph_capture_sizes": grid},
    }  # fmt: skip


POWERS_TO_512 = [*POWERS_TO_256, 512]
DRAFT = "@DRAFT@"  # replaced by the draft's folder


def _shipped(folder: str) -> dict[str, Any]:
    """A config-only folder under tests/data, as shipped (the GPU run boots exactly what `check` reads)."""
    path = Path(__file__).resolve().parents[2] / "tests/data" / folder / "config.json"
    config: dict[str, Any] = json.loads(path.read_text())
    return config


# Kimi-K3 as deployed, on the shipped cut: tests/data/kimi-k3-4l as it is (hidden 7168, 96 heads, 896 routed
# experts in MXFP4, about 54 GiB of weights) with a config-only K3 DSpark drafter from tests/data
# (kimi-k3-dspark-b8: 5 MLA layers, 4 taps, 8-token blocks; -b5: 3 layers, 3 taps; -b7: 5 layers, 4 taps).
# The drafter's taps make vLLM stage one aux_hidden_states buffer each beside hidden_states. Two such boots
# share one H200 (gpu_memory_utilization 0.47 each); max_num_batched_tokens 2048 keeps the memory
# profiler's activation peak small beside the weights (it does not change the capture plan: `check` gives
# the same descriptors with and without it).
K3_MXFP4 = _shipped("kimi-k3-4l")
K3_DSPARK = {f"b{b}": _shipped(f"kimi-k3-dspark-b{b}") for b in (5, 7, 8)}


def _dspark(tokens: int | None, grid: list[int]) -> dict[str, Any]:
    """The K3 deployment settings with a DSpark drafter: ``tokens`` speculative tokens (None: vLLM takes
    the drafter's block size), --use-replayssm, max_num_seqs 48, an explicit grid."""
    spec: dict[str, Any] = {"method": "dspark", "model": DRAFT}
    if tokens is not None:
        spec["num_speculative_tokens"] = tokens
    return {"speculative_config": spec, "use_replayssm": True, "max_num_seqs": 48,
            "max_num_batched_tokens": 2048,
            "compilation_config": {"cudagraph_capture_sizes": grid}}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A config-only model folder plus the engine arguments and variables it is booted with; ``label``
    names its grid in the fault table."""

    config: dict[str, Any]
    engine: dict[str, Any]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    draft: dict[str, Any] | None = None
    label: str = ""


def _k3_deployed(block: int, tokens: int | None, grid: list[int], what: str) -> ModelSpec:
    """The shipped MXFP4 cut with the block-``block`` DSpark drafter at ``tokens`` (None: its block)."""
    return ModelSpec(K3_MXFP4, _dspark(tokens, grid), env=KIMI_ENV, draft=K3_DSPARK[f"b{block}"],
                     label=f"K3 MXFP4, DSpark block {block}{what}")  # fmt: skip


def _without_grid(engine: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in engine.items() if k != "compilation_config"}


TRITON = {"attention_backend": "TRITON_ATTN"}  # a forced backend: the named second arm, never the default
MODELS: dict[str, ModelSpec] = {
    # vLLM picks the attention backend (FLASH_ATTN on Hopper); each record says which one it logged.
    "qwen3-0.6b": ModelSpec(QWEN3_06B, {}),
    "qwen3-8b": ModelSpec(QWEN3_8B, {}),
    "qwen3-0.6b-triton": ModelSpec(QWEN3_06B, TRITON, label="TRITON_ATTN (forced)"),
    "qwen3-8b-triton": ModelSpec(QWEN3_8B, TRITON, label="TRITON_ATTN (forced)"),
    # vLLM turns on KDA recover-SSM (spec decode + --use-replayssm) and caps PIECEWISE at
    # max_num_seqs x (1 + 2) = 12 -> PIECEWISE 8, 4, 2, 1 then FULL 9, 6, 3. No attention_backend: its MLA
    # layer needs an MLA backend, which vLLM picks. No nvidia-cutlass-dsl on the GPU image: GEMM_AR/RS off.
    "kimi-linear-4l": ModelSpec(KIMI_LINEAR_4L, KIMI_SMALL, env=KIMI_ENV),
    # The same shape without experts (num_experts null: a dense MLP, no fused-MoE kernel) and the same
    # recover-SSM plan as kimi-linear-4l.
    "kimi-linear-4l-dense": ModelSpec(KIMI_LINEAR_DENSE, KIMI_SMALL, env=KIMI_ENV),
    # The Kimi-K3 deployment widths: n-gram 8 tokens (decode_query_len 9), max_num_seqs 48, a power-of-two
    # grid to 512 -> PIECEWISE 256 ... 1 (capped at 48 x 9 = 432), then FULL 261, 135, 72, 36, 18, 9.
    "kimi-linear-4l-dense-k3": ModelSpec(
        KIMI_LINEAR_DENSE, KIMI_K3_WIDTHS, env=KIMI_ENV, label="powers of two to 512"
    ),
    # The K3 widths with the pre-flight's verified workaround (`check` adds 261 to the grid: PIECEWISE 261
    # is captured first): stock boots it, so vanilla here is the control at the K3 widths.
    "kimi-linear-4l-dense-k3-workaround": ModelSpec(
        KIMI_LINEAR_DENSE, K3_WORKAROUND, env=KIMI_ENV, label="workaround grid (+261)"
    ),
    # The K3 widths with no grid given (no -cc): vLLM derives its own capture sizes; the second control
    # at the K3 widths without the plugin.
    "kimi-linear-4l-dense-k3-derived": ModelSpec(
        KIMI_LINEAR_DENSE, _without_grid(KIMI_K3_WIDTHS), env=KIMI_ENV, label="vLLM's derived grid (no -cc)"
    ),
    # The control at the small settings: vLLM's own derived grid, which stock boots (the pre-flight says
    # so on CPU): what fails after capture without the plugin at all.
    "kimi-linear-4l-dense-safe": ModelSpec(KIMI_LINEAR_DENSE, _without_grid(KIMI_SMALL), env=KIMI_ENV),
    # The Kimi-K3 architecture itself (KimiK3ForConditionalGeneration, full-rank KDA gate: Kimi-K3's own
    # KDA layer and metadata) at the K3 widths, with the pre-flight's workaround grid, and at two more
    # widths from the atlas: n-gram 4, max_num_seqs 16 (cap 80, PIECEWISE 64 then FULL 65: stock crashes
    # (64) vs (65)) and n-gram 7, max_num_seqs 48 (FULL 256 = PIECEWISE 256: stock boots).
    "kimi-k3-4l-k3": ModelSpec(
        KIMI_K3_ARCH, KIMI_K3_WIDTHS, env=KIMI_ENV, label="K3 arch, powers of two to 512"
    ),
    "kimi-k3-4l-k3-workaround": ModelSpec(
        KIMI_K3_ARCH, K3_WORKAROUND, env=KIMI_ENV, label="K3 arch, workaround grid (+261)"
    ),
    "kimi-k3-4l-w4s16": ModelSpec(
        KIMI_K3_ARCH, _widths(4, 16, POWERS_TO_512), env=KIMI_ENV, label="K3 arch, n-gram 4, max_num_seqs 16"
    ),
    "kimi-k3-4l-w7s48": ModelSpec(
        KIMI_K3_ARCH, _widths(7, 48, POWERS_TO_512), env=KIMI_ENV, label="K3 arch, n-gram 7, max_num_seqs 48"
    ),
    # The token check of the shared KDA layer: no speculation (the reference), and n-gram 8 without
    # --use-replayssm (one state slot per draft token, vLLM's default).
    "kimi-linear-4l-dense-k3-nospec": ModelSpec(
        KIMI_LINEAR_DENSE,
        {"max_num_seqs": 48, "compilation_config": {"cudagraph_capture_sizes": POWERS_TO_512}},
        env=KIMI_ENV,
        label="no speculative decoding",
    ),
    "kimi-linear-4l-dense-k3-noreplay": ModelSpec(
        KIMI_LINEAR_DENSE,
        {k: v for k, v in KIMI_K3_WIDTHS.items() if k != "use_replayssm"},
        env=KIMI_ENV,
        label="n-gram 8 without --use-replayssm",
    ),
    # Kimi-K3 as deployed (MXFP4 experts at K3's widths, a DSpark drafter): 8 tokens on the 8-token-block
    # drafter, powers of two to 512: PIECEWISE 256 ... 1, FULL 261 ... 9 (stock crashes (256) vs (261));
    # the pre-flight's workaround grid (+261); the 5-token-block drafter at its own block (FULL 258 > 256:
    # stock crashes (256) vs (258)) and the 7-token one (FULL 256: stock boots), both chosen with `check`.
    "kimi-k3-mxfp4-dspark8": _k3_deployed(8, 8, POWERS_TO_512, ", 8 tokens, powers of two to 512"),
    "kimi-k3-mxfp4-dspark8-workaround": _k3_deployed(
        8, 8, [*POWERS_TO_256, 261, 512], ", workaround grid (+261)"
    ),
    "kimi-k3-mxfp4-dspark5": _k3_deployed(5, None, POWERS_TO_512, " (5 tokens), powers of two to 512"),
    "kimi-k3-mxfp4-dspark7": _k3_deployed(7, None, POWERS_TO_512, " (7 tokens), powers of two to 512"),
    # aux_hidden_states; FULL descriptors are multiples of 3, PIECEWISE go up to 512.
    "qwen3-0.6b-eagle3": ModelSpec(
        QWEN3_06B,
        {"speculative_config": {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 2}},
        draft=EAGLE3_DRAFT_06B,
    ),
}

# ``--executor``: how vLLM runs the workers. ``ray``: RayExecutorV2 worker actors; ``ray-dp``: vLLM's Ray
# data-parallel backend, whose engine core is itself a Ray actor (env from vLLM's get_env_vars_to_copy);
# at TP x PP = 1 it runs the worker in-process, above that through Ray worker actors. Both join the cluster
# RAY_ADDRESS names.
EXECUTORS: dict[str, dict[str, str]] = {
    "mp": {},
    "ray": {"distributed_executor_backend": "ray"},
    "ray-dp": {"data_parallel_backend": "ray"},
}


def model_dir(root: Path, name: str) -> Path:
    """Write the config-only folder (and the draft's) under ``root/models``; returns the model's folder."""
    spec = MODELS[name]
    path = root / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(spec.config, indent=1))
    if spec.draft is not None:
        draft = root / "models" / f"{name}-draft"
        draft.mkdir(parents=True, exist_ok=True)
        (draft / "config.json").write_text(json.dumps(spec.draft, indent=1))
    return path


def engine_kwargs(
    root: Path, name: str, tp: int = 1, pp: int = 1, gpu_mem: float = 0.3, executor: str = "mp"
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` / ``EngineArgs`` for one boot (the same for ``vllm serve``)."""
    draft = str((root / "models" / f"{name}-draft").resolve())
    extra = json.loads(json.dumps(MODELS[name].engine).replace(json.dumps(DRAFT), json.dumps(draft)))
    extra |= EXECUTORS[executor]
    return {
        "model": str(model_dir(root, name).resolve()), "load_format": "dummy", "skip_tokenizer_init": True,
        "seed": 0, "max_model_len": 1024, "gpu_memory_utilization": gpu_mem, "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp, **extra,
    }  # fmt: skip


def serve_argv(kwargs: dict[str, Any]) -> list[str]:
    """``vllm serve`` arguments for ``kwargs``: the model positional, ``--flag`` for True, JSON for dicts."""
    argv = [str(kwargs["model"])]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if key == "model" or value is False or value is None:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv
