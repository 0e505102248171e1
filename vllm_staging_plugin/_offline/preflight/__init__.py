"""``vllm-staging-plugin check -- <vllm serve arguments>``: would this configuration boot, stock and patched?

vLLM's own parser and config (:mod:`.configure`), its CUDA platform emulated for device queries only
(:mod:`.platform`), its real manager's staging code on CPU tensors (:mod:`.replay`); docs/preflight.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..._engine.settings import ENV_ORDER, ConfigError, Settings, read_settings
from .. import internal, scoped, seams
from ..exits import Exit, say_error
from ..gpus import GPUS, Gpu
from ..text import first_line
from ..writable import receipts_warning
from . import workaround
from .arguments import PARSER_MODULE, check_order, has_serve_parser, parse_serve_arguments
from .configure import create_engine_config, inspect_model_classes
from .missing import missing_behind, missing_module
from .model_source import check_model, check_model_early, draft_model
from .phases import Phases
from .platform import node_gpus, platform_for_check, platform_json
from .refusals import GPU_HOST, BadArguments, CannotCheckHere
from .render import render
from .result import Preflight, ServingFix, StageResult

__all__ = [
    "GPUS", "exit_code", "main", "run",
]  # fmt: skip


@contextlib.contextmanager
def _installer_kept() -> Iterator[None]:
    """vLLM's argument parsing loads the general plugins, this one included (``register()``): a process
    that had not registered the plugin before the check has it unregistered again after."""
    import vllm_staging_plugin

    before = vllm_staging_plugin._installed
    try:
        yield
    finally:
        if before is None and vllm_staging_plugin._installed is not None:
            vllm_staging_plugin.unregister()


@contextlib.contextmanager
def _logs_to_stderr() -> Iterator[None]:
    """Keep stdout for the report (one JSON object with --json): vLLM logs to stdout by default."""
    import logging

    moved = [
        h
        for h in logging.getLogger("vllm").handlers
        if isinstance(h, logging.StreamHandler) and h.stream is sys.stdout
    ]
    for handler in moved:
        handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # handlers vLLM configures meanwhile bind stderr
            yield
    finally:
        for handler in moved:
            handler.setStream(sys.stdout)


def run(
    argv: Sequence[str],
    order: str = "descending",
    gpu: Gpu = GPUS["h200"],
    order_from: str = "--order",
    gpus: int | None = None,
    kda_fix: str = "on",
) -> Preflight:
    """Parse, configure, build the manager and replay both arms at every pipeline position; when stock
    crashes, find and verify a grid that boots it. Raises BadArguments / CannotCheckHere.

    ``order_from`` names where the order came from (the flag or the variable) in a refusal; ``gpus`` is
    the emulated node's GPU count (default: what the deployment uses on one node).
    """
    phases = Phases()
    started = time.perf_counter()
    from ..._engine import compat

    check_order(order, order_from)
    early = check_model_early(argv)
    checked: set[tuple[str, str | None]] = {(early, None)} if early else set()  # (model, revision): once
    from .. import cpu_replay  # torch and vLLM: only once the arguments look right
    from .replay import replay_stock

    versions = compat.installed_versions()
    if versions["vllm"] is None:
        raise CannotCheckHere("vLLM is not installed in this environment")
    if not has_serve_parser():
        raise CannotCheckHere(
            f"the check builds on the `vllm serve` parser of vLLM 0.33.0 and later ({PARSER_MODULE}), "
            f"which vLLM {versions['vllm']} lacks; the plugin itself runs on 0.18.0 and later"
        )
    with scoped.kept(os.environ), _installer_kept(), platform_for_check(gpu) as (platform, emulated):
        phases.add("imports", time.perf_counter() - started)  # vLLM's modules, under this machine's platform

        def configure(words: Sequence[str]) -> Any:
            # the parser's defaults build a DeviceConfig too, so it runs on the check's platform
            args = parse_serve_arguments(words)
            model = (str(args.model), getattr(args, "revision", None))
            if model not in checked:  # `--model X` or `--revision`: what the early check left
                check_model(*model)
                checked.add(model)  # the workaround's replays keep the model and the drafter
            draft = draft_model(getattr(args, "speculative_config", None))
            if draft is not None and draft not in checked:
                check_model(*draft, role="speculative model")
                checked.add(draft)
            if emulated:
                type(platform).emulated_count = gpus or node_gpus(args)
            with phases.phase("inspect"):  # vLLM caches it: the configuration build below finds it
                inspect_model_classes(str(args.model))
            config = create_engine_config(args, words)
            if not getattr(config, "use_v2_model_runner", True):  # a release without V1 has no flag
                raise CannotCheckHere(
                    "vLLM picks Model Runner V1 for this configuration: it has no ModelCudaGraphManager, "
                    "so neither the plugin nor this check applies"
                )
            return config

        with phases.phase("configure"):
            vllm_config = configure(argv)
        try:
            compat.manager_class(seams.cudagraph_module())
        except compat.IncompatibleVllm as exc:
            raise CannotCheckHere(f"this vLLM has no supported manager: {exc}") from exc
        parallel = vllm_config.parallel_config
        settings = cpu_replay.arm_settings(order, kda_fix=kda_fix)
        with phases.phase("replay"):
            inputs, stages = _replayed(vllm_config, settings)
            kda_step, kda_step_error = _kda_step(vllm_config)
            kda_plugin = (
                _kda_step(vllm_config, settings)[0] if kda_step is not None and kda_step.faults else None
            )
        serving_fix = None
        if kda_step is not None and kda_step.faults:
            with phases.phase("serving fix"):
                serving_fix = _without_replayssm(argv, configure, settings)
        plan = stages[-1].stock.plan  # vLLM's own plan (the same at every stage)
        compilation = vllm_config.compilation_config
        sizes = sorted(compilation.cudagraph_capture_sizes or [])
        fix = None
        if any(s.stock.crashed for s in stages):  # not on a broken replay: it answers nothing

            def stock_check(words: Sequence[str]) -> tuple[bool, dict[str, list[int]], list[int]]:
                config = configure(words)
                runs = replay_stock(config, seams.manager_inputs(config))
                used = sorted(config.compilation_config.cudagraph_capture_sizes or [])
                return all(arm.ok for arm in runs), runs[-1].plan, used

            tokens = int(vllm_config.num_speculative_tokens)
            with phases.phase("workaround"):
                fix = workaround.find(argv, sizes, plan, stock_check, tokens, _query_lengths(vllm_config))
    with phases.phase("replay"):  # under this machine's own platform, as the CPU replay expects
        presizes = cpu_replay.vllm_sizes_staging()
    model_config = vllm_config.model_config
    notes = list(inputs.notes)
    if not any(plan.values()):
        notes.append("no CUDA graph is captured (cudagraph mode NONE or no sizes): no staging buffer exists")
    crashed = next((s for s in stages if not s.stock.ok), stages[-1])
    failed = next((s for s in stages if not s.plugin.ok), stages[-1])
    return Preflight(
        vllm_version=versions["vllm"],
        torch_version=versions["torch"],
        platform=platform_json(platform, emulated, gpu),
        model=str(model_config.model),
        architecture=getattr(model_config, "architecture", None),
        cudagraph_mode=inputs.cudagraph_mode,
        capture_sizes=sizes,
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        decode_query_len=inputs.decode_query_len,
        use_kda_recoverssm=bool(getattr(vllm_config.cache_config, "use_kda_recoverssm", False)),
        hidden_size=inputs.hidden_size,
        dtype=str(inputs.dtype).removeprefix("torch."),
        capacity=workaround.widest(plan),
        sequence=plan,
        stock=crashed.stock,
        plugin=failed.plugin,
        order=order,
        notes=notes,
        stages=stages,
        parallel={
            "tensor_parallel_size": int(parallel.tensor_parallel_size),
            "pipeline_parallel_size": int(parallel.pipeline_parallel_size),
            "data_parallel_size": int(parallel.data_parallel_size),
            "world_size": int(parallel.world_size),
            "nnodes": int(getattr(parallel, "nnodes", 1) or 1),
        },
        workaround=fix,
        seconds=phases.rounded(),
        vllm_sizes_staging=presizes,
        kda_step=kda_step,
        kda_step_error=kda_step_error,
        kda_step_plugin=kda_plugin,
        kda_fault_at_boot=seams.fault_at_boot(),
        serving_fix=serving_fix,
    )


def _kda_step(vllm_config: Any, settings: Settings | None = None) -> tuple[Any, str | None]:
    """vLLM's shared KDA layer on a speculative decode beside a prefill (seams.kda_mixed_step): stock, or
    with the plugin's own KDA state-slot fix when ``settings`` turn it on; a check that cannot be made
    here is reported, never fatal."""
    from ..._engine.kda_fix import KdaFix

    adjust = None
    if settings is not None and settings.kda_fix == "on":
        fix = KdaFix(settings)

        def adjust(spec: Any) -> Any:
            return fix.keep_slots("KimiGatedDeltaNetAttention", vllm_config, spec, quiet=True)

    try:
        return seams.kda_mixed_step(vllm_config, adjust), None
    except Exception as exc:
        architectures = getattr(vllm_config.model_config, "architectures", None) or []
        missing = missing_behind(exc, [a for a in architectures if isinstance(a, str)])
        if missing is not None:
            return None, f"vLLM cannot load the model class: {missing.advice}"
        return None, f"{type(exc).__name__}: {first_line(str(exc))}"


REPLAYSSM_FLAGS = ("--use-replayssm", "--use_replayssm")


def _without_replayssm(argv: Sequence[str], configure: Any, settings: Any) -> ServingFix:
    """The arguments without ``--use-replayssm`` through the whole check again: vLLM's config, both arms
    at every stage and the serving question (the KDA fault's first fix, verified, not assumed)."""
    words = [w for w in argv if w.split("=", 1)[0] not in REPLAYSSM_FLAGS]
    config = configure(words)
    stages = _replayed(config, settings)[1]
    capacity = workaround.widest(stages[-1].stock.plan)
    plugin_boots = all(s.plugin.holds(capacity) for s in stages)
    step, error = _kda_step(config)
    serves = None if error is not None else (step is None or not step.faults)
    return ServingFix(words, all(s.stock.ok for s in stages), plugin_boots, serves)


def _replayed(vllm_config: Any, settings: Settings) -> tuple[seams.ManagerInputs, list[StageResult]]:
    """Both arms at every pipeline stage: stock in vLLM's own order, then the plugin with ``settings``."""
    from .replay import pipeline_stages, replay_arm, replay_stock

    inputs = seams.manager_inputs(vllm_config)
    stock = replay_stock(vllm_config, inputs)
    stages = [
        StageResult(stage.index, stage.staged, arm, replay_arm(vllm_config, inputs, True, stage, settings))
        for stage, arm in zip(pipeline_stages(vllm_config), stock, strict=True)
    ]
    return inputs, stages


def _query_lengths(vllm_config: Any) -> list[int]:
    """Every decode query length the FULL descriptors are rounded to: 1 + the speculative tokens, and
    1 + each tier's tokens under a dynamic schedule."""
    spec = vllm_config.speculative_config
    tiers = getattr(spec, "num_speculative_tokens_per_batch_size", None) or []
    return [int(vllm_config.num_speculative_tokens) + 1, *(1 + int(tier[-1]) for tier in tiers)]


def main(
    serve_argv: Sequence[str],
    order: str | None,
    as_json: bool,
    gpu_name: str = "h200",
    gpus: int | None = None,
    verbose: bool = False,
) -> int:
    """Run the pre-flight and print it; the exit code says whether the plugin boots the configuration."""
    order_from = "--order" if order else ENV_ORDER
    try:  # the deployment's variables, as register() reads them in vLLM (--order in place of the variable)
        settings = read_settings({**os.environ, **({ENV_ORDER: order} if order else {})})
        warning = receipts_warning(settings.receipts_dir)
        if warning is not None:  # said before the check's minutes, on stderr (stdout is the report's)
            print(f"vllm-staging-plugin check: WARNING {warning}", file=sys.stderr)
        with _logs_to_stderr():
            result = run(serve_argv, settings.order, GPUS[gpu_name], order_from, gpus, settings.kda_fix)
    except (BadArguments, ConfigError) as exc:  # ConfigError: a variable, or register() in vLLM's parser
        return _fail(Exit.BAD_INPUT, "bad arguments", str(exc), as_json)
    except SystemExit as exc:  # vLLM's parser printed its --help (to stderr: stdout is the report's)
        if not as_json or exc.code not in (0, None):
            raise
        said = "--help after `--` prints vllm serve's help, which is no report: leave out --json to read it"
        return _fail(Exit.BAD_INPUT, "bad arguments", said, as_json)
    except CannotCheckHere as exc:
        return _fail(Exit.CANNOT_CHECK, "cannot check on this machine", str(exc), as_json)
    except Exception as exc:  # one line, never a traceback (but under -v)
        if internal.is_internal(exc):
            return internal.fail(exc, "vllm-staging-plugin check", verbose, as_json)
        if verbose:
            print(internal.traceback_text(exc), file=sys.stderr, end="")
        missing = missing_module(exc)  # wherever in the check vLLM's import of it failed
        message = (
            missing.advice
            if missing is not None
            else f"{type(exc).__name__}: {first_line(str(exc))}; {GPU_HOST}"  # vLLM raised inspecting it
        )
        return _fail(Exit.CANNOT_CHECK, "cannot check on this machine", message, as_json)
    code = exit_code(result)
    if as_json:
        print(json.dumps({**result.to_json(), "exit_code": int(code)}, indent=1))
    else:
        print(render(result))
    return int(code)


def exit_code(result: Preflight) -> Exit:
    """1 when the plugin does not boot it, 4 when it boots but will not serve, 5 when a question was not
    answered here (a replayed arm broke, or the serving check), else 0."""
    plugin_arms = [s.plugin for s in result.stages]
    if not result.plugin_boots:
        return Exit.FAILS if all(arm.conclusive for arm in plugin_arms) else Exit.NOT_ANSWERED
    if not result.plugin_serves:
        return Exit.WILL_NOT_SERVE
    return Exit.NOT_ANSWERED if result.unanswered else Exit.OK


def _fail(code: Exit, what: str, message: str, as_json: bool) -> int:
    return say_error("vllm-staging-plugin check", code, what, message, as_json)
