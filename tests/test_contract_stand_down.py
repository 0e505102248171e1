"""The plugin stands down on a vLLM that already pre-sizes: vLLM 0.33.0 with lab/upstream/'s patch applied.

The patched copy of ``cudagraph_utils`` is built with ``patch -p1`` from the installed file and swapped
in for the test (``sys.modules`` and the parent package's attribute), so the real route (``register()``,
the import hook finding the module loaded, vLLM's own ``store_capture_output``) runs against it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from atlas import probes
from configs import K3_4_LAYERS
from fakes import installed_fix, patched_copy
from release import SIZES_STAGING
from stable import assert_says

import vllm_staging_plugin
from vllm_staging_plugin._engine import staging
from vllm_staging_plugin._offline import cpu_replay
from vllm_staging_plugin._offline.cpu_replay import ReplayConfig
from vllm_staging_plugin._offline.exits import Exit

pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("model_inspection_cache")]
ROOT = Path(__file__).resolve().parents[1]
PATCH = ROOT / "vllm_staging_plugin" / "patches" / "presize-staging-buffers.patch"
K3 = probes.KnobbedReplay(  # Kimi-K3's widths: 8 speculative tokens, 48 sequences, powers of two, recover-SSM
    sizes=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], max_num_seqs=48, decode_query_len=9,
    hidden_size=64, use_kda_recoverssm=True,
)  # fmt: skip


@pytest.fixture
def presizing_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """vLLM 0.33.0 with the presize patch; on a vLLM that sizes its staging itself (0.34.0), that vLLM."""
    import vllm.v1.worker.gpu as package
    import vllm.v1.worker.gpu.cudagraph_utils as stock

    if SIZES_STAGING:
        yield stock
        vllm_staging_plugin.unregister()
        return
    module = patched_copy(stock, PATCH, tmp_path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(package, "cudagraph_utils", module)
    yield module
    vllm_staging_plugin.unregister()  # before the stock module is back


def capture_through_the_plugin(cfg: ReplayConfig) -> tuple[cpu_replay.ReplayResult, Any]:
    """vLLM's own route: the class register() patched, built and captured (no tool patch)."""
    with cpu_replay.cpu_stubs(cfg):
        manager = cpu_replay.build_manager(cfg)
        return cpu_replay.run_capture(manager, cfg), manager


def test_detected_by_behaviour_on_the_patched_copy_only(presizing_vllm: ModuleType) -> None:
    assert cpu_replay.vllm_sizes_staging()
    stock = cpu_replay.replay(K3, patched=False)  # vLLM's own order, vLLM's own staging: now boots
    assert stock.ok and {b["rows"] for b in stock.buffers.values()} == {261}


@pytest.mark.skipif(SIZES_STAGING, reason="the installed vLLM sizes its staging buffers itself")
def test_the_stock_vllm_is_not_taken_for_one_that_presizes() -> None:
    assert not cpu_replay.vllm_sizes_staging()
    assert "(256) must match the existing size (261)" in str(cpu_replay.replay(K3, patched=False).error)


def test_the_plugin_leaves_vllms_staging_alone_with_one_info_line(
    presizing_vllm: ModuleType, plugin_log: Any, mocker: Any
) -> None:
    vllm_staging_plugin.register()
    grown = mocker.spy(staging, "presized")
    first, manager = capture_through_the_plugin(K3)
    second, _ = capture_through_the_plugin(K3)  # a later manager of the process: no capture view at all
    assert first.ok and second.ok and grown.call_count == 0
    assert {b["rows"] for b in first.buffers.values()} == {261}
    assert type(manager) is presizing_vllm.ModelCudaGraphManager
    assert installed_fix("staging").vllm_sizes_staging
    if SIZES_STAGING:  # known from its shape when the manager is built: one line, no capture view
        (line,) = [m for m in plugin_log.at(20) if "staging buffers" in m]
        assert_says(line, "vllm-staging-plugin: vLLM sizes ModelCudaGraphManager's staging buffers",
                    "to the largest of its 15 capture descriptors (261 rows) itself; the plugin leaves them",
                    end="capture order: descending")  # fmt: skip
        return
    stood_down = [
        m for m in plugin_log.at(20) if "itself; the plugin leaves them to vLLM" in m
    ]  # seen at the first capture
    (line,) = stood_down
    assert_says(
        line,
        "vllm-staging-plugin: vLLM sizes ModelCudaGraphManager's staging buffers",
        "capture descriptors (261 rows) itself; the plugin leaves them to vLLM",
        end="; capture order: descending",
    )


def test_the_order_knob_keeps_working(presizing_vllm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGING_PLUGIN_ORDER", "ascending")
    vllm_staging_plugin.register()
    result, _ = capture_through_the_plugin(K3)
    assert result.ok and installed_fix("staging").vllm_sizes_staging
    pieces = result.forwards[: 2 * len(result.sequence["PIECEWISE"]) : 2]
    assert pieces == sorted(pieces) and pieces[0] == 1  # captured ascending, as asked
    assert {b["rows"] for b in result.buffers.values()} == {261}


K3_SERVE = [
    str(K3_4_LAYERS), "--load-format", "dummy", "--skip-tokenizer-init",
    "--use-replayssm", "--max-num-seqs", "48", "--tensor-parallel-size", "8",
    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 2}',
    "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]}',
]  # fmt: skip


def test_check_says_it_and_stock_reports_what_the_patched_vllm_does(
    presizing_vllm: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_staging_plugin._offline import preflight

    assert preflight.main(K3_SERVE, order=None, as_json=False) == Exit.OK
    out = capsys.readouterr().out
    assert (
        "this vLLM sizes its staging buffers to the largest capture descriptor itself: its staging holds in "
        "any capture order, and the plugin leaves the buffers to vLLM" in out
    )
    assert "stock vLLM (its own order): boots (hidden_states [261, 7168] bfloat16" in out
    assert "without the plugin:" not in out  # no workaround needed
    assert "serving:" not in out  # Kimi-K3's own KDA layer: nothing to check
