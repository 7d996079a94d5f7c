"""The pretraining loop, readable top to bottom (nanoGPT-style): set up, resume, step, log, evaluate, save.

Run under torchrun (or `python -m launch run`): `python -m pretrain train --config configs/demo.yaml`.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoTokenizer

from data_pipeline.layout import RunLayout
from data_pipeline.loader import PretrainLoader
from data_pipeline.objectives import build_collator, prepare_model
from pretrain import checkpoint as ckpt
from pretrain import lr_scaling
from pretrain.engine import build_engine, init_distributed
from pretrain.metrics import MetricsLogger, Throughput, flops_per_token, measure_peak_flops
from pretrain.models import build_model, count_parameters
from pretrain.parity import PROBE_FILE, probe_inputs, probe_logits, save_probe
from pretrain.schedule import make_plan
from runconfig import RunConfig, save_resolved


class StopRequested:
    """SIGTERM/SIGUSR1 (preemption, scancel, Slurm's grace signal) ask for a checkpoint at the next step end."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, self._handler)

    def _handler(self, signum: int, _frame: Any) -> None:
        self.signum = signum

    def agreed(self, device: torch.device) -> bool:
        """All ranks stop at the same step if any rank was signalled."""
        flag = torch.tensor([1.0 if self.signum is not None else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


class TrainingHalted(RuntimeError):
    pass


def _rng_isolated():
    """Run a block without moving the global RNG (CPU and this rank's GPU), so that start-up work, evaluation
    and loader set-up leave the dropout stream exactly as an uninterrupted run would have it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    return torch.random.fork_rng(devices=devices)


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _count_tokens(batch: dict[str, torch.Tensor]) -> int:
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        return int(mask.sum())
    return int(batch["input_ids"].numel())


def _all_finite(loss: torch.Tensor) -> bool:
    flag = torch.isfinite(loss.detach()).float().reshape(1)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() > 0)


def _mean_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _zero_loss(engine) -> torch.Tensor:
    """A loss whose gradient is exactly zero for every parameter: stands in for a non-finite micro-batch so that
    every rank still runs the same collectives and the bad batch contributes nothing."""
    return sum(p.sum() * 0.0 for p in engine.module.parameters() if p.requires_grad)


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
    # --- set-up ---------------------------------------------------------------------------------------------
    rank, world = init_distributed(cfg)
    layout = RunLayout(cfg)
    ckpt_dir = Path(cfg.checkpoint_dir)
    plan = make_plan(cfg, world)
    torch.manual_seed(cfg.run.seed + rank)
    if rank == 0:
        save_resolved(cfg, cfg.run.output_dir)
        save_resolved(cfg, ckpt_dir)
        print(f"[train] plan for world size {world}:\n{plan.describe()}", flush=True)
        print("\n".join("[train] " + x for x in sum(lr_scaling.explain(cfg, plan.global_batch_size, plan.peak_lr,
                                                                        plan.warmup_steps), [])), flush=True)

    tokenizer = AutoTokenizer.from_pretrained(str(layout.tokenizer))
    model = build_model(cfg.model, tokenizer, cfg.packing.seq_len)
    prepare_model(cfg, model)
    n_params = count_parameters(model)
    collate = build_collator(cfg, tokenizer)
    train_loader = PretrainLoader(cfg, rank, world, split="train", collate_fn=collate)
    eval_loader = PretrainLoader(cfg, rank, world, split="eval", collate_fn=collate)

    # --- resume (decided before the engine exists: another world size loads a universal checkpoint) ---------
    tag = ckpt.find_resume_tag(ckpt_dir) if cfg.checkpoint.resume == "auto" else None
    if cfg.checkpoint.resume not in ("auto", "none"):
        ckpt_dir, tag = Path(cfg.checkpoint.resume).parent, Path(cfg.checkpoint.resume).name
    universal = tag is not None and ckpt.needs_universal(ckpt_dir, tag, world)
    if universal:
        if rank == 0:
            print(f"[train] {tag} was written by another world size: converting to a universal checkpoint",
                  flush=True)
            ckpt.convert_to_universal(ckpt_dir, tag)
        dist.barrier()
        tag += ckpt.UNIVERSAL_SUFFIX

    engine, scheduler, ds_config = build_engine(cfg, model, plan, load_universal=universal)
    device = engine.device
    stop = StopRequested()
    step, tokens_seen, bad_steps, last_loss = 0, 0, 0, float("nan")
    if tag is not None:
        state = ckpt.load_checkpoint(engine, ckpt_dir, tag)
        step, tokens_seen = state["step"], state["tokens_seen"]
        last_loss = state.get("loss", last_loss)
        train_loader.load_state_dict(state["loader"])
        if rank == 0:
            print(f"[train] resumed from {ckpt_dir / tag} at step {step}", flush=True)

    def client_state() -> dict[str, Any]:
        return {
            "step": step,
            "tokens_seen": tokens_seen,
            "loss": last_loss,
            "loader": train_loader.state_dict(),
            "plan": plan.__dict__,
        }

    probe_batch = probe_inputs(tokenizer, cfg.model.family)

    def store_probe(folder: Path) -> None:
        """Logits of the engine's own model (every rank runs it: ZeRO-3 forward needs them all)."""
        logits = probe_logits(engine, probe_batch, device)
        if rank == 0:
            save_probe(folder / PROBE_FILE, probe_batch, logits)

    # --- metrics --------------------------------------------------------------------------------------------
    logger = MetricsLogger.from_config(cfg, layout.logs, rank == 0)
    with _rng_isolated():  # nothing outside the loop may move the RNG: exact resume needs it
        peak = cfg.logging.peak_flops or measure_peak_flops(device="cpu" if device.type == "cpu" else str(device))
    meter = Throughput(flops_per_token(cfg.model, n_params, cfg.packing.seq_len), peak, world)
    bar = tqdm(total=plan.total_steps, initial=step, disable=rank != 0 or not cfg.logging.progress_bar,
               desc="pretrain", unit="step", dynamic_ncols=True)

    # --- the loop -------------------------------------------------------------------------------------------
    engine.train()
    batches = iter(train_loader)
    preempted = False
    while step < plan.total_steps:
        step_loss, step_ok = 0.0, True
        for _ in range(plan.grad_accum):
            t_wait = time.perf_counter()
            with _rng_isolated():  # worker start-up and collation must not shift the dropout RNG stream
                batch = _to_device(next(batches), device)
            waited = time.perf_counter() - t_wait
            loss = engine(**batch).loss
            if _all_finite(loss):
                engine.backward(loss)
                step_loss += loss.item() / plan.grad_accum
            else:
                step_ok = False
                engine.backward(_zero_loss(engine))
            engine.step()
            n_tok = _count_tokens(batch)
            tokens_seen += n_tok * world
            meter.add(n_tok * world, batch["input_ids"].shape[0] * world, waited)
        step += 1
        step_loss = _mean_over_ranks(step_loss, device)
        bad_steps = 0 if step_ok else bad_steps + 1
        if bad_steps >= cfg.deepspeed.max_consecutive_bad_steps:
            raise TrainingHalted(
                f"{bad_steps} consecutive steps with non-finite loss at step {step}; last good checkpoint: "
                f"{ckpt.find_resume_tag(ckpt_dir)} in {ckpt_dir} (left untouched)"
            )
        if step_ok:
            last_loss = step_loss
        bar.update(1)

        if step % cfg.logging.every_steps == 0 or step == plan.total_steps:
            stats = {
                "loss": step_loss if step_ok else float("nan"),
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": float(engine.get_global_grad_norm() or 0.0),
                "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0) or 1.0),
                "tokens_seen": tokens_seen,
                "skipped_steps": int(engine.skipped_steps),
                **meter.report(),
            }
            logger.log(step, stats)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", lr=f"{stats['lr']:.2e}",
                            tok_s=f"{stats['tokens_per_s']:.0f}", mfu=f"{stats['mfu']:.1%}")
        if step % cfg.eval.every_steps == 0 or step == plan.total_steps:
            with _rng_isolated():
                ev = evaluate(engine, eval_loader, cfg.eval.max_batches, device)
            logger.log(step, ev, prefix="eval")
            if rank == 0:
                bar.write(f"[eval] step {step}: loss {ev['loss']:.4f} ppl {ev['perplexity']:.2f}")

        preempted = stop.agreed(device)
        due = step % cfg.checkpoint.every_steps == 0 or step == plan.total_steps
        if (due and step_ok) or preempted:  # never replace good checkpoints with a step that had a non-finite loss
            ckpt.save_checkpoint(engine, ckpt_dir, step, client_state(), cfg.checkpoint.keep_last, store_probe)
        if preempted:
            if rank == 0:
                bar.write(f"[train] signal {stop.signum}: checkpointed at step {step}, exiting for requeue")
            break

    bar.close()
    logger.close()
    result = {"step": step, "tokens_seen": tokens_seen, "loss": last_loss, "preempted": preempted,
              "checkpoint": str(ckpt_dir / ckpt.tag_for(step)), "params": n_params}
    if rank == 0 and cfg.logging.plots and cfg.logging.jsonl:
        from pretrain.plots import plot_run

        result["plots"] = str(plot_run(cfg.run.output_dir)[0].parent) if (layout.logs / "metrics.jsonl").is_file() else None
    dist.barrier()
    return result
