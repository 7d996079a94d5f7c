"""One optimizer step: `grad_accum` micro-batches, the step's one collective and its one host read (StepSync).

The callbacks see the step through their hooks (pretrain/run/callback_runner.py): a batch in hand, an output, a vote
summed in the step's all-reduce, a device flag judged from the reduced figures. None of them adds a collective or a
host read: tests/pretrain/test_host_syncs.py counts them with every built-in callback on.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from core.callbacks import StepOutcome
from pretrain.run.profiler import phase

HEAD = 3  # StepSync slots before the callbacks' own: summed finite loss, non-finite count, rank 0's clock


def rng_isolated():
    """Run a block without moving the global RNG (CPU and this rank's GPU), so that start-up work, evaluation
    and loader set-up leave the dropout stream exactly as an uninterrupted run would have it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    return torch.random.fork_rng(devices=devices)


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-pad tokens, counted on the host-side batch (before the copy to the device, so no device sync)."""
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum())
    return int(batch["input_ids"].numel())


class StepSync:
    """Everything the ranks must agree on after a step, in ONE collective per optimizer step and ONE host read (no
    host read per micro-batch): the summed finite loss, the count of non-finite micro-batches, rank 0's clock, and
    one slot per callback that votes (its rank's figure, summed) or judges (its device flag, computed from the
    reduced figures on every rank alike). `launch` writes and all-reduces on the device before the optimizer step,
    so the agreed non-finite flag and the judges' flags can skip that step on the device (StepGuard); `read` brings
    the figures to the host after it."""

    def __init__(self, device: torch.device, rank: int, callbacks: Any, per_step: int):
        self.rank, self.callbacks, self.per_step = rank, callbacks, per_step
        self.voters, self.judges = callbacks.voters, callbacks.judges
        self.buf = torch.zeros(HEAD + len(self.voters) + len(self.judges), device=device, dtype=torch.float64)
        self.figures: list[float] = []

    def launch(self, loss_sum: torch.Tensor, bad: torch.Tensor, elapsed_s: float) -> torch.Tensor:
        """All-reduce without reading it: returns the agreed skip flag (float32, nonzero when any rank saw a
        non-finite loss or a callback withheld the update)."""
        b, v = self.buf, HEAD + len(self.voters)
        b[0] = loss_sum
        b[1] = bad
        b[2] = elapsed_s if self.rank == 0 else 0.0
        for i, cb in enumerate(self.voters):
            b[HEAD + i] = cb.vote()
        b[v:] = 0.0
        dist.all_reduce(b)
        skip = b[1] > 0
        for i, cb in enumerate(self.judges):  # the same figures on every rank, so the same decision
            b[v + i] = cb.judge(b[0], b[1], self.per_step)
            skip = skip | (b[v + i] > 0)
        return skip.float()

    def read(self) -> list[float]:
        with phase("step_read"):  # the step's one host read
            self.figures = self.buf.tolist()
        return self.figures

    def outcome(self, step: int, loss: float, first_batch_at: float) -> StepOutcome:
        f, v = self.figures, HEAD + len(self.voters)
        return StepOutcome(
            step,
            loss,
            ok=f[1] == 0,
            first_batch_at=first_batch_at,
            withheld={cb.name: f[v + i] > 0 for i, cb in enumerate(self.judges)},
            votes={cb.name: f[HEAD + i] for i, cb in enumerate(self.voters)},
        )


def step_figures(engine) -> tuple[float | None, int]:
    """The last gradient norm and the steps StepGuard skipped, in one host read (logging steps only)."""
    norm, skipped = engine.get_global_grad_norm(), engine.step_guard.skipped_steps()
    device_values = [torch.as_tensor(x, dtype=torch.float64) for x in (norm, skipped) if torch.is_tensor(x)]
    values = torch.stack([v.to(engine.device) for v in device_values]).tolist() if device_values else []
    out = [values.pop(0) if torch.is_tensor(x) else x for x in (norm, skipped)]
    return (None if out[0] is None else float(out[0])), int(out[1] or 0)


def train_step(run: Any, progress: Any, batches, meter: Any) -> StepOutcome:
    """One optimizer step over `grad_accum` micro-batches, with the one host read per step (StepSync)."""
    engine, plan, world, clock, sync, cbs = (
        run.engine,
        run.plan,
        run.world,
        run.clock,
        run.sync,
        run.callbacks,
    )
    loss_sum = torch.zeros((), device=run.device, dtype=torch.float64)
    n_bad = torch.zeros((), device=run.device, dtype=torch.float64)
    # The one blocking read per step comes after engine.step() unless the LR follows a time budget: read before the
    # step, it idles the device while the host launches the optimizer (DeepSpeed's step is host-heavy).
    agree_before_step = clock.time_schedule is not None
    first_batch_at = 0.0
    for micro in range(plan.grad_accum):
        t_wait = time.perf_counter()
        # worker start-up and collation must not shift the dropout RNG stream
        with phase("batch"), rng_isolated():
            host_batch = next(batches)
            waited = time.perf_counter() - t_wait
            first_batch_at = first_batch_at or time.perf_counter()
            n_tok = _count_tokens(host_batch)
            batch = _to_device(host_batch, run.device)
        for cb in cbs.batch_hooks:
            cb.on_batch(progress.step, micro, host_batch)
        with phase("forward"):
            output = engine(**batch)
        loss = output.loss
        for cb in cbs.forward_hooks:
            cb.on_forward(output)
        del output  # the logits need not live through backward
        # No host read per micro-batch: a non-finite loss is counted on the device, and the step it poisons is
        # skipped on the device (StepGuard) once all ranks agree on the count.
        finite = torch.isfinite(loss.detach())
        n_bad += ~finite
        loss_sum += torch.where(finite, loss.detach(), 0.0)
        with phase("backward"):
            engine.backward(loss)
        if micro == plan.grad_accum - 1:
            with phase("step_sync"):
                engine.step_guard.arm(sync.launch(loss_sum, n_bad, clock.now()))
            if agree_before_step:  # a time-budget LR follows the agreed clock: read before the step
                clock.agree(sync.read()[2])
        with phase("optimizer_step" if micro == plan.grad_accum - 1 else "engine_step"):
            engine.step()
        progress.tokens_seen += n_tok * world
        meter.add(n_tok * world, batch["input_ids"].shape[0] * world, waited)
    if (
        not agree_before_step
    ):  # after the step: the host waits while the device runs the optimizer, not before
        clock.agree(sync.read()[2])
    return sync.outcome(progress.step + 1, sync.figures[0] / (plan.grad_accum * world), first_batch_at)
