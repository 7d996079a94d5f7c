"""The pretraining loop, readable top to bottom (nanoGPT-style): set up, resume, step, log, evaluate, save.

Run under torchrun (or `python -m launch run`): `python -m pretrain train --config configs/demo.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

from core.callbacks import ActionKind, StepOutcome
from core.errors import CannotContinueError
from core.io import remove_orphans
from core.log import get_logger
from core.run_layout import RunLayout
from data_pipeline.loader import PretrainLoader
from data_pipeline.objectives import build_collator
from data_pipeline.token_shards import TokenShardError
from pretrain.checkpoint.manager import CheckpointManager
from pretrain.objectives import prepare_model, wrap_model
from pretrain.run import float8, lr_scaling
from pretrain.run.callback_runner import Callbacks
from pretrain.run.engine import accelerator_name, build_engine, init_distributed, rank_device
from pretrain.run.evaluation import evaluate
from pretrain.run.metrics import (
    Throughput,
    flops_per_token,
    measure_peak_flops,
    objective_rerun,
    untied_input_embedding,
)
from pretrain.run.models import build_model, count_parameters
from pretrain.run.probe_eval import STATE_KEY
from pretrain.run.run_lock import RunFolderLocked, RunLock
from pretrain.run.schedule import TimeWarmupDecay, lr_multiplier, make_plan
from pretrain.run.step import StepSync, rng_isolated, train_step
from pretrain.run.step import step_figures as _step_figures
from runconfig import RunConfig, save_resolved

log = get_logger(__name__)


class TrainingClock:
    """When the run ends and where the LR schedule stands: after `total_steps`, or, with a time budget, when rank
    0's training clock (agreed by all ranks once per step, carried in checkpoints) says the budget is spent.

    The clock counts the loop's wall time (steps, evaluation, checkpoints), not set-up: it starts at the loop,
    and a resumed run adds the elapsed time of its checkpoint. The run stops at the step whose end is nearest
    the budget (within half a step), so it neither overshoots by a step nor stops one short."""

    def __init__(self, cfg: RunConfig, plan, scheduler, elapsed_s: float):
        self.plan, self.elapsed_s = plan, elapsed_s
        self.last_step_s = 0.0
        self.start()
        self.time_schedule = next((f for f in scheduler.lr_lambdas if isinstance(f, TimeWarmupDecay)), None)
        if self.time_schedule is not None:  # a resumed LambdaLR state must not carry an older budget
            fresh = lr_multiplier(cfg, plan)
            assert isinstance(
                fresh, TimeWarmupDecay
            )  # the config's budget is what the scheduler was built with
            fresh.elapsed_s = elapsed_s
            self.time_schedule.__dict__.update(fresh.__dict__)

    def lr_now(self, scheduler) -> float:
        """The LR the next step runs at: on a time budget, the schedule at the restored clock (the scheduler's
        cached LR is still the fresh schedule's warmup floor until its next step)."""
        if self.time_schedule is None:
            return scheduler.get_last_lr()[0]
        return scheduler.base_lrs[0] * self.time_schedule(scheduler.last_epoch)

    def start(self) -> None:
        """(Re)start counting from the checkpoint's elapsed time: called where the loop begins."""
        self.t0 = time.perf_counter() - self.elapsed_s

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def agree(self, elapsed_s: float) -> None:
        """Rank 0's clock, as every rank received it: the LR for the next step and the stop decision use it."""
        self.last_step_s = max(0.0, elapsed_s - self.elapsed_s)
        self.elapsed_s = elapsed_s
        if self.time_schedule is not None:
            self.time_schedule.elapsed_s = elapsed_s

    def finished(self, step: int) -> bool:
        if self.plan.budget_s is None:
            return step >= self.plan.total_steps
        return self.elapsed_s + 0.5 * self.last_step_s >= self.plan.budget_s

    @property
    def bar_total(self) -> int:
        return self.plan.total_steps if self.plan.budget_s is None else round(self.plan.budget_s)

    @property
    def bar_unit(self) -> str:
        return "step" if self.plan.budget_s is None else "s"

    def bar_position(self, step: int) -> int:
        return step if self.plan.budget_s is None else min(round(self.elapsed_s), self.bar_total)


class TrainingHalted(CannotContinueError):
    pass


def take_run_lock(folders: list[Path], rank: int) -> list[RunLock]:
    """Rank 0 locks the run folders before any work; every rank stops if that fails."""
    locks, error = [], None
    if rank == 0:
        try:
            for folder in folders:
                lock = RunLock(folder)
                note = lock.acquire()
                locks.append(lock)
                if note:
                    log.info(note)
        except RunFolderLocked as e:
            for lock in locks:
                lock.release()
            error = str(e)
    msg = [error]
    dist.broadcast_object_list(msg, src=0)
    if msg[0] is not None:
        raise RunFolderLocked(msg[0])
    return locks


def train(cfg: RunConfig) -> dict[str, Any]:
    rank, _ = init_distributed(cfg)
    if torch.cuda.is_available():  # object collectives before the engine exists need this rank's own GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    out, ckpts = Path(cfg.run.root).resolve(), Path(cfg.checkpoint_dir).resolve()
    locks = take_run_lock([out] if ckpts.is_relative_to(out) else [out, ckpts], rank)
    if rank == 0:  # the run owns its folder now: a `latest` write cut by a kill left a temp file
        remove_orphans(ckpts / "latest")
    try:
        return _train(cfg)
    finally:
        for lock in locks:
            lock.release()


@dataclasses.dataclass
class Progress:
    """What the loop advances and a checkpoint carries."""

    step: int = 0
    tokens_seen: int = 0
    last_loss: float = float("nan")
    bad_steps: int = 0  # consecutive steps with a non-finite loss
    # eval.probe_task's random-init figure in a checkpoint written before the callbacks carried their own states
    probe_random_init: dict[str, Any] | None = None


@dataclasses.dataclass
class Run:
    """What set-up builds and the loop's functions share: built once, handed along."""

    cfg: RunConfig
    rank: int
    world: int
    layout: RunLayout
    checkpoints: CheckpointManager  # resume point, when to save, the save in flight (pretrain/checkpoint/)
    plan: Any
    tokenizer: Any
    n_params: int
    train_loader: PretrainLoader
    eval_loader: PretrainLoader
    engine: Any
    clock: TrainingClock
    sync: StepSync
    callbacks: Callbacks  # every in-loop behaviour (core/callbacks.py); the loop knows none by name

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def scheduler(self) -> Any:
        """The LR schedule: the engine's own (build_engine hands DeepSpeed the LambdaLR it steps)."""
        return self.engine.lr_scheduler


# --- the loop ---------------------------------------------------------------------------------------------------


def _train(cfg: RunConfig) -> dict[str, Any]:
    run, progress, restore_s = set_up(cfg)
    cbs, clock = run.callbacks, run.clock
    meter, bar = make_meter(run), progress_bar(run, progress.step)
    run.engine.train()
    # a resume's restore, iter() and first batch, in its first metrics row
    latency = FirstBatchLatency(restore_s)
    batches = iter(run.train_loader)
    start_row = cbs.start(run, progress)  # e.g. the probe's and the tasks' random-init figures, at step 0
    if start_row:
        cbs.log(progress.step, start_row, prefix="eval")
    preempted, finished = False, clock.finished(progress.step)
    clock.start()
    while not finished:
        cbs.step_begin(progress.step + 1)
        outcome = train_step(run, progress, batches, meter)
        latency.first_batch_in_hand(outcome.first_batch_at)
        progress.step += 1
        step = progress.step
        action = cbs.step_end(outcome)  # agreed on every rank: the figures are the agreed ones
        check_bad_steps(run, progress, outcome)
        if cbs.act(run, progress, action):
            continue  # rolled back: the loop goes on from the last complete checkpoint's step
        finished = clock.finished(step)
        bar.update(clock.bar_position(step) - bar.n)
        if step % cfg.logging.every_steps == 0 or finished:
            log_step(run, progress, outcome, bar, meter, latency.take())
        if step % cfg.eval.every_steps == 0 or finished:
            eval_step(run, step, bar)
        preempted = action.kind == ActionKind.REQUEUE
        # never replaces good checkpoints with a step that had a non-finite loss
        if run.checkpoints.save(step, lambda: client_state(run, progress), finished, outcome.ok, preempted):
            cbs.saved_at(step)
        if preempted:
            if run.rank == 0:
                bar.write(f"[train] {action.reason}: checkpointed at step {step}, exiting for requeue")
            break
    cbs.end(run, progress)  # the watchdog's thread, a profile window the run ended inside, the sinks
    bar.close()
    return finish(run, progress, preempted)


# --- set-up -----------------------------------------------------------------------------------------------------


def set_up(cfg: RunConfig) -> tuple[Run, Progress, float | None]:
    """Plan, resume point, tokenizer, model, loaders, engine and restored state: everything the loop needs, and
    the seconds a resume took to restore the loader (None for a fresh run)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    float8.check_device(cfg.model, rank_device())
    layout = RunLayout(cfg)
    plan = make_plan(cfg, world)
    callbacks = Callbacks.from_config(
        cfg
    )  # every in-loop behaviour, built-in or outside (started by the loop)
    torch.manual_seed(cfg.run.seed + rank)

    tokenizer = load_tokenizer(layout)
    # the resume point, found and verified; a tokenizer other than its checkpoint's is named before the model
    checkpoints = CheckpointManager(cfg, layout, tokenizer, rank, world)
    if rank == 0:
        announce(cfg, plan, world, checkpoints.dir)
    # a resumed run loads its checkpoint: model.init_from's weights are read only by a fresh start
    model = build_module(cfg, tokenizer, weights=not checkpoints.resuming)
    float8.convert(model, cfg.model)  # the trained module only: the probe's and the export's stay plain
    n_params = count_parameters(model)
    train_loader, eval_loader = build_loaders(cfg, rank, world, tokenizer)
    engine, scheduler, _ = build_engine(cfg, model, plan, load_universal=checkpoints.universal)
    sync = StepSync(engine.device, rank, callbacks, plan.grad_accum * world)
    state, restore_s = checkpoints.load(
        engine, scheduler, train_loader, lambda: build_module(cfg, tokenizer, weights=False)
    )
    progress, elapsed_s = restore(engine, callbacks, state) if state is not None else (Progress(), 0.0)
    clock = TrainingClock(cfg, plan, scheduler, elapsed_s)
    if state is not None and rank == 0:
        log.info(
            f"[train] resumed from {checkpoints.resumed_from} at step {progress.step} ({elapsed_s:.1f}s of "
            f"training, lr now {clock.lr_now(scheduler):.6g})"
        )
    run = Run(
        cfg,
        rank,
        world,
        layout,
        checkpoints,
        plan,
        tokenizer,
        n_params,
        train_loader,
        eval_loader,
        engine,
        clock,
        sync,
        callbacks,
    )
    return run, progress, restore_s


def announce(cfg: RunConfig, plan, world: int, ckpt_dir: Path) -> None:
    """Rank 0 records the resolved config beside the outputs and logs the plan and its LR scaling."""
    save_resolved(cfg, cfg.run.root)
    save_resolved(cfg, ckpt_dir)
    log.info(f"[train] plan for world size {world}:\n{plan.describe()}")
    lines = sum(lr_scaling.explain(cfg, plan.global_batch_size, plan.peak_lr, plan.warmup_steps), [])
    log.info("\n".join("[train] " + x for x in lines))


def load_tokenizer(layout: RunLayout):
    """The run's tokenizer (fetched first for a remote run): the model is sized from it."""
    layout.store.pull([layout.tokenizer])
    return AutoTokenizer.from_pretrained(str(layout.tokenizer))


def build_module(cfg: RunConfig, tokenizer, weights: bool):
    """The module trained: the family's model, wrapped by its objective (ELECTRA's generator), else the model."""
    model = build_model(cfg.model, tokenizer, cfg.packing.seq_len, weights=weights)
    prepare_model(cfg, model)
    return wrap_model(cfg, model, tokenizer)


def build_loaders(cfg: RunConfig, rank: int, world: int, tokenizer) -> tuple[PretrainLoader, PretrainLoader]:
    collate = build_collator(cfg, tokenizer)
    pin = accelerator_name() == "cuda"  # page-locked batches: the copy to the device overlaps the step
    try:
        return (
            PretrainLoader(cfg, rank, world, split="train", collate_fn=collate, pin_memory=pin),
            PretrainLoader(cfg, rank, world, split="eval", collate_fn=collate, pin_memory=pin),
        )
    except TokenShardError as e:  # a damaged or replaced shard: a restart would fail the same way
        raise CannotContinueError(str(e)) from None


def restore(engine, callbacks: Callbacks, state: dict[str, Any]) -> tuple[Progress, float]:
    """The loop's counters from a checkpoint's client state (the manager has restored the engine and the loader):
    the progress and the training clock's elapsed time."""
    progress = Progress(
        state["step"],
        state["tokens_seen"],
        state.get("loss", float("nan")),
        probe_random_init=state.get(
            STATE_KEY
        ),  # a checkpoint from before the callbacks held the probe's state
    )
    # the steps StepGuard skipped on the device before the checkpoint (DeepSpeed restores its own count)
    engine.step_guard.skipped = torch.tensor(float(state.get("skipped_on_device", 0)), device=engine.device)
    callbacks.load_state_dict(
        state.get("spikes"), progress.step
    )  # every callback's state (the `spikes` entry)
    # the time-budget clock continues where it stopped
    return progress, float(state.get("elapsed_s", 0.0))


class FirstBatchLatency:
    """A resumed run logs, in its first metrics row, the loader's latency from its saved state to the first batch
    in hand: the restore, iter() and the wait for that batch."""

    def __init__(self, restore_s: float | None):
        self.restore_s, self.t0, self.value = restore_s, time.perf_counter(), None

    def first_batch_in_hand(self, at: float) -> None:
        if self.restore_s is not None:
            self.value, self.restore_s = self.restore_s + (at - self.t0), None

    def take(self) -> dict[str, float]:
        if self.value is None:
            return {}
        value, self.value = self.value, None
        return {"resume_first_batch_s": value}


def make_meter(run: Run) -> Throughput:
    """Tokens/s and MFU against the configured peak, or against a measured one (without moving the RNG)."""
    with rng_isolated():  # nothing outside the loop may move the RNG: exact resume needs it
        peak = run.cfg.logging.peak_flops or measure_peak_flops(
            device="cpu" if run.device.type == "cpu" else str(run.device)
        )
    model = run.engine.module
    rerun = objective_rerun(run.cfg, model)
    fpt = flops_per_token(
        run.cfg.model, run.n_params, run.cfg.packing.seq_len, untied_input_embedding(model), rerun
    )
    return Throughput(fpt, peak, run.world, bool(run.cfg.logging.peak_flops))


def progress_bar(run: Run, step: int) -> tqdm:
    return tqdm(
        total=run.clock.bar_total,
        initial=run.clock.bar_position(step),
        disable=run.rank != 0 or not run.cfg.logging.progress_bar,
        desc="pretrain",
        unit=run.clock.bar_unit,
        dynamic_ncols=True,
    )


# --- step -------------------------------------------------------------------------------------------------------


def check_bad_steps(run: Run, progress: Progress, outcome: StepOutcome) -> None:
    """Counts consecutive non-finite steps and halts after too many; a good step's loss is the one to keep."""
    progress.bad_steps = 0 if outcome.ok else progress.bad_steps + 1
    if progress.bad_steps >= run.cfg.deepspeed.max_consecutive_bad_steps:
        run.checkpoints.wait()  # the last good step's save completes before the run stops (every rank halts)
        raise TrainingHalted(
            f"{progress.bad_steps} consecutive steps with non-finite loss at step {progress.step}; last good "
            f"checkpoint: {run.checkpoints.last_good()} (left untouched)"
        )
    if outcome.applied:
        progress.last_loss = outcome.loss


def log_step(
    run: Run,
    progress: Progress,
    outcome: StepOutcome,
    bar,
    meter: Throughput,
    extra: dict[str, float],
) -> None:
    """A metrics row (the logging steps' one extra host read: gradient norm and device-skipped steps)."""
    engine = run.engine
    grad_norm, skipped_on_device = _step_figures(engine)
    stats = {
        "loss": outcome.loss if outcome.ok else float("nan"),
        "lr": run.scheduler.get_last_lr()[0],
        "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0) or 1.0),
        "tokens_seen": progress.tokens_seen,
        "skipped_steps": int(engine.skipped_steps) + skipped_on_device,
        "elapsed_s": run.clock.elapsed_s,
        # the callbacks' figures (stragglers, spikes, an objective's own), before the meter's report resets its wait
        **run.callbacks.metrics(progress.step, meter.wait),
        **meter.report(),
        **extra,  # the first row after a resume: resume_first_batch_s
    }
    # None only at ZeRO 0 without clipping: DeepSpeed computes no norm, so none is logged (not a false 0)
    if grad_norm is not None:
        stats["grad_norm"] = grad_norm
    run.callbacks.log(progress.step, stats)
    bar.set_postfix(
        loss=f"{stats['loss']:.3f}",
        lr=f"{stats['lr']:.2e}",
        tok_s=f"{stats['tokens_per_s']:.0f}",
        **{meter.key: f"{stats[meter.key]:.1%}"},  # mfu only against a stated peak
    )


# --- eval -------------------------------------------------------------------------------------------------------


def eval_step(run: Run, step: int, bar) -> None:
    """The held-out loss, then what the callbacks measure at an evaluation (the in-loop probe), in one row."""
    with rng_isolated():
        ev = evaluate(run.engine, run.eval_loader, run.cfg.eval.max_batches, run.device)
        ev.update(run.callbacks.evaluate(run, step))
    run.callbacks.log(step, ev, prefix="eval")
    if run.rank == 0:
        probe = f" probe {ev['probe/accuracy']:.3f}" if "probe/accuracy" in ev else ""
        bar.write(f"[eval] step {step}: loss {ev['loss']:.4f} ppl {ev['perplexity']:.2f}{probe}")


# --- save -------------------------------------------------------------------------------------------------------


def client_state(run: Run, progress: Progress) -> dict[str, Any]:
    """What a checkpoint carries beside DeepSpeed's own state, for an exact resume."""
    return {
        "step": progress.step,
        "tokens_seen": progress.tokens_seen,
        "loss": progress.last_loss,
        "elapsed_s": run.clock.elapsed_s,
        "loader": run.train_loader.state_dict(),
        "plan": run.plan.__dict__,
        "skipped_on_device": _step_figures(run.engine)[1],
        "spikes": run.callbacks.state_dict(),  # every callback's state, in the entry older checkpoints used
    }


def finish(run: Run, progress: Progress, preempted: bool) -> dict[str, Any]:
    """The run's result (and its plots); every rank leaves together."""
    last = run.checkpoints.close(
        progress.step
    )  # the last save's COMPLETE and upload (also at a preemption exit)
    result = {
        "step": progress.step,
        "tokens_seen": progress.tokens_seen,
        "loss": progress.last_loss,
        "preempted": preempted,
        "elapsed_s": round(run.clock.elapsed_s, 3),
        "budget_s": run.plan.budget_s,
        "checkpoint": str(last),
        "params": run.n_params,
    }
    if run.rank == 0 and run.cfg.logging.plots and run.cfg.logging.jsonl:
        from pretrain.run.plots import plot_run

        result["plots"] = str(plot_run(run.cfg.run.root)[0].parent) if run.layout.metrics.is_file() else None
    if run.rank == 0:
        run.layout.store.push_or_warn([run.layout.logs])
    dist.barrier()
    return result
