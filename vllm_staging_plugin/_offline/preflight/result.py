"""The pre-flight's result: per arm (stock, plugin) what the replayed capture did, and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import __version__


@dataclass
class Arm:
    ok: bool
    error: str | None
    sequence: dict[str, list[int]]
    buffers: dict[str, dict[str, Any]]
    allocated_by: str | None = None
    failed_at: str | None = None


@dataclass
class Preflight:
    vllm_version: str | None
    torch_version: str | None
    platform: dict[str, Any]
    model: str
    architecture: str | None
    cudagraph_mode: str
    capture_sizes: list[int]
    max_num_seqs: int
    decode_query_len: int
    use_kda_recoverssm: bool
    hidden_size: int
    dtype: str
    capacity: int
    sequence: dict[str, list[int]]
    stock: Arm
    plugin: Arm
    order: str
    notes: list[str]

    @property
    def plugin_boots(self) -> bool:
        return self.plugin.ok and all(b["rows"] >= self.capacity for b in self.plugin.buffers.values())

    @property
    def identical_to_stock(self) -> bool | None:
        if not self.stock.ok or self.order != "descending":
            return None
        return self.stock.buffers == self.plugin.buffers

    @property
    def staging_bytes(self) -> int:
        return sum(int(b["bytes"]) for b in self.plugin.buffers.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin_version": __version__,
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "platform": self.platform,
            "model": self.model,
            "architecture": self.architecture,
            "cudagraph_mode": self.cudagraph_mode,
            "capture_sizes": self.capture_sizes,
            "max_num_seqs": self.max_num_seqs,
            "decode_query_len": self.decode_query_len,
            "use_kda_recoverssm": self.use_kda_recoverssm,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "capacity": self.capacity,
            "sequence": self.sequence,
            "stock": _arm_json(self.stock),
            "plugin": {**_arm_json(self.plugin), "ok": self.plugin_boots, "order": self.order},
            "staging_bytes": self.staging_bytes,
            "identical_to_stock": self.identical_to_stock,
            "notes": self.notes,
        }


def _arm_json(arm: Arm) -> dict[str, Any]:
    return {
        "ok": arm.ok,
        "error": arm.error,
        "allocated_by": arm.allocated_by,
        "failed_at": arm.failed_at,
        "captured": arm.sequence,
        "buffers": arm.buffers,
    }
