"""Engine parity: for every registered model family, our engine and a plain reference loop train the same initial
weights on the same token batches, and their per-step training losses must agree within a measured tolerance.

(a) Ours: `python -m pretrain train` under torchrun on 2 CPU ranks (DS_ACCELERATOR=cpu, gloo), DeepSpeed ZeRO-2
    fp32, micro-batch 4, gradient accumulation 2 (global batch 16), our warmup + decay schedule, gradient clipping
    (optim.grad_clip set to CLIP for every family, low enough to bite at these sizes: the bench prints on how many
    steps it did), the family's objective with its defaults (sparse MLM head where the family uses it). The
    trainer runs its real path; a test callback registered on our run only (bench/parity_callbacks.py
    ParityRecorder, a `module.path:Name` under `callbacks:`, as an outside plug-in) saves the initial weights (rank 0, before DeepSpeed broadcasts them), every micro-batch each rank trained on (our
    collator's output: masks, spans, replacements and labels as data) with the RNG state just before its forward,
    the plan (peak LR, warmup, total steps) and the per-step losses it logged.
(b) Reference: one process, the family's `transformers` class built from the same config with those initial weights,
    its own loss (labels passed to the HF forward: the dense head, not our sparse one), `torch.optim.AdamW` with
    the same hyper-parameters and the usual no-decay groups (biases and norms), the same schedule written here with
    `LambdaLR`, `clip_grad_norm_`, and each optimizer step accumulated over the same 4 micro-batches (2 ranks x 2
    accumulation, loss / 4 each). Before each micro-batch's forward the recorded RNG state is restored, so dropout
    masks and ELECTRA's generator samples are the ones our run drew. ELECTRA: transformers has no replaced-token-
    detection pretraining loss, so its reference trains our objective's module (`pretrain.objectives.rtd`:
    generator + discriminator, the paper's loss) in the plain loop; what is checked there is the engine, not RTD.

Tolerance: the reference runs twice, (1 thread, micro-batches in rank order) and (2 threads, micro-batches in reverse
order: another float summation order), and noise = the largest per-step loss difference between them. tolerance =
max(K_NOISE x noise, ABS_FLOOR). VERDICT per family: ours = max |our loss - reference loss| over the steps, peer =
tolerance, ratio = ours / tolerance, passes when ratio <= 1 (printed as goal=1.0).

Optimizers: every family runs with AdamW as above. A family whose shipped recipe (`configs/<family>-budget.yaml`)
picks another optimizer also runs with that one (today t5-budget: Adafactor, VERDICT loss_parity_t5_adafactor), so
the path we ship is checked too: ours with `optim.name=adafactor` under ZeRO stage 0 (which Adafactor needs), the
reference with transformers' `Adafactor` as its docs configure it for T5 (scale_parameter, no relative step, no
warmup_init, the config's LR), the same groups, schedule and clipping. `--optimizers` picks them by hand.

Every family in `pretrain.families.family_names()` is run; one without a `configs/<family>-tiny.yaml` preset is a
named skip. `--sabotage NAME` breaks our side (the Sabotage callback, bench/parity_callbacks.py: warmup, drop_micro,
sum_ranks, no_clip) and the verdict must fail (tests/bench/test_loss_parity.py). sum_ranks is seen in the logged
loss (x 2): its doubled gradient alone would hardly show, since clipping and Adam's normalisation cancel a uniform
gradient scale (up to eps).

`python bench/loss_parity.py [--families gpt2 t5] [--optimizers adamw adafactor] [--steps 6] [--sabotage warmup]
[--no-save]`
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from parity_callbacks import SABOTAGES, callbacks_override  # noqa: E402

# The measured noise is a few fp32 ulps of a loss near 7 (1e-7 .. 4e-7 on a loaded 2-core machine), too small to
# bound the drift that other reduction orders build up over steps (T5: 8.6e-6 by step 6, ours vs reference). The
# floor, 1e-4 (about 1.3e-5 of a loss near 7.6), stays 5x below the smallest sabotage effect measured (clipping off:
# 5.4e-4 by step 6 on gpt2; the tests run the sabotages for 8 steps).
K_NOISE, ABS_FLOOR = 10.0, 1e-4
CLIP = 0.5
MICRO, ACCUM, WORLD = 4, 2, 2
FILES = "0[0-4]?.txt"  # 50 articles per topic: a small corpus, prepared (and cached) in seconds
EXTRA_YAML = "tokenizer: {vocab_size: 2000}\n"
OPTIMIZERS = ("adamw", "adafactor")


def shipped_optimizer(family: str) -> str | None:
    """The optimizer `configs/<family>-budget.yaml` trains with, or None without that preset."""
    from runconfig import load_config

    preset = C.ROOT / "configs" / f"{family}-budget.yaml"
    return load_config(preset).optim.name if preset.is_file() else None


def overrides(steps: int, warmup: int, optimizer: str = "adamw") -> list[str]:
    # Adafactor factors and scales whole matrices, so it needs ZeRO stage 0 (the config refuses it otherwise)
    zero = 0 if optimizer == "adafactor" else 2
    return [
        f"optim.name={optimizer}",
        f"deepspeed.zero_stage={zero}",
        f"batch.micro_batch_size={MICRO}",
        f"batch.global_batch_size={MICRO * ACCUM * WORLD}",
        f"schedule.total_steps={steps}",
        f"schedule.warmup_steps={warmup}",
        "schedule.decay=linear",
        f"optim.grad_clip={CLIP}",
        "deepspeed.precision=fp32",
        "deepspeed.activation_checkpointing=false",
        "deepspeed.compile=false",
        "logging.every_steps=1",
        "logging.progress_bar=false",
        "logging.plots=false",
        f"eval.every_steps={steps}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={steps}",
        "checkpoint.keep_last=1",
        "lr_scaling.rule=none",
        "launch.procs_per_node=2",
    ]


def run_ours(
    cfg_path: Path, work: Path, ov: list[str], sabotage: str | None
) -> tuple[list[float], Path, float, list[float]]:
    """Our trainer, recording; returns the per-step losses it logged (metrics.jsonl), the record folder, its wall
    seconds and its logged per-step gradient norms."""
    run_dir, record = work / "ours", work / "record"
    for d in (run_dir, record):
        shutil.rmtree(d, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (run_dir / stage).symlink_to((cfg_path.parent / "run" / stage).resolve())
    env = C.child_env(threads=1)
    args = [
        "-m",
        "pretrain",
        "train",
        "--config",
        str(cfg_path),
        f"run.output_dir={run_dir}",
        *ov,
        callbacks_override(record, sabotage),
    ]
    _, wall = C.torchrun(WORLD, args, timeout=900, env=env)
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = {r["step"]: r for r in rows if r.get("split") == "train"}
    losses = [float(train[s]["loss"]) for s in sorted(train)]
    norms = [float(train[s]["grad_norm"]) for s in sorted(train)]
    return losses, record, wall, norms


def schedule(warmup: int, total: int, decay: str, min_ratio: float):
    """The LR multiplier, written independently of pretrain/run/schedule.py: linear warmup over `warmup` steps
    ((s + 1) / warmup), then linear or cosine decay to `min_ratio` at `total`."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        p = min(1.0, max(0.0, (s - warmup) / max(1, total - warmup)))
        g = (
            1.0
            if decay == "constant"
            else (1.0 - p if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * p)))
        )
        return min_ratio + (1.0 - min_ratio) * g

    return f


def load_record(record: Path) -> tuple[dict[str, Any], list[list[dict[str, Any]]], dict[str, Any]]:
    """Initial weights, the micro-batches of each step in (rank, micro) order, and rank 0's plan."""
    import torch

    init = torch.load(record / "init.pt", weights_only=False)
    ranks = [torch.load(record / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    steps = sorted({m["step"] for m in ranks[0]["micro"]})
    per_step = [
        [m for r in ranks for m in sorted(r["micro"], key=lambda m: m["micro"]) if m["step"] == s]
        for s in steps
    ]
    for s, ms in zip(steps, per_step, strict=True):
        if len(ms) != WORLD * ACCUM:
            raise RuntimeError(f"{record}: step {s} has {len(ms)} micro-batches, expected {WORLD * ACCUM}")
    return init, per_step, ranks[0]["plan"]


def reference(
    cfg_path: Path, ov: list[str], record: Path, threads: int, reverse: bool
) -> tuple[list[float], list[float]]:
    """The plain loop (see the module docstring); per-step mean loss over the step's micro-batches, and per-step
    gradient norm before clipping (what `clip_grad_norm_` returns)."""
    import torch
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from pretrain.objectives import wrap_model
    from pretrain.run.models import build_model
    from runconfig import load_config

    torch.set_num_threads(threads)
    cfg = load_config(cfg_path, [f"run.output_dir={cfg_path.parent / 'run'}", *ov])
    tokenizer = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    init, per_step, _ = load_record(record)
    model = build_model(cfg.model, tokenizer, cfg.packing.seq_len)
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # training: no KV cache (GPT-2's restarted position_ids need it off)
    # no RTD loss in transformers: our objective's module, in this plain loop
    if cfg.objective.type == "electra":
        model = wrap_model(cfg, model, tokenizer)
    model.load_state_dict(init, strict=True)
    model.train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() or name.endswith(".bias") else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if cfg.optim.name == "adafactor":
        from transformers.optimization import Adafactor

        # as transformers' docs set it up for T5 with an external schedule
        opt = Adafactor(groups, lr=cfg.optim.lr, scale_parameter=True, relative_step=False, warmup_init=False)
    elif cfg.optim.name == "adamw":
        opt = torch.optim.AdamW(groups, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
    else:
        raise ValueError(f"optim.name={cfg.optim.name!r}: the reference loop has adamw and adafactor")
    # The hyper-parameters come from the config (lr_scaling.rule=none: the peak LR is optim.lr), never from what
    # our run recorded, so a sabotaged plan on our side cannot leak into the reference.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, schedule(cfg.schedule.warmup, cfg.schedule.steps, cfg.schedule.decay, cfg.schedule.min_lr_ratio)
    )
    params = [p for g in opt.param_groups for p in g["params"]]
    losses, norms = [], []
    for micro in per_step:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in reversed(micro) if reverse else micro:
            torch.set_rng_state(m["rng"])
            loss = model(**m["batch"]).loss
            (loss / len(micro)).backward()
            total += float(loss.detach())
        # max_norm inf: the norm without clipping, so it is measured the same way either way
        norm = torch.nn.utils.clip_grad_norm_(
            params, cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        )
        opt.step()
        sched.step()
        losses.append(total / len(micro))
        norms.append(float(norm))
    return losses, norms


def run_family(
    family: str,
    steps: int,
    warmup: int,
    sabotage: str | None,
    report: C.Report,
    work: Path,
    optimizer: str = "adamw",
) -> bool:
    t0 = time.perf_counter()
    name = family if optimizer == "adamw" else f"{family}_{optimizer}"
    # prepare_run links the cached data stages into a new folder
    shutil.rmtree(work / name, ignore_errors=True)
    cfg_path = C.prepare_run(work / name, family, extra_yaml=EXTRA_YAML, files=FILES)
    ov = overrides(steps, warmup, optimizer)
    ours, record, wall, norms = run_ours(cfg_path, work / name, ov, sabotage)
    ref, ref_norms = reference(cfg_path, ov, record, threads=1, reverse=False)
    alt, _ = reference(cfg_path, ov, record, threads=2, reverse=True)
    if len(ours) != len(ref):
        raise RuntimeError(f"{family}: our run logged {len(ours)} steps, the reference ran {len(ref)}")
    noise = max(abs(a - b) for a, b in zip(ref, alt, strict=True))
    tol = max(K_NOISE * noise, ABS_FLOOR)
    diffs = [abs(a - b) for a, b in zip(ours, ref, strict=True)]
    fmt = " ".join
    report.line(
        f"{name}: {optimizer}, {steps} steps (warmup {warmup}), ours {wall:.0f}s under torchrun, total "
        f"{time.perf_counter() - t0:.0f}s{f', SABOTAGE {sabotage}' if sabotage else ''}"
    )
    report.line(f"  ours      loss {fmt(f'{x:.6f}' for x in ours)}")
    report.line(f"  reference loss {fmt(f'{x:.6f}' for x in ref)}")
    report.line(f"  |diff|         {fmt(f'{x:.1e}' for x in diffs)}")
    report.line(
        f"  grad norm (ours, before clipping at {CLIP}) {fmt(f'{x:.4g}' for x in norms)}; clipped on "
        f"{sum(n > CLIP for n in norms)}/{len(norms)} steps"
    )
    report.line(f"  grad norm (reference)                  {fmt(f'{x:.4g}' for x in ref_norms)}")
    report.line(
        f"  noise floor (reference: 1 thread in rank order vs 2 threads reversed) {noise:.1e}; tolerance "
        f"max({K_NOISE:g} x noise, {ABS_FLOOR:g}) = {tol:.1e}"
    )
    worst = max(diffs)
    ok = worst <= tol
    verdict = (
        f"VERDICT loss_parity_{name}: ours={worst:.3g} peer={tol:.3g} ratio={worst / tol:.3g} goal=1.0 "
        f"{'pass' if ok else 'fail'}"
    )  # lower is better: passes when ratio <= goal
    report.record(verdict)
    return ok


def main(argv: list[str] | None = None) -> int:
    from pretrain.families import family_names

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="*", help="default: every registered family")
    ap.add_argument(
        "--optimizers",
        nargs="*",
        choices=OPTIMIZERS,
        help="default: adamw for every family, plus the optimizer of its configs/<family>-budget.yaml",
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--sabotage", choices=SABOTAGES)
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results/loss_parity.txt")
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    registered = family_names()
    families = args.families or registered
    unknown = [f for f in families if f not in registered]
    if unknown:
        ap.error(f"--families: {', '.join(unknown)} not registered (registered: {', '.join(registered)})")
    report = C.Report(__file__, save=not args.no_save and args.sabotage is None)
    work = args.work or Path(tempfile.mkdtemp(prefix="loss_parity-"))
    skipped = []
    try:
        for family in families:
            if not (C.ROOT / "configs" / f"{family}-tiny.yaml").is_file():
                skipped.append(family)
                report.line(f"SKIP {family}: no configs/{family}-tiny.yaml preset")
                continue
            shipped = shipped_optimizer(family)
            optimizers = args.optimizers or ["adamw", *([shipped] if shipped not in (None, "adamw") else [])]
            for optimizer in optimizers:
                run_family(family, args.steps, args.warmup, args.sabotage, report, work, optimizer)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    names = f" ({', '.join(skipped)})" if skipped else ""
    report.line(f"{len(families) - len(skipped)} families run, {len(skipped)} skipped{names}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
