"""The main job's answer (``vllm-staging-plugin`` with no pre-flight arguments): what is installed, whether
the plugin would patch it, and a CPU replay of vLLM's staging on a synthetic configuration, stock and
patched, in vLLM's order and in another; ``cli`` renders it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._engine.settings import DEFAULT_ORDER, ConfigError, Settings, read_settings
from .exits import Exit
from .writable import receipts_warning

if TYPE_CHECKING:  # torch and vLLM: imported once the configuration is valid
    from . import cpu_replay

# The main job shows a crash and its fix; the pre-flight (`check -- ARGS`) defaults to vLLM's own order.
MAIN_JOB_ORDER = "ascending"


@dataclass
class Replays:
    """The four replays: stock and patched, in vLLM's order and in ``order``."""

    cfg: cpu_replay.ReplayConfig
    order: Settings
    stock_default: cpu_replay.ReplayResult
    patched_default: cpu_replay.ReplayResult
    stock: cpu_replay.ReplayResult
    patched: cpu_replay.ReplayResult

    @property
    def identical(self) -> bool:
        """Under vLLM's own order the plugin's buffers are stock's, where stock boots."""
        return self.stock_default.ok and self.stock_default.buffers == self.patched_default.buffers


@dataclass
class MainJob:
    """Everything the main job found, in the order it found it; a later part is None when an earlier one
    stopped the job (an invalid configuration, no vLLM, a vLLM the plugin would not patch)."""

    versions: dict[str, str | None]
    settings: Settings | None = None
    config_error: str | None = None
    policies: str = ""
    receipts_warning: str | None = None  # STAGING_PLUGIN_RECEIPTS_DIR cannot be written
    refusal: str | None = None  # why the plugin would not patch this vLLM
    manager: str = ""  # module.class the plugin patches
    platform: str = ""
    vllm_sizes_staging: bool = False
    replays: Replays | None = None

    @property
    def exit_code(self) -> Exit:
        if self.config_error is not None:
            return Exit.BAD_INPUT
        if self.replays is None:
            return Exit.FAILS
        patched = self.replays.patched
        return Exit.OK if self.replays.identical and patched.holds(patched.capacity) else Exit.FAILS


def run(mode: str, max_size: int, max_num_seqs: int, hidden_size: int, order: str | None) -> MainJob:
    from .._engine import compat
    from .._engine.policies import PolicyRegistry

    job = MainJob(compat.installed_versions())
    try:
        job.settings = read_settings()
        policies = PolicyRegistry.load()
        if job.settings.order != DEFAULT_ORDER:
            policies.validate(job.settings)
        job.policies = policies.allowed()
        job.receipts_warning = receipts_warning(job.settings.receipts_dir)
    except ConfigError as exc:
        job.config_error = str(exc)
        return job
    if job.versions["vllm"] is None:
        job.refusal = "vLLM is not installed"
        return job
    from . import cpu_replay, seams

    try:
        compat.manager_class(seams.cudagraph_module())
        job.platform = compat.platform_name()
        compat.check_platform()
    except Exception as exc:
        job.refusal = f"{type(exc).__name__}: {exc}"
        return job
    job.manager = f"{compat.CUDAGRAPH_MODULE}.{compat.MANAGER_CLASS}"
    job.vllm_sizes_staging = cpu_replay.vllm_sizes_staging()
    cfg = cpu_replay.ReplayConfig(
        mode=mode,
        sizes=cpu_replay.default_sizes(max_size),
        max_num_seqs=max_num_seqs,
        hidden_size=hidden_size,
    )
    # The order goes through the plugin's own policy path, as in an engine (cpu_replay.arm_settings).
    chosen = cpu_replay.arm_settings(order or MAIN_JOB_ORDER)
    on_stock = cpu_replay.arm_settings(chosen.order, stock=True)
    job.replays = Replays(
        cfg,
        chosen,
        stock_default=cpu_replay.replay(cfg, patched=False),
        patched_default=cpu_replay.replay(cfg, patched=True),
        stock=cpu_replay.replay(cfg, patched=True, settings=on_stock),
        patched=cpu_replay.replay(cfg, patched=True, settings=chosen),
    )
    return job
