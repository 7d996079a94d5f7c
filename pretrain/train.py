"""The pretraining loop, readable top to bottom (nanoGPT-style): set up, resume, step, log, evaluate, save.

Run under torchrun (or `python -m launch run`): `python -m pretrain train --config configs/demo.yaml`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

from core.io import remove_orphans
from core.log import get_logger
from core.run_layout import RunLayout
from data_pipeline.loader import PretrainLoader
from data_pipeline.objectives import build_collator
from data_pipeline.token_shards import TokenShardError
from pretrain import checkpoint as ckpt
from pretrain import lr_scaling, resume_diff
from pretrain.engine import build_engine, init_distributed
from pretrain.metrics import (
    MetricsLogger,
    OutputMetrics,
    Throughput,
    flops_per_token,
    measure_peak_flops,
    untied_input_embedding,
)
from pretrain.models import build_model, count_parameters
from pretrain.objectives import prepare_model, wrap_model
from pretrain.parity import PROBE_FILE, BatchRecorder, probe_inputs, probe_logits, sabotage, save_probe
from pretrain.profiler import StepProfiler
from pretrain.run_lock import RunFolderLocked, RunLock
from pretrain.schedule import TimeWarmupDecay, lr_multiplier, make_plan
from pretrain.watchdog import Watchdog
from runconfig import RunConfig, save_resolved
from runconfig.load import to_dict

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


class TrainingHalted(ckpt.CannotContinue):
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


def resume_point(cfg: RunConfig, ckpt_dir: Path, rank: int) -> tuple[Path, str | None]:
    """The checkpoint to resume from (verified on every rank), and the config changes since it (applied or
    refused, printed)."""
    tag = None
    if cfg.checkpoint.resume == "auto":
        tag = ckpt.select_resume_tag(ckpt_dir, remote=cfg.checkpoint_remote)
    elif "://" in cfg.checkpoint.resume:  # a checkpoint in a bucket: downloaded into the staging folder first
        ckpt_dir, tag = ckpt.fetch_url(cfg.checkpoint.resume, Path(cfg.run.root) / "fetched-checkpoints")
    elif cfg.checkpoint.resume != "none":
        ckpt_dir, tag = Path(cfg.checkpoint.resume).parent, Path(cfg.checkpoint.resume).name
        if not (ckpt_dir / tag / ckpt.COMPLETE).is_file():
            raise ckpt.CannotContinue(
                f"checkpoint.resume: {ckpt_dir / tag} is not a complete checkpoint (no {ckpt.COMPLETE} file)"
            )
        problems = ckpt.verify_checkpoint(ckpt_dir / tag)
        if problems:
            raise ckpt.CannotContinue(
                f"checkpoint.resume: {ckpt_dir / tag} is damaged: " + "; ".join(problems[:6])
            )
    if tag is not None:
        meta = ckpt.read_complete(ckpt_dir, tag)
        changes = resume_diff.compare(
            meta.get("config"),
            to_dict(cfg),
            meta["step"],
            cfg.checkpoint.accept_config_changes,
            cfg.checkpoint.reset_data_order,
        )
        if rank == 0 and changes.describe():
            log.info(changes.describe())
    return ckpt_dir, tag


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
    non-finite flag can skip that step on the device (StepGuard); `read` brings the figures to the host after it."""

    def __init__(self, device: torch.device, rank: int):
        self.buf = torch.zeros(4, device=device, dtype=torch.float64)
        self.rank = rank

    def launch(self, loss_sum: torch.Tensor, bad: torch.Tensor, stop: bool, elapsed_s: float) -> torch.Tensor:
        """All-reduce without reading it: returns the agreed flag (float32, nonzero when any rank saw a
        non-finite loss)."""
        b = self.buf
        b[0] = loss_sum
        b[1] = bad
        b[2] = 1.0 if stop else 0.0
        b[3] = elapsed_s if self.rank == 0 else 0.0
        dist.all_reduce(b)
        return (b[1] > 0).float()

    def read(self) -> tuple[float, int, bool, float]:
        loss, n_bad, n_stop, clock = self.buf.tolist()
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


@torch.no_grad()
def evaluate(engine, loader: PretrainLoader, max_batches: int, device: torch.device) -> dict[str, float]:
    engine.eval()
    total, n = torch.zeros(2, device=device), 0
    for batch in loader:
        if n >= max_batches:
            break
        out = engine(**_to_device(batch, device))
        total += torch.stack([out.loss.detach().float(), torch.ones((), device=device)])
        n += 1
    dist.all_reduce(total)
    engine.train()
    loss = (total[0] / total[1].clamp(min=1)).item()
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


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


def _train(cfg: RunConfig) -> dict[str, Any]:
    # --- set-up ---------------------------------------------------------------------------------------------
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = RunLayout(cfg)
    ckpt_dir = Path(cfg.checkpoint_dir)
    plan = make_plan(cfg, world)
    broken = sabotage()  # test-only (bench/loss_parity.py proves it notices each): None in every real run
    if broken == "warmup":
        plan = dataclasses.replace(plan, warmup_steps=0)
    recorder = BatchRecorder(rank)  # test-only replay record for bench/loss_parity.py (LMSTACK_PARITY_RECORD)
    torch.manual_seed(cfg.run.seed + rank)

    # --- resume (decided before the engine exists: another world size loads a universal checkpoint) ---------
    load_dir, tag = resume_point(cfg, ckpt_dir, rank)
    if rank == 0:
        save_resolved(cfg, cfg.run.root)
        save_resolved(cfg, ckpt_dir)
        log.info(f"[train] plan for world size {world}:\n{plan.describe()}")
        log.info(
            "\n".join(
                "[train] " + x
                for x in sum(
                    lr_scaling.explain(cfg, plan.global_batch_size, plan.peak_lr, plan.warmup_steps), []
                )
            )
        )

    # a remote run: fetched into the staging folder (token shards: loader)
    layout.store.pull([layout.tokenizer])
    tokenizer = AutoTokenizer.from_pretrained(str(layout.tokenizer))
    # before the model is sized from it: a swapped tokenizer is named, not a size mismatch
    if tag is not None:
        ckpt.check_tokenizer(
            load_dir, tag.removesuffix(ckpt.UNIVERSAL_SUFFIX), layout.tokenizer, len(tokenizer)
        )
    model = build_model(cfg.model, tokenizer, cfg.packing.seq_len)
    prepare_model(cfg, model)
    # the objective's module around it (ELECTRA), else the model itself
    model = wrap_model(cfg, model, tokenizer)
    recorder.initial(model)
    n_params = count_parameters(model)
    collate = build_collator(cfg, tokenizer)
    try:
        train_loader = PretrainLoader(cfg, rank, world, split="train", collate_fn=collate)
        eval_loader = PretrainLoader(cfg, rank, world, split="eval", collate_fn=collate)
    except TokenShardError as e:  # a damaged or replaced shard: a restart would fail the same way
        raise ckpt.CannotContinue(str(e)) from None

    universal = tag is not None and ckpt.needs_universal(load_dir, tag, world)
    if universal:
        if rank == 0:
            log.info(f"[train] {tag} was written by another world size: converting to a universal checkpoint")
            ckpt.convert_to_universal(load_dir, tag)
        dist.barrier()
        tag += ckpt.UNIVERSAL_SUFFIX

    engine, scheduler, ds_config = build_engine(cfg, model, plan, load_universal=universal)
    device = engine.device
    watchdog = Watchdog.start(cfg, engine, layout.hang)  # hangs and stragglers named (logs/hang)
    stop = StopRequested()
    step, tokens_seen, bad_steps, last_loss, elapsed_s = 0, 0, 0, float("nan"), 0.0
    # a resumed run logs the loader's latency from its saved state to the first batch in hand
    restore_s = None
    if tag is not None:
        current = resume_diff.schedule_snapshot(scheduler)  # loading restores the checkpoint's schedule
        state = ckpt.load_checkpoint(engine, load_dir, tag)
        resume_diff.reapply_schedule(scheduler, current)
        step, tokens_seen = state["step"], state["tokens_seen"]
        last_loss = state.get("loss", last_loss)
        # the steps StepGuard skipped on the device before the checkpoint (DeepSpeed restores its own count)
        engine.step_guard.skipped = torch.tensor(float(state.get("skipped_on_device", 0)), device=device)
        elapsed_s = float(state.get("elapsed_s", 0.0))  # the time-budget clock continues where it stopped
        t_restore = time.perf_counter()
        try:
            train_loader.load_state_dict(state["loader"])
        except ValueError as e:  # another sample order (seed, tokens, packing or weights changed)
            if not cfg.checkpoint.reset_data_order:
                raise ckpt.CannotContinue(
                    f"{load_dir / tag}: {e}. Start a new output folder (another run.output_dir), or rerun with "
                    f"{resume_diff.RESET_FLAG} (checkpoint.reset_data_order=true) to keep the resumed weights and "
                    "start the new data order from its beginning"
                ) from None
            if rank == 0:  # the loader keeps its fresh state: the new order from its first sample
                log.info(
                    f"[train] data order reset at step {step} ({resume_diff.RESET_FLAG}): the loader starts "
                    "the new order from its beginning"
                )
        restore_s = time.perf_counter() - t_restore  # iter() and the wait for the first batch add to it below
    clock = TrainingClock(cfg, plan, scheduler, elapsed_s)
    if tag is not None and rank == 0:
        log.info(
            f"[train] resumed from {load_dir / tag} at step {step} ({elapsed_s:.1f}s of training, "
            f"lr now {clock.lr_now(scheduler):.6g})"
        )

    def client_state() -> dict[str, Any]:
        return {
            "step": step,
            "tokens_seen": tokens_seen,
            "loss": last_loss,
            "elapsed_s": clock.elapsed_s,
            "loader": train_loader.state_dict(),
            "plan": plan.__dict__,
            "skipped_on_device": _step_figures(engine)[1],
        }

    probe_batch = probe_inputs(tokenizer, cfg.model.family)
    ckpt_meta = {
        "config": to_dict(cfg),
        "tokenizer": ckpt.tokenizer_identity(layout.tokenizer, len(tokenizer)),
    }

    def store_probe(folder: Path) -> None:
        """Logits of the engine's own model (every rank runs it: ZeRO-3 forward needs them all)."""
        logits = probe_logits(engine, probe_batch, device)
        if rank == 0:
            save_probe(folder / PROBE_FILE, probe_batch, logits)

    # --- metrics --------------------------------------------------------------------------------------------
    logger = MetricsLogger.from_config(cfg, layout.logs, rank == 0)
    with _rng_isolated():  # nothing outside the loop may move the RNG: exact resume needs it
        peak = cfg.logging.peak_flops or measure_peak_flops(
            device="cpu" if device.type == "cpu" else str(device)
        )
    fpt = flops_per_token(cfg.model, n_params, cfg.packing.seq_len, untied_input_embedding(model))
    meter = Throughput(fpt, peak, world, bool(cfg.logging.peak_flops))
    bar = tqdm(
        total=clock.bar_total,
        initial=clock.bar_position(step),
        disable=rank != 0 or not cfg.logging.progress_bar,
        desc="pretrain",
        unit=clock.bar_unit,
        dynamic_ncols=True,
    )

    # --- the loop -------------------------------------------------------------------------------------------
    engine.train()
    t_iter = time.perf_counter()
    batches = iter(train_loader)
    resume_first_batch_s = None if restore_s is None else restore_s + (time.perf_counter() - t_iter)
    first_batch_pending = resume_first_batch_s is not None
    sync = StepSync(device, rank)
    output_metrics = OutputMetrics()  # the objective's own figures, if its model output carries any
    preempted, finished = False, clock.finished(step)
    # The one blocking read per step (StepSync) comes after engine.step() unless the LR follows a time budget: read
    # before the step, it idles the device while the host launches the optimizer (DeepSpeed's step is host-heavy).
    agree_before_step = clock.time_schedule is not None
    profiler = StepProfiler(cfg.logging.profile_steps, layout.logs, rank, device)
    clock.start()
    while not finished:
        profiler.begin(step + 1)
        watchdog.beat(step + 1, "data")
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        n_bad = torch.zeros((), device=device, dtype=torch.float64)
        output_metrics.new_step()
        for micro in range(plan.grad_accum):
            t_wait = time.perf_counter()
            with _rng_isolated():  # worker start-up and collation must not shift the dropout RNG stream
                host_batch = next(batches)
            waited = time.perf_counter() - t_wait
            if first_batch_pending:
                resume_first_batch_s += waited
                first_batch_pending = False
            n_tok = _count_tokens(host_batch)
            batch = _to_device(host_batch, device)
            recorder.batch(step, micro, host_batch)
            output = engine(**batch)
            loss = output.loss
            output_metrics.add(output)
            del output  # the logits need not live through backward
            # No host read per micro-batch: a non-finite loss is counted on the device, and the step it poisons is
            # skipped on the device (StepGuard) once all ranks agree on the count.
            if broken == "drop_micro" and rank == 0 and micro == 0:
                engine.backward(_zero_loss(engine))  # sabotage: this micro-batch's gradient is lost
                loss_sum += loss.detach()
            else:
                finite = torch.isfinite(loss.detach())
                n_bad += ~finite
                loss_sum += torch.where(finite, loss.detach(), 0.0)
                engine.backward(loss * world if broken == "sum_ranks" else loss)
            if micro == plan.grad_accum - 1:
                engine.step_guard.arm(sync.launch(loss_sum, n_bad, stop.requested, clock.now()))
                if agree_before_step:  # a time-budget LR follows the agreed clock: read before the step
                    total, n_bad_all, stop_all, agreed = sync.read()
                    clock.agree(agreed)
            engine.step()
            tokens_seen += n_tok * world
            meter.add(n_tok * world, batch["input_ids"].shape[0] * world, waited)
        # after the step: the host waits while the device runs the optimizer, not before
        if not agree_before_step:
            total, n_bad_all, stop_all, agreed = sync.read()
            clock.agree(agreed)
        step += 1
        watchdog.beat(step, "after")
        profiler.end(step)
        step_ok = n_bad_all == 0
        step_loss = total / (plan.grad_accum * (1 if broken == "sum_ranks" else world))
        recorder.step(step_loss)
        bad_steps = 0 if step_ok else bad_steps + 1
        if bad_steps >= cfg.deepspeed.max_consecutive_bad_steps:
            raise TrainingHalted(
                f"{bad_steps} consecutive steps with non-finite loss at step {step}; last good checkpoint: "
                f"{(ckpt.complete_tags(ckpt_dir) or [None])[-1]} in {ckpt_dir} (left untouched)"
            )
        if step_ok:
            last_loss = step_loss
        finished = clock.finished(step)
        bar.update(clock.bar_position(step) - bar.n)

        if step % cfg.logging.every_steps == 0 or finished:
            grad_norm, skipped_on_device = _step_figures(engine)
            stats = {
                "loss": step_loss if step_ok else float("nan"),
                "lr": scheduler.get_last_lr()[0],
                "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0) or 1.0),
                "tokens_seen": tokens_seen,
                "skipped_steps": int(engine.skipped_steps) + skipped_on_device,
                "elapsed_s": clock.elapsed_s,
                **watchdog.step_figures(step, meter.wait),  # before the meter's report resets its wait
                **meter.report(),
                **output_metrics.report(),
            }
            # None only at ZeRO 0 without clipping: DeepSpeed computes no norm, so none is logged (not a false 0)
            if grad_norm is not None:
                stats["grad_norm"] = grad_norm
            if resume_first_batch_s is not None:  # the first row after a resume only
                stats["resume_first_batch_s"], resume_first_batch_s = resume_first_batch_s, None
            logger.log(step, stats)
            bar.set_postfix(
                loss=f"{stats['loss']:.3f}",
                lr=f"{stats['lr']:.2e}",
                tok_s=f"{stats['tokens_per_s']:.0f}",
                **{meter.key: f"{stats[meter.key]:.1%}"},  # mfu only against a stated peak
            )
        if step % cfg.eval.every_steps == 0 or finished:
            with _rng_isolated():
                ev = evaluate(engine, eval_loader, cfg.eval.max_batches, device)
            logger.log(step, ev, prefix="eval")
            if rank == 0:
                bar.write(f"[eval] step {step}: loss {ev['loss']:.4f} ppl {ev['perplexity']:.2f}")

        preempted = stop_all
        due = step % cfg.checkpoint.every_steps == 0 or finished
        if (
            due and step_ok
        ) or preempted:  # never replace good checkpoints with a step that had a non-finite loss
            ckpt.save_checkpoint(
                engine,
                ckpt_dir,
                step,
                client_state(),
                cfg.checkpoint.keep_last,
                store_probe,
                ckpt_meta,
                remote=cfg.checkpoint_remote,
            )
            if rank == 0:  # a remote run: the logs so far and the resolved config go up with each checkpoint
                layout.store.push_or_warn([layout.logs, layout.resolved_config])
        if preempted:
            if rank == 0:
                bar.write(f"[train] signal {stop.signum}: checkpointed at step {step}, exiting for requeue")
            break

    watchdog.stop()
    profiler.end(step, finished=True)  # a window the run ended inside (a time budget) is written all the same
    bar.close()
    logger.close()
    recorder.close(plan)
    result = {
        "step": step,
        "tokens_seen": tokens_seen,
        "loss": last_loss,
        "preempted": preempted,
        "elapsed_s": round(clock.elapsed_s, 3),
        "budget_s": plan.budget_s,
        "checkpoint": str(ckpt_dir / ckpt.tag_for(step)),
        "params": n_params,
    }
    if rank == 0 and cfg.logging.plots and cfg.logging.jsonl:
        from pretrain.plots import plot_run

        result["plots"] = str(plot_run(cfg.run.root)[0].parent) if layout.metrics.is_file() else None
    if rank == 0:
        layout.store.push_or_warn([layout.logs])
    dist.barrier()
    return result
