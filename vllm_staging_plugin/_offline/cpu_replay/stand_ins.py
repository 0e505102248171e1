"""Stand-ins for what Model Runner V2 hands the manager's ``capture()``: the model (its outputs only), DBO's
microbatch runner and the block tables; no CUDA, no threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .config import ReplayConfig


class Model(torch.nn.Module):  # type: ignore[misc]
    """The model ``capture()`` runs: zero outputs of the replayed shape."""

    def __init__(self, cfg: ReplayConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.forwards: list[int] = []

    def forward(self, input_ids: Any = None, positions: torch.Tensor | None = None, **_: Any) -> Any:
        from vllm.sequence import IntermediateTensors

        assert positions is not None
        n, cfg = positions.shape[0], self.cfg
        self.forwards.append(n)

        def output() -> torch.Tensor:
            return torch.zeros(n, cfg.hidden_size, dtype=cfg.dtype)

        if not cfg.last_pp_rank:
            return IntermediateTensors({k: output() for k in cfg.intermediate_keys})
        if cfg.aux_layers:
            return output(), [output() for _ in range(cfg.aux_layers)]
        return output()


class UbatchRunner:
    """DBO's runner without threads or streams: the microbatched forward runs the model once."""

    capture_stream = None

    def prepare(self, *args: Any, **kwargs: Any) -> None:
        return None

    def begin_capturable_run(
        self, model: Any, model_inputs: dict[str, Any], state: Any, **kwargs: Any
    ) -> Callable[[], Any]:
        return lambda: model(**model_inputs)

    def abort_pending_run(self) -> None:
        return None


class BlockTables:
    """The block tables the microbatched capture asks for dummy tables and slot mappings."""

    def get_dummy_block_tables(self, num_reqs: int) -> None:
        return None

    def get_dummy_slot_mappings(self, num_tokens: int) -> None:
        return None
