"""The run's one checkpoint object: where it resumes from, when it saves, the save in flight, and its end.

The trainer calls it four times, as torchtitan's trainer calls its CheckpointManager: it is made in set-up (which
finds and verifies the resume point and checks the run's tokenizer against it), asked to `load` once the engine
exists, asked to `save` at each step end (it decides whether that step saves), and closed at the end. The async save in flight is
its state, not a module's: the next save, a stop and `close` wait for it. A loss spike's rollback asks it for the
newest complete checkpoint and reloads that (`last_complete`, `reload`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from core.errors import CannotContinueError
from core.log import get_logger
from core.run_layout import RunLayout
from pretrain.checkpoint import resume_diff
from pretrain.checkpoint.meta import complete_tags, tag_for
from pretrain.checkpoint.probe import ParityProbe
from pretrain.checkpoint.resume import load_checkpoint, resume_point
from pretrain.checkpoint.save import PendingSave, save_checkpoint
from pretrain.checkpoint.tokenizer import check_tokenizer, tokenizer_identity
from pretrain.checkpoint.universal import UNIVERSAL_SUFFIX, convert_to_universal, needs_universal
from runconfig import RunConfig
from runconfig.load import to_dict

log = get_logger(__name__)


class CheckpointManager:
    """Owns a run's checkpoints (`checkpoint.*`): made on every rank before the model, it has found the checkpoint
    to resume from (verified, its config changes applied or refused) or none, and the run's `tokenizer` is the one
    that checkpoint was trained with (a swapped one stops here, naming both, before the model is sized from it)."""

    def __init__(self, cfg: RunConfig, layout: RunLayout, tokenizer: Any, rank: int, world: int) -> None:
        self.settings, self.rank, self.world = cfg.checkpoint, rank, world
        self.dir = Path(cfg.checkpoint_dir)
        self.remote = cfg.checkpoint_remote
        self.async_save = cfg.checkpoint.async_mode == "async"
        self.meta: dict[str, Any] = {"config": to_dict(cfg)}  # recorded in each COMPLETE
        self.layout, self.tokenizer = layout, tokenizer
        self.family = cfg.model.family
        self.engine: Any = None
        self.scheduler: Any = None
        self.probe: ParityProbe | None = None
        self.pending: PendingSave | None = None
        # resume is decided before the engine exists: another world size loads a universal checkpoint
        self.load_dir, self.tag = resume_point(cfg, self.dir, rank)
        self.universal = self.tag is not None and needs_universal(self.load_dir, self.tag, world)
        if self.tag is not None:
            check_tokenizer(self.load_dir, self.tag, layout.tokenizer, len(tokenizer))
        self.meta["tokenizer"] = tokenizer_identity(layout.tokenizer, len(tokenizer))

    @property
    def resuming(self) -> bool:
        return self.tag is not None

    @property
    def resumed_from(self) -> Path | None:
        """The folder the run resumed from (a universal conversion's, at another world size)."""
        if self.tag is None:
            return None
        return self.load_dir / (self.tag + (UNIVERSAL_SUFFIX if self.universal else ""))

    def load(
        self, engine: Any, scheduler: Any, loader: Any, build: Callable[[], torch.nn.Module]
    ) -> tuple[dict[str, Any] | None, float | None]:
        """Binds the engine the saves take, and restores it from the resume point: weights, optimizer, this rank's
        RNG and the loader's position, with the schedule as configured now. Returns the checkpoint's client state
        and the seconds the loader's restore took, or (None, None) for a fresh run. `build` makes the run's module
        (the parity probe's copy on the meta device)."""
        self.engine, self.scheduler = engine, scheduler
        self.probe = ParityProbe(engine, self.rank, self.tokenizer, self.family, self.async_save, build)
        if self.tag is None:
            return None, None
        if self.universal:
            if self.rank == 0:
                log.info(
                    f"[train] {self.tag} was written by another world size: converting to a universal checkpoint"
                )
                convert_to_universal(self.load_dir, self.tag)
            dist.barrier()
        state = self.reload(self.tag + (UNIVERSAL_SUFFIX if self.universal else ""), self.load_dir)
        t_restore = time.perf_counter()
        try:
            loader.load_state_dict(state["loader"])
        except ValueError as e:  # another sample order (seed, tokens, packing or weights changed)
            if not self.settings.reset_data_order:
                raise CannotContinueError(
                    f"{self.load_dir / self.tag}: {e}. Start a new output folder (another run.output_dir), or rerun "
                    f"with {resume_diff.RESET_FLAG} (checkpoint.reset_data_order=true) to keep the resumed weights "
                    "and start the new data order from its beginning"
                ) from None
            if self.rank == 0:  # the loader keeps its fresh state: the new order from its first sample
                log.info(
                    f"[train] data order reset at step {state['step']} ({resume_diff.RESET_FLAG}): the loader "
                    "starts the new order from its beginning"
                )
        return state, time.perf_counter() - t_restore

    def reload(self, tag: str, folder: Path | None = None) -> dict[str, Any]:
        """The engine and this rank's RNG from checkpoint `tag`, the LR schedule kept as configured now (a resume,
        a loss spike's rollback); returns the checkpoint's client state."""
        current = resume_diff.schedule_snapshot(self.scheduler)  # loading restores the checkpoint's schedule
        state = load_checkpoint(self.engine, folder or self.dir, tag)
        resume_diff.reapply_schedule(self.scheduler, current)
        return state

    def last_complete(self) -> str | None:
        """The newest complete checkpoint of this run, the one rank 0 names on every rank (after the save in
        flight is finished): what a rollback reloads."""
        self.wait()
        tags: list[str | None] = list(complete_tags(self.dir)) if self.rank == 0 else []
        tag = [tags[-1] if tags else None]
        dist.broadcast_object_list(tag, src=0)
        return tag[0]

    def last_good(self) -> str:
        """The newest complete checkpoint and its folder, for a message (this rank's view)."""
        tags = complete_tags(self.dir)
        return f"{tags[-1] if tags else None} in {self.dir}"

    def due(self, step: int, last_step: bool, ok: bool = True, preempted: bool = False) -> bool:
        """Whether the step end at `step` saves: on the `checkpoint.every_steps` grid and at the last step, but
        never a step whose loss was not finite (good checkpoints are not replaced by it); always on a
        preemption."""
        return (step % self.settings.every_steps == 0 or last_step) and ok or preempted

    def save(
        self,
        step: int,
        client_state: Callable[[], dict[str, Any]],
        last_step: bool = False,
        ok: bool = True,
        preempted: bool = False,
    ) -> bool:
        """Saves the step when it is `due` (True then); `client_state()` is what the checkpoint carries beside
        the engine's state, asked only when it saves. Returns once every rank's state is in host memory (async),
        or once the checkpoint is complete (`async_mode: disabled`); the previous save finishes first."""
        if not self.due(step, last_step, ok, preempted):
            return False
        self.wait()
        layout = self.layout
        self.pending = save_checkpoint(
            self.engine,
            self.dir,
            step,
            client_state(),
            self.settings.keep_last,
            self.probe,
            self.meta,
            remote=self.remote,
            async_save=self.async_save,
            # a remote run: the logs so far and the resolved config go up with each checkpoint (rank 0)
            after_complete=lambda: layout.store.push_or_warn([layout.logs, layout.resolved_config]),
        )
        return True

    def wait(self) -> None:
        """Waits for the save in flight (every rank together; a failure stops every rank naming it)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.wait()

    def close(self, step: int) -> Path:
        """The end of the run at `step` (also a preemption exit): the last save's COMPLETE and upload. Returns
        that step's checkpoint folder."""
        self.wait()
        return self.dir / tag_for(step)
