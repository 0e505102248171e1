"""A standalone replay of the shared Kimi-Linear KDA layer's speculative call on a step that mixes a
speculative decode with a prefill: vLLM 0.33.0's own ``fused_recurrent_kda`` (the function the layer calls)
with the argument shapes the layer passes at the K3 widths (one request, 1 + 8 query tokens, 32 heads of
128), once per state-index layout. Run it under compute-sanitizer with PyTorch's caching allocator off, so
that each tensor is its own device allocation and a read past the index's end is reported:

  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python lab/kda_replay.py short

Layouts: ``short`` the (1, 1) index the layer builds for a mixed step under --use-replayssm (one word
allocated, 1 + num_spec read); ``padded`` the padding control, a (1, 1) view whose storage holds 9 words of
the request's slot (the same kernel specialization); ``staged`` the (1, 9) row the FULL-graph buffer holds
on a pure speculative step (one slot broadcast). Prints one JSON line with what was passed and read.
"""

from __future__ import annotations

import json
import sys

import torch

HEADS, DIM, SPEC, SLOTS, SLOT = 32, 128, 8, 64, 5


def index_for(layout: str) -> torch.Tensor:
    query = 1 + SPEC
    if layout == "short":
        return torch.tensor([[SLOT]], dtype=torch.int32, device="cuda")
    if layout == "padded":
        return torch.full((query,), SLOT, dtype=torch.int32, device="cuda")[:1].view(1, 1)
    if layout == "staged":
        return torch.full((1, query), SLOT, dtype=torch.int32, device="cuda")
    raise SystemExit(f"layout: short, padded or staged, not {layout!r}")


def main() -> int:
    from vllm.models.kimi_k3.nvidia.ops.third_party.kda import fused_recurrent_kda

    layout = sys.argv[1] if len(sys.argv) > 1 else "short"
    query = 1 + SPEC
    torch.manual_seed(0)
    shape = (1, query, HEADS, DIM)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    raw_g = torch.randn(1, query, HEADS * DIM, dtype=torch.bfloat16, device="cuda").view(shape)
    raw_beta = torch.randn(1, query, HEADS, dtype=torch.bfloat16, device="cuda")
    a_log = torch.zeros(HEADS, dtype=torch.float32, device="cuda")
    dt_bias = torch.zeros(HEADS * DIM, dtype=torch.float32, device="cuda")
    state = torch.zeros(SLOTS, HEADS, DIM, DIM, dtype=torch.float32, device="cuda")
    cu_seqlens = torch.tensor([0, query], dtype=torch.int32, device="cuda")
    accepted = torch.ones(1, dtype=torch.int32, device="cuda")
    index = index_for(layout)
    out, _ = fused_recurrent_kda(
        q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=a_log, dt_bias=dt_bias, lower_bound=None,
        initial_state=state, cu_seqlens=cu_seqlens, ssm_state_indices=index, num_accepted_tokens=accepted,
    )  # fmt: skip
    torch.cuda.synchronize()
    allocated = index.untyped_storage().nbytes() // 4 - index.storage_offset()
    print(json.dumps({"layout": layout, "shape": list(index.shape), "stride": list(index.stride()),
                      "words_read": (index.shape[0] - 1) * index.stride(0) + query,
                      "words_allocated": allocated, "state_slots": SLOTS,
                      "slots_written": sorted(int(i) for i in state.flatten(1).abs().sum(1).nonzero()),
                      "out_finite": bool(torch.isfinite(out).all())}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
