"""The pretraining loop, readable top to bottom (nanoGPT-style): set up, resume, step, log, evaluate, save.

Run under torchrun (or `python -m launch run`): `python -m pretrain train --config configs/demo.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

from core.errors import CannotContinueError
from core.io import remove_orphans
from core.log import get_logger
from core.run_layout import RunLayout
from data_pipeline.loader import PretrainLoader
from data_pipeline.objectives import build_collator
from data_pipeline.token_shards import TokenShardError
from pretrain import lr_scaling
from pretrain.checkpoint.manager import CheckpointManager
from pretrain.engine import accelerator_name, build_engine, init_distributed
from pretrain.evaluation import evaluate
from pretrain.metrics import (
    MetricsLogger,
    OutputMetrics,
    Throughput,
    flops_per_token,
    measure_peak_flops,
    objective_rerun,
    untied_input_embedding,
)
from pretrain.models import build_model, count_parameters
from pretrain.objectives import prepare_model, wrap_model
from pretrain.parity import BatchRecorder, sabotage
from pretrain.probe_eval import STATE_KEY, TransferProbe
from pretrain.profiler import StepProfiler, phase
from pretrain.run_lock import RunFolderLocked, RunLock
from pretrain.schedule import TimeWarmupDecay, lr_multiplier, make_plan
from pretrain.spikes import SpikeDetector
from pretrain.watchdog import Watchdog
from runconfig import RunConfig, save_resolved

log = get_logger(__name__)


class StopRequested:
    """SIGTERM/SIGUSR1 (preemption, scancel, Slurm's grace signal) and SIGINT (Ctrl-C; plain torchrun passes it
    to the ranks) ask for a checkpoint at the next step end. A second SIGINT stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(s, self._handler)

    def _handler(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def requested(self) -> bool:
        """This rank was signalled; all ranks agree through StepSync so they stop at the same step."""
        return self.signum is not None


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


def _rng_isolated():
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
    host read per micro-batch): the summed finite loss, the count of non-finite micro-batches, the stop flag and
    rank 0's clock. `launch` writes and all-reduces on the device before the optimizer step, so the agreed
    non-finite flag can skip that step on the device (StepGuard); `read` brings the figures to the host after it.
    The loss-spike detector judges the agreed loss in between, on the device, and its flag joins the skip."""

    def __init__(self, device: torch.device, rank: int, spikes: SpikeDetector):
        # [4]: the loss-spike flag, judged after the reduce
        self.buf = torch.zeros(5, device=device, dtype=torch.float64)
        self.rank, self.spikes, self.spiked = rank, spikes, False

    def launch(self, loss_sum: torch.Tensor, bad: torch.Tensor, stop: bool, elapsed_s: float) -> torch.Tensor:
        """All-reduce without reading it: returns the agreed flag (float32, nonzero when any rank saw a
        non-finite loss)."""
        b = self.buf
        b[0] = self.spikes.local(loss_sum)
        b[4] = 0.0
        b[1] = bad
        b[2] = 1.0 if stop else 0.0
        b[3] = elapsed_s if self.rank == 0 else 0.0
        dist.all_reduce(b)
        # the same figures on every rank, so the same decision (pretrain/spikes.py)
        b[4] = self.spikes.judge(b[0], b[1])
        return ((b[1] > 0) | (b[4] > 0)).float()

    def read(self) -> tuple[float, int, bool, float]:
        with phase("step_read"):  # the step's one host read
            loss, n_bad, n_stop, clock, spike = self.buf.tolist()
        self.spiked = spike > 0
        return loss, int(n_bad), n_stop > 0, clock


def _zero_loss(engine) -> torch.Tensor:
    """A loss whose gradient is exactly zero for every parameter: stands in for a non-finite micro-batch so that
    every rank still runs the same collectives and the bad batch contributes nothing."""
    return sum(p.sum() * 0.0 for p in engine.module.parameters() if p.requires_grad)


def _step_figures(engine) -> tuple[float | None, int]:
    """The last gradient norm and the steps StepGuard skipped, in one host read (logging steps only)."""
    norm, skipped = engine.get_global_grad_norm(), engine.step_guard.skipped_steps()
    device_values = [torch.as_tensor(x, dtype=torch.float64) for x in (norm, skipped) if torch.is_tensor(x)]
    values = torch.stack([v.to(engine.device) for v in device_values]).tolist() if device_values else []
    out = [values.pop(0) if torch.is_tensor(x) else x for x in (norm, skipped)]
    return (None if out[0] is None else float(out[0])), int(out[1] or 0)


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
    probe_random_init: dict[str, Any] | None = None  # eval.probe_task's random-init figure, measured once


@dataclasses.dataclass
class StepOutcome:
    """One optimizer step as every rank agreed it (StepSync)."""

    loss: float
    ok: bool  # no rank saw a non-finite loss
    stop: bool  # some rank was signalled: checkpoint and exit
    first_batch_at: float  # when its first micro-batch was in hand (perf_counter)
    spiked: bool = False  # its loss spiked (pretrain/spikes.py): the update was not applied


@dataclasses.dataclass
class Run:
    """What set-up builds and the loop's functions share: built once, handed along."""

    cfg: RunConfig
    rank: int
    world: int
    layout: RunLayout
    checkpoints: CheckpointManager  # resume point, when to save, the save in flight (pretrain/checkpoint/)
    plan: Any
    broken: str | None  # test-only sabotage (bench/loss_parity.py); None in every real run
    recorder: BatchRecorder
    tokenizer: Any
    n_params: int
    train_loader: PretrainLoader
    eval_loader: PretrainLoader
    engine: Any
    scheduler: Any
    clock: TrainingClock
    stop: StopRequested
    sync: StepSync
    output_metrics: OutputMetrics
    watchdog: Watchdog  # hangs and stragglers named (logs/hang)
    transfer_probe: TransferProbe | None  # eval.probe_task

    @property
    def device(self) -> torch.device:
        return self.engine.device


# --- the loop ---------------------------------------------------------------------------------------------------


def _train(cfg: RunConfig) -> dict[str, Any]:
    run, progress, restore_s = set_up(cfg)
    logger = MetricsLogger.from_config(cfg, run.layout.logs, run.rank == 0)
    meter, bar, clock = make_meter(run), progress_bar(run, progress.step), run.clock
    profiler = StepProfiler(cfg.logging.profile_steps, run.layout.logs, run.rank, run.device)
    run.engine.train()
    # a resume's restore, iter() and first batch, in its first metrics row
    latency = FirstBatchLatency(restore_s)
    batches = iter(run.train_loader)
    start_probe(run, progress, logger)
    preempted, finished = False, clock.finished(progress.step)
    clock.start()
    while not finished:
        profiler.begin(progress.step + 1)
        run.watchdog.beat(progress.step + 1, "data")
        outcome = train_step(run, progress, batches, meter)
        latency.first_batch_in_hand(outcome.first_batch_at)
        progress.step += 1
        step = progress.step
        run.watchdog.beat(step, "after")
        profiler.end(step)
        check_bad_steps(run, progress, outcome)
        if handle_spike(run, progress, outcome):
            continue  # rolled back: the loop goes on from the last complete checkpoint's step
        finished = clock.finished(step)
        bar.update(clock.bar_position(step) - bar.n)
        if step % cfg.logging.every_steps == 0 or finished:
            log_step(run, progress, outcome, logger, bar, meter, latency.take())
        if step % cfg.eval.every_steps == 0 or finished:
            eval_step(run, step, logger, bar)
        preempted = outcome.stop
        run.checkpoints.save(step, lambda: client_state(run, progress), finished, outcome.ok, preempted)
        if preempted:
            if run.rank == 0:
                bar.write(
                    f"[train] signal {run.stop.signum}: checkpointed at step {step}, exiting for requeue"
                )
            break
    run.watchdog.stop()
    profiler.end(progress.step, finished=True)  # a window the run ended inside is written all the same
    bar.close()
    logger.close()
    return finish(run, progress, preempted)


# --- set-up -----------------------------------------------------------------------------------------------------


def set_up(cfg: RunConfig) -> tuple[Run, Progress, float | None]:
    """Plan, resume point, tokenizer, model, loaders, engine and restored state: everything the loop needs, and
    the seconds a resume took to restore the loader (None for a fresh run)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = RunLayout(cfg)
    plan = make_plan(cfg, world)
    broken = sabotage()  # test-only (bench/loss_parity.py proves it notices each): None in every real run
    if broken == "warmup":
        plan = dataclasses.replace(plan, warmup_steps=0)
    recorder = BatchRecorder(rank)  # test-only replay record for bench/loss_parity.py (LMSTACK_PARITY_RECORD)
    torch.manual_seed(cfg.run.seed + rank)

    tokenizer = load_tokenizer(layout)
    # the resume point, found and verified; a tokenizer other than its checkpoint's is named before the model
    checkpoints = CheckpointManager(cfg, layout, tokenizer, rank, world)
    if rank == 0:
        announce(cfg, plan, world, checkpoints.dir)
    # a resumed run loads its checkpoint: model.init_from's weights are read only by a fresh start
    model = build_module(cfg, tokenizer, weights=not checkpoints.resuming)
    recorder.initial(model)
    n_params = count_parameters(model)
    train_loader, eval_loader = build_loaders(cfg, rank, world, tokenizer)
    engine, scheduler, _ = build_engine(cfg, model, plan, load_universal=checkpoints.universal)
    sync = StepSync(engine.device, rank, SpikeDetector(cfg, engine.device, rank, plan.grad_accum * world))
    state, restore_s = checkpoints.load(
        engine, scheduler, train_loader, lambda: build_module(cfg, tokenizer, weights=False)
    )
    progress, elapsed_s = restore(engine, sync, state) if state is not None else (Progress(), 0.0)
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
        broken,
        recorder,
        tokenizer,
        n_params,
        train_loader,
        eval_loader,
        engine,
        scheduler,
        clock,
        StopRequested(),
        sync,
        OutputMetrics(),
        Watchdog.start(cfg, engine, layout.hang),
        TransferProbe.from_config(cfg, tokenizer, rank),
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


def restore(engine, sync: StepSync, state: dict[str, Any]) -> tuple[Progress, float]:
    """The loop's counters from a checkpoint's client state (the manager has restored the engine and the loader):
    the progress and the training clock's elapsed time."""
    progress = Progress(
        state["step"],
        state["tokens_seen"],
        state.get("loss", float("nan")),
        probe_random_init=state.get(STATE_KEY),
    )
    # the steps StepGuard skipped on the device before the checkpoint (DeepSpeed restores its own count)
    engine.step_guard.skipped = torch.tensor(float(state.get("skipped_on_device", 0)), device=engine.device)
    sync.spikes.load_state_dict(state.get("spikes"), progress.step)
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
    with _rng_isolated():  # nothing outside the loop may move the RNG: exact resume needs it
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


def train_step(run: Run, progress: Progress, batches, meter: Throughput) -> StepOutcome:
    """One optimizer step over `grad_accum` micro-batches, with the one host read per step (StepSync)."""
    engine, plan, world, clock, sync = run.engine, run.plan, run.world, run.clock, run.sync
    loss_sum = torch.zeros((), device=run.device, dtype=torch.float64)
    n_bad = torch.zeros((), device=run.device, dtype=torch.float64)
    run.output_metrics.new_step()
    # The one blocking read per step comes after engine.step() unless the LR follows a time budget: read before the
    # step, it idles the device while the host launches the optimizer (DeepSpeed's step is host-heavy).
    agree_before_step = clock.time_schedule is not None
    first_batch_at = 0.0
    for micro in range(plan.grad_accum):
        t_wait = time.perf_counter()
        # worker start-up and collation must not shift the dropout RNG stream
        with phase("batch"), _rng_isolated():
            host_batch = next(batches)
            waited = time.perf_counter() - t_wait
            first_batch_at = first_batch_at or time.perf_counter()
            n_tok = _count_tokens(host_batch)
            batch = _to_device(host_batch, run.device)
        run.recorder.batch(progress.step, micro, host_batch)
        with phase("forward"):
            output = engine(**batch)
        loss = output.loss
        run.output_metrics.add(output)
        del output  # the logits need not live through backward
        # No host read per micro-batch: a non-finite loss is counted on the device, and the step it poisons is
        # skipped on the device (StepGuard) once all ranks agree on the count.
        if run.broken == "drop_micro" and run.rank == 0 and micro == 0:
            engine.backward(_zero_loss(engine))  # sabotage: this micro-batch's gradient is lost
            loss_sum += loss.detach()
        else:
            finite = torch.isfinite(loss.detach())
            n_bad += ~finite
            loss_sum += torch.where(finite, loss.detach(), 0.0)
            with phase("backward"):
                engine.backward(loss * world if run.broken == "sum_ranks" else loss)
        if micro == plan.grad_accum - 1:
            with phase("step_sync"):
                engine.step_guard.arm(sync.launch(loss_sum, n_bad, run.stop.requested, clock.now()))
            if agree_before_step:  # a time-budget LR follows the agreed clock: read before the step
                agreed = sync.read()
                clock.agree(agreed[3])
        with phase("optimizer_step" if micro == plan.grad_accum - 1 else "engine_step"):
            engine.step()
        progress.tokens_seen += n_tok * world
        meter.add(n_tok * world, batch["input_ids"].shape[0] * world, waited)
    if (
        not agree_before_step
    ):  # after the step: the host waits while the device runs the optimizer, not before
        agreed = sync.read()
        clock.agree(agreed[3])
    total, n_bad_all, stop_all, _ = agreed
    step_loss = total / (plan.grad_accum * (1 if run.broken == "sum_ranks" else world))
    run.recorder.step(step_loss)
    return StepOutcome(step_loss, n_bad_all == 0, stop_all, first_batch_at, sync.spiked)


def check_bad_steps(run: Run, progress: Progress, outcome: StepOutcome) -> None:
    """Counts consecutive non-finite steps and halts after too many; a good step's loss is the one to keep."""
    progress.bad_steps = 0 if outcome.ok else progress.bad_steps + 1
    if progress.bad_steps >= run.cfg.deepspeed.max_consecutive_bad_steps:
        run.checkpoints.wait()  # the last good step's save completes before the run stops (every rank halts)
        raise TrainingHalted(
            f"{progress.bad_steps} consecutive steps with non-finite loss at step {progress.step}; last good "
            f"checkpoint: {run.checkpoints.last_good()} (left untouched)"
        )
    if outcome.ok and not outcome.spiked:
        progress.last_loss = outcome.loss


def handle_spike(run: Run, progress: Progress, outcome: StepOutcome) -> bool:
    """A loss spike's action (spikes.action, pretrain/spikes.py), alike on every rank; True when the run rolled
    back to the last complete checkpoint (its step, tokens and loss are the progress now). Under `rollback`, a
    non-finite step rolls back as well."""
    spikes = run.sync.spikes
    # agreed on every rank: a stop or a rollback finds the last save complete
    if outcome.spiked or not outcome.ok:
        run.checkpoints.wait()
    if not spikes.handle(progress.step, outcome.spiked, outcome.loss, finite=outcome.ok):
        return False
    state = spikes.rollback(run.checkpoints, run.train_loader)
    if state is None:  # no complete checkpoint yet: the spike was skipped
        return False
    progress.step, progress.tokens_seen = state["step"], state["tokens_seen"]
    progress.last_loss = state.get("loss", progress.last_loss)
    progress.bad_steps = 0  # the checkpoint's weights gave finite losses
    return True


def log_step(
    run: Run,
    progress: Progress,
    outcome: StepOutcome,
    logger,
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
        **run.watchdog.step_figures(progress.step, meter.wait),  # before the meter's report resets its wait
        **meter.report(),
        **run.output_metrics.report(),
        **run.sync.spikes.metrics(),  # spikes, spikes_skipped, spike_rollbacks (with spikes.action set)
        **extra,  # the first row after a resume: resume_first_batch_s
    }
    # None only at ZeRO 0 without clipping: DeepSpeed computes no norm, so none is logged (not a false 0)
    if grad_norm is not None:
        stats["grad_norm"] = grad_norm
    logger.log(progress.step, stats)
    bar.set_postfix(
        loss=f"{stats['loss']:.3f}",
        lr=f"{stats['lr']:.2e}",
        tok_s=f"{stats['tokens_per_s']:.0f}",
        **{meter.key: f"{stats[meter.key]:.1%}"},  # mfu only against a stated peak
    )


# --- eval -------------------------------------------------------------------------------------------------------


def eval_step(run: Run, step: int, logger, bar) -> None:
    with _rng_isolated():
        ev = evaluate(run.engine, run.eval_loader, run.cfg.eval.max_batches, run.device)
        if run.transfer_probe is not None:
            ev.update(run.transfer_probe.measure(run.engine.module))
    logger.log(step, ev, prefix="eval")
    if run.rank == 0:
        probe = f" probe {ev['probe/accuracy']:.3f}" if "probe/accuracy" in ev else ""
        bar.write(f"[eval] step {step}: loss {ev['loss']:.4f} ppl {ev['perplexity']:.2f}{probe}")


def start_probe(run: Run, progress: Progress, logger) -> None:
    """The transfer probe's random-init figure: the checkpoint's, or measured before the first step (a row at 0)."""
    if run.transfer_probe is not None:
        with _rng_isolated():
            row = run.transfer_probe.start(run.engine.module, progress.probe_random_init, progress.step)
        if row:
            logger.log(progress.step, row, prefix="eval")


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
        "spikes": run.sync.spikes.state_dict(),
        STATE_KEY: run.transfer_probe.state() if run.transfer_probe else None,
    }


def finish(run: Run, progress: Progress, preempted: bool) -> dict[str, Any]:
    """The run's result (and its plots); every rank leaves together."""
    # the last save's COMPLETE and upload (also at a preemption exit)
    last = run.checkpoints.close(progress.step)
    run.recorder.close(run.plan)
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
        from pretrain.plots import plot_run

        result["plots"] = str(plot_run(run.cfg.run.root)[0].parent) if run.layout.metrics.is_file() else None
    if run.rank == 0:
        run.layout.store.push_or_warn([run.layout.logs])
    dist.barrier()
    return result
