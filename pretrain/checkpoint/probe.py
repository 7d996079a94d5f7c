"""The export-parity probe each checkpoint carries: the logits of a fixed batch, which `pretrain export` checks the
exported model against. Computed off the step from the save's host snapshot of the weights where one rank holds
the whole module (rank 0 of an async save under ZeRO 0-2, `SnapshotProbe`), else by the engine on the step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pretrain.checkpoint.parity import PROBE_FILE, SnapshotProbe, probe_inputs, probe_logits
from pretrain.checkpoint.writer import TorchFile


def probe_file(path: Path, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> TorchFile:
    """The probe file a checkpoint writes with its other deferred files (`pretrain.checkpoint.parity.check_parity` reads it)."""
    return TorchFile(path, {"inputs": batch, "logits": logits})


class ParityProbe:
    """Writes `PROBE_FILE` into each checkpoint folder (the save's `before_complete`)."""

    def __init__(
        self,
        engine: Any,
        rank: int,
        tokenizer: Any,
        family: str,
        off_step: bool,
        build: Callable[[], torch.nn.Module],
    ) -> None:
        """`off_step`: saves are async, so rank 0's snapshot can carry the probe under ZeRO 0-2; `build` makes
        the run's module (on the meta device) for that."""
        self.engine, self.rank = engine, rank
        self.batch = probe_inputs(tokenizer, family)
        self.snapshot = (
            SnapshotProbe(build, engine.module)
            if off_step and rank == 0 and engine.zero_optimization_stage() < 3
            else None
        )

    def __call__(self, folder: Path, weights: dict[str, torch.Tensor] | None):
        """The probe file, written with the save's other deferred files: off the step from the save's host
        snapshot of the weights where rank 0 took one, else the engine's own forward on the step (every rank under
        ZeRO-3, whose forward needs them all; rank 0 alone otherwise)."""
        path, snapshot = folder / PROBE_FILE, self.snapshot
        if weights is not None and snapshot is not None:
            return lambda: probe_file(path, self.batch, snapshot.logits(weights, self.batch)).write()
        if self.rank != 0 and self.engine.zero_optimization_stage() < 3:
            return None
        logits = probe_logits(self.engine, self.batch, self.engine.device)
        return probe_file(path, self.batch, logits) if self.rank == 0 else None
