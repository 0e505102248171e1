"""The pre-flight's text report."""

from __future__ import annotations

from ... import __version__
from ..text import describe_buffers, shorten
from .result import Preflight


def render(result: Preflight) -> str:
    """The human-readable report."""
    p = result.platform
    platform = f"{p['name']} ({p['gpu']})"
    if p["emulated"]:
        major, minor = p["capability"]
        platform = (
            f"emulated CUDA: vLLM's CudaPlatform, device queries answered for {p['gpu']}, "
            f"sm_{major}{minor}, {p['memory_bytes'] / 1024**3:.1f} GiB (no GPU here)"
        )
    lines = [
        f"vllm-staging-plugin {__version__} pre-flight: vllm {result.vllm_version or 'not installed'}, "
        f"torch {result.torch_version or 'not installed'}",
        f"platform: {platform}",
        f"model: {result.model} ({result.architecture}), hidden {result.hidden_size} {result.dtype}",
        f"config: {result.cudagraph_mode}, capture sizes {shorten(result.capture_sizes)}, max_num_seqs "
        f"{result.max_num_seqs}, decode_query_len {result.decode_query_len}"
        + (", KDA recover-SSM on" if result.use_kda_recoverssm else ""),
        "",
        "capture plan (vLLM's own order):",
    ]
    for mode, tokens in result.sequence.items():
        lines.append(f"  {mode:<10} {len(tokens):>3} descriptors, num_tokens {shorten(tokens)}")
    lines.append(f"  capacity   {result.capacity} rows")
    lines.append(
        f"  staging    {describe_buffers(result.plugin.buffers)} (total {result.staging_bytes} bytes)"
    )
    lines.append("")
    stock = result.stock
    if stock.ok and result.kda_fault_at_boot and not result.serves:
        held = describe_buffers(stock.buffers)
        lines.append(
            f"stock vLLM (its own order): its staging holds ({held}), but it dies at boot in its "
            "warm-up, before the capture (serving, below)"
        )
    elif stock.ok:
        lines.append(f"stock vLLM (its own order): boots ({describe_buffers(stock.buffers)})")
    elif not stock.conclusive:
        lines.append(f"stock vLLM (its own order): NOT ANSWERED here, the replay broke ({stock.error})")
    else:
        lines.append("stock vLLM (its own order): crashes at capture")
        lines.append(f"  allocated by  {stock.allocated_by}")
        lines.append(f"  did not fit   {stock.failed_at}")
        lines.append(f"  vLLM's error  {stock.error}")
    if result.vllm_sizes_staging:
        lines.append(
            "this vLLM sizes its staging buffers to the largest capture descriptor itself: its staging "
            "holds in any capture order, and the plugin leaves the buffers to vLLM (it keeps the order knob "
            "STAGING_PLUGIN_ORDER, receipts and its KDA state-slot fix)"
        )
    if result.plugin_boots:
        same = result.identical_to_stock
        extra = "; buffers identical to stock" if same else ""
        lines.append(f"with the plugin (order {result.order}): boots, {result.capacity}-row buffers{extra}")
    else:
        why = result.plugin.error or f"buffers hold fewer than {result.capacity} rows"
        lines.append(f"with the plugin (order {result.order}): does NOT boot: {why}")
    lines.append(f"ranks: {result.ranks_replayed}")
    lines.extend(result.serve_lines())
    fix = result.workaround
    if fix is not None:
        lines.append("")
        if fix.verified:
            more = f"{fix.extra_graphs} more CUDA graph{'s' if fix.extra_graphs != 1 else ''}"
            lines.append(
                f"without the plugin: give vLLM this grid instead of yours ({more}; stock vLLM "
                "replayed with it boots):"
            )
            lines.append(f"  {fix.argument}")
        else:
            lines.append(f"without the plugin: no grid found that stock vLLM boots ({fix.note})")
        if fix.nearby_widths:
            widths = " or ".join(str(w) for w in fix.nearby_widths)
            lines.append(f"  or keep your grid with {widths} speculative tokens: stock vLLM boots that too")
        if not result.serves:
            lines.append(
                "  this gets stock vLLM through the capture only: the serving fault above stays "
                "(its fixes are above)"
            )
        elif result.kda_step_error is not None:
            lines.append("  whether it then serves was not checked here (see serving above)")
    if result.fixed_in_vllm is not None:
        lines.append("")
        lines.append(
            f"or upgrade: vLLM {result.fixed_in_vllm} sizes its staging buffers itself, and this "
            "crash is gone there"
        )
        if not result.serves:  # the GPU records: 0.34.0 runs such a step in its boot warm-up
            lines.append(
                f"  the serving fault above is not: vLLM {result.fixed_in_vllm} runs such a step in its "
                "boot warm-up and dies at boot, unless the plugin or the kda patch fixes the layer"
            )
    if result.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in result.notes)
    if result.unanswered:
        lines += ["", "NOT ANSWERED here (the report above is incomplete):"]
        lines.extend(f"  {gap}" for gap in result.unanswered)
    return "\n".join(lines)
