"""The ``vllm-staging-plugin`` command: check an installation (the default), pre-flight ``vllm serve``
arguments (``check -- MODEL ...``), compare receipts (``report``) and print the fixes to vLLM
itself that ship with the package (``patch``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from .exits import Exit, say_error
from .gpus import GPUS
from .quiet import quiet_logs
from .scoped import attributes
from .text import describe_buffers, shorten

if TYPE_CHECKING:  # torch and vLLM: imported by the command that needs them, never by --help
    from .main_job import MainJob


def _installed(versions: dict[str, str | None], dist: str) -> str:
    return f"{dist} {versions[dist]}" if versions[dist] else f"{dist} not installed"


def render_main_job(job: MainJob) -> str:
    """The main job's report, as far as the job got."""
    versions = job.versions
    lines = [
        f"vllm-staging-plugin {__version__}",
        f"installed: {_installed(versions, 'vllm')}, {_installed(versions, 'torch')}",
    ]
    if job.config_error is not None:
        return "\n".join([*lines, f"configuration: INVALID: {job.config_error}"])
    settings = job.settings
    assert settings is not None
    lines += [
        f"configuration: order={settings.order} presize={settings.presize} kda_fix={settings.kda_fix} "
        f"strict={settings.strict} disabled={settings.disabled} receipts={settings.receipts_dir or '-'} "
        + ("(valid values; WARNING below)" if job.receipts_warning else "(valid)"),
        *([f"WARNING {job.receipts_warning}"] if job.receipts_warning else []),
        f"order policies: {job.policies}",
    ]
    if job.refusal is not None:
        left = "" if job.versions["vllm"] is None else "; vLLM is left untouched"
        return "\n".join([*lines, f"would patch: no ({job.refusal}){left}"])
    lines.append(f"would patch: yes ({job.manager}; platform '{job.platform}')")
    if settings.disabled:
        lines.append("but STAGING_PLUGIN_DISABLE is set: with it, the plugin leaves vLLM untouched")
    if job.vllm_sizes_staging:
        lines.append(
            "this vLLM sizes its staging buffers to the largest capture descriptor itself: the "
            "plugin leaves them to vLLM (order knob, receipts and KDA fix kept)"
        )
    r = job.replays
    assert r is not None
    cfg, manager = r.cfg, job.manager.rpartition(".")[2]
    lines += [
        "",
        f"capture plan (real {manager} built on CPU; {cfg.mode}, {len(cfg.sizes)} sizes up to "
        f"{max(cfg.sizes)}, max_num_seqs {cfg.max_num_seqs}, hidden {cfg.hidden_size} "
        f"{str(cfg.dtype).removeprefix('torch.')}):",
    ]
    lines += [
        f"  {mode:<10} {len(tokens):>3} descriptors, num_tokens {shorten(tokens)}"
        for mode, tokens in r.stock_default.sequence.items()
    ]
    lines += [
        f"  capacity   {r.stock_default.capacity} rows",
        f"  staging    {describe_buffers(r.patched_default.buffers)}",
        "",
    ]
    own = "boots" if r.stock_default.ok else "crashes"
    lines.append(
        f"demonstration on this synthetic configuration, not your deployment: vLLM's staging code "
        f"replayed under the order '{r.order.order}' (in its own descending order stock vLLM {own} "
        "here; `check -- <vllm serve args>` checks a deployment):"
    )
    lines += [f"  {mode:<10} num_tokens {shorten(tokens)}" for mode, tokens in r.stock.sequence.items()]
    for arm, result in (("stock", r.stock), ("patched", r.patched)):
        outcome = result.error or describe_buffers(result.buffers)
        lines.append(f"  {arm:<8} {'OK' if result.ok else 'CRASH'}: {outcome}")
    lines.append(
        "under vLLM's own order (descending): stock and patched buffers identical in shape, dtype "
        f"and bytes: {'yes' if r.identical else 'NO'}"
    )
    return "\n".join(lines)


def check(args: argparse.Namespace) -> int:
    """The main job: what is installed, whether the plugin would patch it, and a CPU replay."""
    from . import main_job

    given = {dest: getattr(args, dest) for dest in DEMO_DEFAULTS}  # the synthetic configuration
    demo = {dest: DEMO_DEFAULTS[dest] if value is None else value for dest, value in given.items()}
    job = main_job.run(**demo, order=args.order)
    print(render_main_job(job))
    return job.exit_code


def report_command(args: argparse.Namespace) -> int:
    from .report import ReportError, report

    target = Path(args.plot) if args.plot else None
    if target is not None and not target.suffix:  # what matplotlib would write: say that name
        target = target.with_name(f"{target.name}.png")
    try:
        table = report(args.directory, target)
    except ReportError as exc:
        return say_error("vllm-staging-plugin report", exc.code, "", str(exc), as_json=False, labelled=False)
    print(table)
    if target is not None:
        print(f"plot written to {target}")
    return 0


def patch_command(args: argparse.Namespace) -> int:
    """Print a bundled vLLM patch, with a note on stderr where the installed vLLM does not need it."""
    from . import vllm_patches

    try:
        fits = vllm_patches.fits(vllm_patches.plan(args.name))
    except vllm_patches.PatchError:  # no vLLM here to compare with: nothing to say beside the diff
        fits = True
    if _not_needed(args.name, fits):
        print(f"# {NOT_NEEDED}", file=sys.stderr)  # the diff still goes to stdout, for `patch -p1`
    print(vllm_patches.text(args.name), end="")
    return 0


def _not_needed(name: str, fits: bool) -> bool:
    """The presize patch does not fit a vLLM that sizes its staging itself, which its own staging code
    replayed on CPU shows (by behaviour, not by version; run only where the patch does not fit)."""
    if name != "presize" or fits:
        return False
    try:
        from . import cpu_replay  # torch and vLLM

        with quiet_logs(verbose=False):  # vLLM's CPU-only import messages, as the check hides them
            return cpu_replay.vllm_sizes_staging()
    except Exception:  # none here, or a vLLM the replay cannot drive: the patch's own answer stands
        return False


NOT_NEEDED = (
    "vllm-staging-plugin patch: not needed: this vLLM sizes its staging buffers to the largest capture "
    "descriptor itself (its capture staging, replayed on CPU in ascending order, holds the largest "
    "descriptor's rows)"
)

DESCRIPTION = """\
Fix two faults of vLLM's Model Runner V2 (CUDA-graph staging buffers sized too small; Kimi-Linear's
shared KDA layer short of state slots under --use-replayssm), and check a deployment before it boots.

commands:
  check     (the default) without `--`: what is installed, whether the plugin would patch this vLLM,
            and a demonstration replay on a synthetic configuration. With `-- MODEL [vllm serve
            arguments]`: pre-flight that deployment on this machine, GPU or not
  report    compare the receipts gathered under STAGING_PLUGIN_RECEIPTS_DIR (set it in the serving
            environment: each capture writes one JSON receipt into it)
  patch     print a fix to vLLM itself that ships with the plugin (presize, kda), as a diff for
            `patch -p1` in the folder holding vllm/

`vllm-staging-plugin COMMAND --help` explains each command's options and exit codes.
"""
CHECK_USAGE = "vllm-staging-plugin check [options] [-- MODEL [vllm serve arguments]]"
PREFLIGHT_FORM = "vllm-staging-plugin check [options] -- MODEL [vllm serve arguments]"
CHECK_EPILOG = """\
exit codes:
  0  the plugin boots it (pre-flight), or the plugin would patch this vLLM (without `--`).
     Stock vLLM may still crash: the line "stock vLLM (its own order)" says, and so does
     "stock": {"ok": ...} with --json, next to "stock_workaround", a grid stock vLLM boots
  1  it does not boot even with the plugin, or the plugin would not patch this vLLM
  2  bad arguments: vLLM rejects the `vllm serve` arguments, a missing model folder, a model
     whose architecture this vLLM does not know, a bad --order or STAGING_PLUGIN_* value (the
     message names which)
  3  cannot check on this machine: vLLM or torch is not installed here, or vLLM cannot inspect a
     model class it knows, or the configuration, here (the message says what to do: the package to
     install, with its pip command, or to check on the GPU host)
  4  it boots with the plugin but will not serve correctly: vLLM's shared KDA layer (Kimi-Linear)
     under --use-replayssm reads past its state index on each step that mixes a speculative decode
     with a prefill (the WARNING block, or "serve": {"ok": false} with --json, says what to change)
  5  not fully answered: it boots with the plugin as far as checked, but a question was not
     answered here (the serving check, or a replay, stock's or the plugin's, that broke); "NOT ANSWERED"
     at the end of the report, or "answered": false and "unanswered" with --json, says which and why
  70 internal error: a bug in the plugin, or a vLLM change it does not know (one line to report;
     -v prints the traceback)
  With --json, codes 2, 3 and 70 print one object with "error" and "message" on stdout.

examples:
  vllm-staging-plugin check
  vllm-staging-plugin check -- ./my-model --max-num-seqs 48 --use-replayssm \\
      --speculative-config '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}'
  vllm-staging-plugin check --json --gpu h100 -- ./my-model --tensor-parallel-size 8
"""
REPORT_EPILOG = """\
The directory is what STAGING_PLUGIN_RECEIPTS_DIR pointed at: every *.json file below it (any name,
any depth) is read; a file that is not a receipt (not JSON, or JSON without a receipt's fields) is
skipped with one warning naming it.

exit codes:
  0  the table was printed
  1  no capture receipt could be read there, or --plot without matplotlib (the message says why)
  2  bad arguments: the directory does not exist (or is not one), or the --plot file cannot be written
  70 internal error: a bug in the plugin (one line to report; -v prints the traceback)
"""


PATCH_EPILOG = """\
The diff is for `patch -p1` in the folder that holds the installed vllm/ package, for example:
  vllm-staging-plugin patch kda | patch -p1 -d "$(pip show vllm | sed -n 's/^Location: //p')"
pip does not track such a change: reinstalling vLLM undoes it. The plugin itself never edits vLLM's
files; it makes the same fixes in memory, in each vLLM process.

exit codes:
  0  printed (a note on stderr says when the installed vLLM does not need it)
  2  bad arguments
  70 internal error: a bug in the plugin (one line to report)
"""


class _Parser(argparse.ArgumentParser):
    """argparse, except that with ``--json`` a refusal is one JSON object on stdout (exit 2)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        """One line (no usage dump): what is wrong and where the options are explained."""
        _refuse(f"{message} (`{self.prog} --help` explains the options)", _Parser.json_errors, self.prog)


def _refuse(message: str, as_json: bool, prog: str = "vllm-staging-plugin check") -> NoReturn:
    raise SystemExit(say_error(prog, Exit.BAD_INPUT, "bad arguments", message, as_json, labelled=False))


DEMO_DEFAULTS: dict[str, Any] = {
    "mode": "FULL_AND_PIECEWISE",
    "max_size": 512,
    "max_num_seqs": 128,
    "hidden_size": 4096,
}


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="vllm-staging-plugin", description=DESCRIPTION, formatter_class=raw)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", metavar="{check,report,patch}")
    chk = sub.add_parser(
        "check",
        usage=CHECK_USAGE,
        description="Without `--`: what is installed, whether the plugin would patch it, and a replay of "
        "vLLM's real staging code on a synthetic configuration. With `-- MODEL [vllm serve arguments]`: "
        "the arguments go through vLLM's own `vllm serve` parser and config, and the capture plan vLLM "
        "would build is replayed stock (in vLLM's own order) and with the plugin, on CPU.",
        epilog=CHECK_EPILOG,
        formatter_class=raw,
    )
    both = chk.add_argument_group("check options")
    both.add_argument(
        "--order",
        default=None,
        metavar="ORDER",
        help="capture order to replay with the plugin: descending (vLLM's own), ascending, "
        "max-first, shuffle:SEED, full-first, size-descending, interleaved, or a registered policy. "
        "Default: with `--`, "
        "$STAGING_PLUGIN_ORDER or descending; without, ascending (the demonstration)",
    )
    both.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show vLLM's INFO logs and the warnings every machine without a GPU prints (hidden by default)",
    )
    pre = chk.add_argument_group("pre-flight options (with `-- MODEL ...`)")
    pre.add_argument("--json", action="store_true", help="print one JSON object on stdout, also on errors")
    pre.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        default=None,
        help="the GPU emulated on a machine without one (default h200); a GPU host uses its own",
    )
    pre.add_argument(
        "--gpus",
        type=_positive,
        default=None,
        metavar="N",
        help="GPUs on the emulated node (default: what the deployment uses on one node: tensor x pipeline "
        "x prefill-context parallel, times --data-parallel-size-local, else every engine's GPUs spread over "
        "--nnodes)",
    )
    # No argparse defaults here (DEMO_DEFAULTS fills them in): a demonstration option given with `--`,
    # even abbreviated, is then seen as given and refused.
    demo = chk.add_argument_group("demonstration options (without `--`)")
    demo.add_argument(
        "--mode",
        choices=("FULL_AND_PIECEWISE", "FULL", "FULL_DECODE_ONLY", "PIECEWISE"),
        metavar="MODE",
        help="cudagraph mode of the synthetic configuration: FULL_AND_PIECEWISE (default), "
        "FULL, FULL_DECODE_ONLY or PIECEWISE",
    )
    demo.add_argument(
        "--max-size",
        type=_positive,
        metavar="N",
        help="largest capture size of its grid (vLLM's default grid up to N; default "
        f"{DEMO_DEFAULTS['max_size']})",
    )
    demo.add_argument(
        "--max-num-seqs",
        type=_positive,
        metavar="N",
        help=f"its max_num_seqs (default {DEMO_DEFAULTS['max_num_seqs']})",
    )
    demo.add_argument(
        "--hidden-size",
        type=_positive,
        metavar="N",
        help="its hidden size, the staging buffers' width (default "
        f"{DEMO_DEFAULTS['hidden_size']}, Qwen3-8B)",
    )
    rep = sub.add_parser(
        "report",
        description="One table of what each capture staged and cost, per configuration, order and rank.",
        epilog=REPORT_EPILOG,
        formatter_class=raw,
    )
    rep.add_argument("directory", help="where STAGING_PLUGIN_RECEIPTS_DIR receipts were gathered")
    rep.add_argument("--plot", metavar="FILE.png", help="also draw the comparison (needs the [plot] extra)")
    rep.add_argument("-v", "--verbose", action="store_true", help="print the traceback of an internal error")
    from .vllm_patches import PATCHES

    pat = sub.add_parser(
        "patch",
        description="The fixes to vLLM itself that ship with the plugin, unified diffs of vLLM's files, each "
        "checked by CI on every release it is for: "
        + "; ".join(f"{name}: {p.summary} (for vLLM {p.releases})" for name, p in PATCHES.items())
        + ". The diff is printed, for `patch -p1` in the folder holding vllm/.",
        epilog=PATCH_EPILOG,
        formatter_class=raw,
    )
    pat.add_argument("name", choices=sorted(PATCHES), help="which patch")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1 or more")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] | None = None
    if "--" in words:  # everything after the first `--` belongs to `vllm serve`, unparsed here
        cut = words.index("--")
        words, serve_args = words[:cut], words[cut + 1 :]
    if not words or (words[0].startswith("-") and words[0] not in ("-h", "--help", "--version")):
        words.insert(0, "check")  # the default command takes its options without naming it
    parser = build_parser()
    try:
        try:
            with attributes(_Parser, {"json_errors": "--json" in words}):
                code = _run(parser, words, serve_args)
        except SystemExit as exc:  # argparse's refusals and --help, as exit codes
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()  # a reader that went away is met here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:  # the main job's or report's own failure: named, one line
        from . import internal

        verbose = bool({"-v", "--verbose"} & set(words))
        return internal.fail(exc, "vllm-staging-plugin", verbose, as_json="--json" in words)


READER_GONE = 128 + 13  # what a shell reports for a process that SIGPIPE ended, as `git log | head` does


def _reader_gone() -> int:
    """The reader of stdout (or stderr) closed its end, as `| head -1` does: stop quietly. What is still
    buffered goes nowhere, so Python's own flush at exit finds no closed pipe either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # no descriptor (captured in-process): nothing to do
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    return READER_GONE


def _missing_vllm(releases: str) -> str | None:
    """What to install when torch or vLLM is missing here (the plugin's own install brings neither): the
    newest of ``releases`` (``first-last``)."""
    import importlib.util

    absent = [
        name
        for name, dist in (("vLLM", "vllm"), ("torch", "torch"))
        if importlib.util.find_spec(dist) is None
    ]
    if not absent:
        return None
    verb = "are" if len(absent) > 1 else "is"
    release = releases.rsplit("-", 1)[-1]
    return f"{' and '.join(absent)} {verb} not installed here: pip install vllm=={release} (it brings torch)"


def _run(parser: argparse.ArgumentParser, words: list[str], serve_args: list[str] | None) -> int:
    args, unknown = parser.parse_known_args(words)
    if unknown and args.command == "check" and serve_args is None and not unknown[0].startswith("-"):
        _refuse(
            f"{unknown[0]!r} looks like a model: the vllm serve arguments go after `--`, as in: "
            f"{PREFLIGHT_FORM}",
            as_json=args.json,
        )
    if unknown:
        prog = f"{parser.prog} {args.command}"
        _refuse(
            f"unrecognized arguments: {' '.join(unknown)} (`{prog} --help` explains the options)",
            as_json=getattr(args, "json", False),
            prog=prog,
        )
    if args.command in ("report", "patch"):
        if serve_args is not None:
            parser.error(f"{args.command} takes no `-- MODEL [vllm serve arguments]`")
        if args.command == "report":
            return report_command(args)
        return patch_command(args)
    if serve_args is not None and not serve_args:
        _refuse(f"nothing after `--`: {PREFLIGHT_FORM}", args.json)
    demo = [f"--{dest.replace('_', '-')}" for dest in DEMO_DEFAULTS if getattr(args, dest, None) is not None]
    if serve_args is not None and demo:  # ignored by the pre-flight: never silently
        _refuse(
            f"{', '.join(demo)}: options of the demonstration (without `--`); a vllm serve option goes "
            f"after `--`: {PREFLIGHT_FORM}",
            args.json,
        )
    from .._engine.compat import SHAPES

    missing = _missing_vllm(SHAPES[-1].releases)  # the newest release the plugin knows
    if missing is not None:
        return say_error(
            "vllm-staging-plugin check",
            Exit.CANNOT_CHECK,
            "cannot check on this machine",
            missing,
            as_json=args.json,
        )
    with quiet_logs(args.verbose):
        if serve_args is not None:
            from . import preflight

            return preflight.main(
                serve_args, args.order, args.json, args.gpu or "h200", args.gpus, args.verbose
            )
        if args.json or args.gpu or args.gpus:
            pre = "--json, --gpu and --gpus belong to the pre-flight: add `-- MODEL [vllm serve arguments]`"
            _refuse(pre, args.json)
        if args.order:
            _order_or_refuse(args.order)
        return check(args)


def _order_or_refuse(order: str) -> None:
    """A bad --order of the main job: one line naming the flag, exit 2 (as the pre-flight does)."""
    from .preflight.arguments import check_order
    from .preflight.refusals import BadArguments

    try:
        check_order(order)
    except BadArguments as exc:
        _refuse(str(exc), as_json=False)
