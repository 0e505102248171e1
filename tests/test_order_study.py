"""The capture-order study's harness (``lab/``): the stage plans every order on both models, the
engine log's KV-cache lines are read, and the order table's ratios and picture come from the records."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))  # the study package, as lab/order_study.py imports it

from study import boot, logs, summary  # noqa: E402
from study.plan import ORDERS, STOPPED, Cell  # noqa: E402
from study.scheduler import Running, stop_running, typical_wall  # noqa: E402

from vllm_staging_plugin._engine.policies import BuiltinPolicies  # noqa: E402

pytestmark = pytest.mark.extended  # the lab's own code: `pytest -m extended` (CI) runs it


def test_the_study_knows_every_builtin_order() -> None:
    assert {o.partition(":")[0] for o in ORDERS} == set(BuiltinPolicies.NAMES)


BOTH = ("qwen3-8b", "kimi-k3-mxfp4-dspark8")


def dry_run(tmp_path: Path, stage: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``session.sh STAGE`` planning only, its records and archive under ``tmp_path``."""
    env = {"DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "STUDY_DIR": str(tmp_path / "study")} | env  # fmt: skip
    return subprocess.run(["bash", "lab/gpu/session.sh", stage], cwd=ROOT, env=os.environ | env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize(("models", "planned"), [(None, BOTH), ("kimi-k3-mxfp4-dspark8", BOTH[1:])])
def test_the_stage_plans_the_asked_orders_and_models_one_boot_at_a_time(
    tmp_path: Path, models: str | None, planned: tuple[str, ...]
) -> None:
    narrowed = {"MODELS": models} if models else {}
    run = dry_run(tmp_path, "v034-order", ORDERS="full-first interleaved", **narrowed)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("would boot")]
    booted = sorted(line.split()[2] for line in lines)
    assert booted == sorted(f"r{r}-{m}-{o}-plugin" for r in (0, 1) for o in ("full-first", "interleaved")
                            for m in planned)  # fmt: skip
    assert "up to 1 at once, 1 per GPU" in run.stdout  # vLLM's "took" reads the whole device
    for line in lines:
        assert json.loads(line.split(" ", 4)[4].rsplit(" env=", 1)[0])["gpu_memory_utilization"] == 0.7


def test_a_seeded_stage_boots_only_what_the_earlier_archive_lacks(tmp_path: Path) -> None:
    def record(r: int, order: str, **extra: Any) -> dict[str, Any]:
        return {"boot_id": f"r{r}-qwen3-8b-{order}-plugin", "model": "qwen3-8b", "order": order,
                "arm": "plugin", "round": r, "ok": True} | extra  # fmt: skip

    archive, boots = tmp_path / "earlier.tar.gz", tmp_path / "earlier" / "boots"
    boots.mkdir(parents=True)
    for b in (record(0, "full-first"), record(1, "full-first"),
              record(5, "interleaved", ok=False, error=f"{STOPPED} the study was stopped")):  # fmt: skip
        (boots / f"{b['boot_id']}.json").write_text(json.dumps(b))
    (tmp_path / "earlier" / "env.txt").write_text("0, NVIDIA H200, 580.159.04, 143771 MiB\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(boots, "boots")
        tar.add(tmp_path / "earlier" / "env.txt", "env.txt")
    plan = {"ORDERS": "full-first interleaved", "MODELS": "qwen3-8b"}
    run = dry_run(tmp_path, "v033-order", **plan, SEED=str(archive))
    assert run.returncode == 0, run.stderr
    booted = [line.split()[2] for line in run.stdout.splitlines() if line.startswith("would boot")]
    # full-first has its two; the stopped boot is no measurement, and numbering follows the last counted
    assert booted == ["r2-qwen3-8b-interleaved-plugin", "r3-qwen3-8b-interleaved-plugin"]
    with tarfile.open(tmp_path / "out" / "v033-order.tar.gz") as tar:
        names = tar.getnames()
    assert "boots/r1-qwen3-8b-full-first-plugin.json" in names and "seed-env/earlier.txt" in names
    assert "| qwen3-8b | 1 | 1 | mp | llm | full-first | plugin | 2/2 |" in run.stdout  # pooled
    bad = dry_run(tmp_path, "v033-order", **plan, SEED=str(tmp_path / "missing.tar.gz"))
    assert bad.returncode == 5 and "SEED: cannot unpack" in bad.stdout


def test_the_deadline_expects_a_typical_boot_not_a_compiling_one() -> None:
    walls = {"k3": [244.0]}  # the model's first boot compiled (vLLM 0.33.0, one H200)
    assert typical_wall("k3", walls) == 60.0
    walls["qwen3"] = [161.0, 65.0, 63.0]
    assert typical_wall("k3", walls) == typical_wall("qwen3", walls) == 64.0  # the later boots
    walls["k3"].append(74.0)
    assert typical_wall("k3", walls) == 74.0


def test_asking_a_worker_for_its_ray_actor_starts_no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    class Ray:  # a module vLLM imported without connecting it; get_runtime_context() auto-starts Ray
        connected = False

        def is_initialized(self) -> bool:
            return self.connected

        def get_runtime_context(self) -> Any:
            started.append("ray.init")
            return argparse.Namespace(get_actor_id=lambda: "actor-1")

    ray = Ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    worker = argparse.Namespace(rank=0, model_runner=None)
    assert boot.runner_of(worker)["ray_actor_id"] is None and started == []
    ray.connected = True  # a Ray actor
    assert boot.runner_of(worker)["ray_actor_id"] == "actor-1"


def test_a_boot_that_faulted_before_the_study_stopped_it_keeps_its_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A boot whose process hangs after a CUDA fault is ended by the deadline: its log still counts
    (2026-12-06, vLLM 0.33.0: the second no-plugin boot faulted at the join step, then hung)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "boots").mkdir()
    fault = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    running = []
    for r, tail in ((0, fault), (1, "Graph capturing finished in 1 secs, took 0.61 GiB")):
        cell = Cell(round=r, model="kimi-linear-4l-dense-k3", order="descending", arm="vanilla")
        log = tmp_path / "logs" / f"{cell.boot_id}.log"
        log.write_text(f"(EngineCore pid=1) INFO 12-06 04:49:12 [core.py:1] ready\n{tail}\n")
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a hung boot
        running.append(Running(cell, child, [0], 0.0, log, tmp_path / "boots" / f"{cell.boot_id}.json", {}))
    stop_running(running, tmp_path)
    assert all(r.child.poll() is not None for r in running)  # both ended, no wait for GPU memory
    faulted, stopped = (json.loads(r.record.read_text()) for r in running)
    assert faulted["faulted"] is True and faulted["ok"] is False
    assert faulted["error"] == f"faulted, then stopped by the study: {fault}"
    assert stopped == {"boot_id": running[1].cell.boot_id, "ok": False,
                       "error": f"{STOPPED} the study was stopped"} | {
        k: getattr(running[1].cell, k) for k in ("round", "model", "order", "arm", "tp", "pp", "mode",
                                                  "executor", "variant")}  # fmt: skip
    capsys.readouterr()
    summary.summarize(argparse.Namespace(directory=str(tmp_path), faults=False, plot=None))
    out = capsys.readouterr().out
    assert "(1 boots stopped by the study's deadline or timeout are left out)" in out
    assert "| vanilla | 0/1 |" in out  # the faulted boot counts


def test_the_kv_cache_lines_are_read_from_the_engine_log(tmp_path: Path) -> None:
    text = "\n".join([  # vLLM 0.34.0's lines, as logged in docs/data/2026-12-04-orders
        "(EngineCore pid=1) INFO 12-04 16:09:08 [gpu_worker.py:795] Available KV cache memory: 36.57 GiB",
        "(EngineCore pid=1) INFO 12-04 16:09:14 [model_runner.py:1216] Graph capturing finished in 2 secs, "
        "took 2.05 GiB",
        "(EngineCore pid=1) INFO 12-04 16:09:14 [kv_cache_utils.py:1168] GPU KV cache size: 311,296 tokens, "
        "Maximum concurrency for 1,024 tokens per request: 304.00x",
    ])  # fmt: skip
    record = logs.analyse_log(text, tmp_path / "trim.log")
    assert record["vllm_available_kv_gib"] == 36.57 and record["vllm_kv_tokens"] == 311_296
    assert record["vllm_took_gib"] == 2.05
    assert record["attention_backend"] is None  # no backend line: said, not guessed


@pytest.mark.parametrize(
    ("lines", "backend"),
    [
        (["[cuda.py:481] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', "
          "'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']."], "FLASH_ATTN"),  # vLLM's own pick
        (["[cuda.py:420] Using TRITON_ATTN backend."], "TRITON_ATTN"),  # a forced one
        (["[cuda.py:420] Using AttentionBackendEnum.TRITON_ATTN backend."], "TRITON_ATTN"),
        (["(EngineCore) Using V2 Model Runner", "Using FLASH_ATTN attention backend out of ...",
          "Using FLASH_ATTN attention backend out of ...", "Using FLASHMLA attention backend out of ..."],
         "FLASH_ATTN+FLASHMLA"),  # every backend once, first seen first
    ],
)  # fmt: skip
def test_the_attention_backend_is_read_from_the_engine_log(
    tmp_path: Path, lines: list[str], backend: str
) -> None:
    record = logs.analyse_log("\n".join(lines), tmp_path / "trim.log")
    assert record["attention_backend"] == backend
    assert "backend" in (tmp_path / "trim.log").read_text()  # the trimmed log keeps the line


def _boot(model: str, order: str, r: int, took: float, pool: int, drop: int, secs: float) -> dict[str, Any]:
    return {"boot_id": f"r{r}-{model}-{order}-plugin", "model": model, "order": order, "arm": "plugin",
            "ok": True, "vllm_took_gib": took, "receipt_graph_pool_reserved_bytes": pool,
            "receipt_graph_memory_bytes": drop, "receipt_capture_seconds": secs,
            "vllm_kv_tokens": 311_296, "attention_backend": "FLASHMLA"}  # fmt: skip


def test_the_order_table_gives_every_boot_and_the_ratios_to_vllms_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gib = 1 << 30
    boots = [
        _boot("k3", "descending", 0, 2.05, 2 * gib, 2 * gib, 0.6),
        _boot("k3", "descending", 1, 2.05, 2 * gib, 2 * gib, 0.8),
        _boot("k3", "full-first", 0, 2.04, 2 * gib, 4 * gib, 0.7),
        _boot("k3", "full-first", 1, 2.04, 2 * gib, 4 * gib, 0.9),
        {**_boot("k3", "ascending", 0, 9.0, 9 * gib, 9 * gib, 1.0), "arm": "stock"},  # not the plugin's
        {**_boot("k3", "full-first", 2, 9.0, 9 * gib, 9 * gib, 1.0), "attention_backend": "TRITON_ATTN"},
    ]
    summary.orders(boots)
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| k3 (FLASHMLA) |")]
    assert [row.split(" | ")[1] for row in rows] == ["descending", "full-first"]  # vLLM's order first
    cells = rows[1].strip("| ").split(" | ")
    assert cells[2] == "2" and cells[3] == "2.04 (2.04, 2.04)" and cells[4] == "2.000 (2.000, 2.000)"
    assert cells[8:] == ["0.995", "1.000", "2.000", "1.143", "1.000"]  # took, pool, drop, seconds, KV
    other = [line for line in out if line.startswith("| k3 (TRITON_ATTN) |")]  # another backend: its own
    assert [row.split(" | ")[1:3] for row in other] == [["full-first", "1"]]  # study, never pooled
    assert other[0].endswith("| - | - | - | - | - |")  # no descending on that backend: no ratio
    summary.plot_orders(boots, tmp_path / "study.png")
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    args = argparse.Namespace(directory=str(tmp_path / "none"), faults=False, plot=None)
    assert summary.summarize(args) == 0  # no records: the tables' headers only
