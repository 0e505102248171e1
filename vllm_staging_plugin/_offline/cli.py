"""``vllm-staging-plugin``: check an installation on CPU (default), pre-flight ``vllm serve`` arguments
(``check -- ARGS``) and compare receipts (``report``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from .._engine.settings import ENV_ORDER, ENV_PRESIZE, ConfigError, Settings, read_settings
from .preflight import GPUS
from .text import describe_buffers, shorten

# The main job shows a crash and its fix; the pre-flight (`check -- ARGS`) defaults to vLLM's own order.
MAIN_JOB_ORDER = "ascending"


def _installed(versions: dict[str, str | None], dist: str) -> str:
    return f"{dist} {versions[dist]}" if versions[dist] else f"{dist} not installed"


def check(args: argparse.Namespace) -> int:
    """The main job: what is installed, whether the plugin would patch it, and a CPU replay."""
    from .._engine import compat

    versions = compat.installed_versions()
    print(f"vllm-staging-plugin {__version__}")
    print(f"installed: {_installed(versions, 'vllm')}, {_installed(versions, 'torch')}")
    try:
        settings = read_settings()
        from .._engine.policies import allowed_orders, validate_order

        validate_order(settings)
        print(f"configuration: order={settings.order} presize={settings.presize} "
              f"strict={settings.strict} disabled={settings.disabled} "
              f"receipts={settings.receipts_dir or '-'} (valid)")  # fmt: skip
        print(f"order policies: {allowed_orders()}")
    except ConfigError as exc:
        print(f"configuration: INVALID: {exc}")
        return 2
    if versions["vllm"] is None:
        print("would patch: no (vLLM is not installed)")
        return 1
    from .._engine.policies import order_descriptors
    from . import cpu_replay

    try:
        module = cpu_replay.cudagraph_module()
        compat.manager_class(module)
        platform_note = compat.platform_name()
        compat.check_platform()
    except Exception as exc:
        print(f"would patch: no ({type(exc).__name__}: {exc}); vLLM is left untouched")
        return 1
    print(f"would patch: yes ({compat.CUDAGRAPH_MODULE}.{compat.MANAGER_CLASS}; platform "
          f"'{platform_note}')")  # fmt: skip

    cfg = cpu_replay.ReplayConfig(
        mode=args.mode, sizes=cpu_replay.default_sizes(args.max_size),
        max_num_seqs=args.max_num_seqs, hidden_size=args.hidden_size,
    )  # fmt: skip
    order = Settings(order=args.order or MAIN_JOB_ORDER)

    def reorder(descs: list[Any]) -> list[Any]:
        return order_descriptors(order, "replay", descs)

    with cpu_replay.scoped_environ({ENV_ORDER: "descending", ENV_PRESIZE: "on"}):
        stock_default = cpu_replay.replay(cfg, patched=False)
        patched_default = cpu_replay.replay(cfg, patched=True)
        stock = cpu_replay.replay(cfg, patched=False, reorder=reorder)
        patched = cpu_replay.replay(cfg, patched=True, reorder=reorder)
    print()
    print(f"capture plan (real {compat.MANAGER_CLASS} built on CPU; {cfg.mode}, "
          f"{len(cfg.sizes)} sizes up to {max(cfg.sizes)}, max_num_seqs {cfg.max_num_seqs}, "
          f"hidden {cfg.hidden_size} {str(cfg.dtype).removeprefix('torch.')}):")  # fmt: skip
    for mode, tokens in stock_default.sequence.items():
        print(f"  {mode:<10} {len(tokens):>3} descriptors, num_tokens {shorten(tokens)}")
    print(f"  capacity   {stock_default.capacity} rows")
    print(f"  staging    {describe_buffers(patched_default.buffers)}")
    print()
    own = "boots" if stock_default.ok else "crashes"
    print(f"demonstration on this synthetic configuration, not your deployment: vLLM's staging code replayed "
          f"under the order '{order.order}' (in its own descending order stock vLLM {own} here; "
          "`check -- <vllm serve args>` checks a deployment):")  # fmt: skip
    for mode, tokens in stock.sequence.items():
        print(f"  {mode:<10} num_tokens {shorten(tokens)}")
    print(f"  stock    {'OK' if stock.ok else 'CRASH'}: {stock.error or describe_buffers(stock.buffers)}")
    print(
        f"  patched  {'OK' if patched.ok else 'CRASH'}: {patched.error or describe_buffers(patched.buffers)}"
    )
    identical = stock_default.ok and stock_default.buffers == patched_default.buffers
    print(f"under vLLM's own order (descending): stock and patched buffers identical in shape, dtype "
          f"and bytes: {'yes' if identical else 'NO'}")  # fmt: skip
    patched_full = patched.ok and all(b["rows"] >= patched.capacity for b in patched.buffers.values())
    return 0 if identical and patched_full else 1


def report_command(args: argparse.Namespace) -> int:
    from .report import ReportError, report

    try:
        table = report(Path(args.directory), Path(args.plot) if args.plot else None)
    except ReportError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(table)
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-staging-plugin", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command")
    chk = sub.add_parser(
        "check",
        help="(default) inspect vLLM and replay capture staging on CPU; with `-- ARGS`, pre-flight the "
        "arguments you would give `vllm serve` (docs/preflight.md)",
        usage="%(prog)s [--order O] [--mode M] ... | %(prog)s [--order O] [--json] [--gpu G] -- SERVE_ARGS",
    )
    chk.add_argument("--order", default=None, help="order to replay (default: ascending; after `--`: "
                     "$STAGING_PLUGIN_ORDER or descending, vLLM's own)")  # fmt: skip
    chk.add_argument("--json", action="store_true", help="pre-flight only: print one JSON object")
    chk.add_argument("--gpu", choices=sorted(GPUS), default=None,
                     help="pre-flight only: the GPU emulated where there is none (default h200)")  # fmt: skip
    chk.add_argument("--mode", default="FULL_AND_PIECEWISE", help="cudagraph mode")
    chk.add_argument("--max-size", type=int, default=512, help="largest capture size")
    chk.add_argument("--max-num-seqs", type=int, default=128)
    chk.add_argument("--hidden-size", type=int, default=4096)
    rep = sub.add_parser("report", help="compare receipts per configuration and order policy")
    rep.add_argument(
        "directory",
        help="where STAGING_PLUGIN_RECEIPTS_DIR receipts were gathered: every *.json below it is read "
        "(recursively); other JSON files are skipped with one warning each",
    )
    rep.add_argument("--plot", metavar="FILE.png", help="also draw the comparison (needs [plot])")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] | None = None
    if "--" in words:  # everything after the first `--` belongs to `vllm serve`, unparsed here
        cut = words.index("--")
        words, serve_args = words[:cut], words[cut + 1 :]
    if not words or (words[0].startswith("-") and words[0] not in ("-h", "--help", "--version")):
        words.insert(0, "check")  # the default command takes its options without naming it
    parser = build_parser()
    args, unknown = parser.parse_known_args(words)
    if unknown and args.command != "report" and serve_args is None and not unknown[0].startswith("-"):
        print(f"vllm-staging-plugin check: {unknown[0]!r} looks like a model: the vllm serve arguments go "
              "after `--`, as in: vllm-staging-plugin check [--order O] [--json] -- MODEL "
              "[vllm serve arguments]", file=sys.stderr)  # fmt: skip
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "report":
        if serve_args is not None:
            parser.error("report takes no `-- VLLM_SERVE_ARGS`")
        return report_command(args)
    if serve_args is not None:
        from . import preflight

        return preflight.main(serve_args, args.order, args.json, args.gpu or "h200")
    if args.json or args.gpu:
        parser.error("--json and --gpu need `-- VLLM_SERVE_ARGS` (the pre-flight); see docs/preflight.md")
    return check(args)
