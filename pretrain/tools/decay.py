"""Decay branches: `python -m pretrain decay --config C --from STEP --steps N`, a cool-down started from a
stable-phase checkpoint of a warmup-stable-decay run (MiniCPM; Hägele et al. 2024).

A WSD run's stable phase holds the peak LR whatever its cool-down's start (pretrain/run/schedule.py
WarmupStableDecay), so a branch from step S of N steps is the run `schedule.total_steps: S + N`,
`schedule.decay_fraction: N / (S + N)` resumed from S: its LR at every step, its data order and its state are
those of an independent WSD run of that length, and its losses equal that run's. The branch is that resume, in
its own folder (`<run>/decay/step<S>+<N>/`, its checkpoints and logs; the token shards and tokenizer are the
run's), so the main run goes on untouched; killed, it resumes from its own latest checkpoint; it exports like any
run (`pretrain export --config <branch>/resolved_config.yaml`). `branch.json` in its folder says where it came
from, and the export's card repeats it.

Run it as `pretrain train` runs: alone (a world of one) or under torchrun / `launch run` for more ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import ConfigError
from core.io import atomic_write
from runconfig import RunConfig

BRANCH_FILE = "branch.json"


def branch_folder(cfg: RunConfig, from_step: int, steps: int) -> Path:
    return Path(cfg.run.root) / "decay" / f"step{from_step}+{steps}"


def branch_overrides(cfg: RunConfig, from_step: int, steps: int) -> tuple[list[str], dict]:
    """The overrides that make the run config the branch's, and the branch record; refused in one line when the
    run has no WSD schedule, the step is not a complete stable-phase checkpoint, or the length is not positive."""
    from core.layout import RunPaths
    from pretrain.checkpoint import complete_tags, tag_for

    sc = cfg.schedule
    if sc.decay != "wsd":
        raise ConfigError(
            f"pretrain decay: the run's schedule.decay is {sc.decay}; a decay branch needs schedule.decay: wsd"
        )
    if sc.steps is None:
        raise ConfigError(
            "pretrain decay: a time-budget run (schedule.budget_minutes) has no step to branch at"
        )
    if cfg.run.is_remote:
        raise ConfigError(
            f"pretrain decay: run.output_dir {cfg.run.output_dir} is remote; branch from a local run folder"
        )
    if steps < 1:
        raise ConfigError(f"--steps {steps}: a cool-down needs at least one step")
    start = sc.wsd_decay_start
    if not sc.warmup <= from_step < start:
        where = (
            "in the warmup" if from_step < sc.warmup else f"in the decay phase (it starts at step {start})"
        )
        raise ConfigError(
            f"--from {from_step}: the step is {where}; a branch starts from the stable phase, steps {sc.warmup}-{start - 1}"
        )
    ckpt_dir = RunPaths.from_config(cfg).checkpoints
    tags = complete_tags(ckpt_dir)
    tag = tag_for(from_step)
    if tag not in tags:
        stable = [t for t in tags if sc.warmup <= int(t.removeprefix("step")) < start]
        raise ConfigError(
            f"--from {from_step}: no complete checkpoint {tag} in {ckpt_dir} (stable-phase checkpoints there: "
            f"{', '.join(stable) or 'none'})"
        )
    folder = branch_folder(cfg, from_step, steps)
    own = RunPaths(folder).checkpoints
    resume = "auto" if complete_tags(own) else str(ckpt_dir / tag)  # a killed branch goes on from its own
    total = from_step + steps
    record = {
        "run": str(Path(cfg.run.root).resolve()),
        "from_step": from_step,
        "from_checkpoint": str(ckpt_dir / tag),
        "steps": steps,
        "total_steps": total,
        "decay_shape": sc.wsd_shape,
        "min_lr_ratio": sc.min_lr_ratio,
    }
    overrides = [
        f"run.output_dir={folder}",
        f"run.name={cfg.run.name}-decay-{from_step}+{steps}",
        f"checkpoint.dir={own}",
        f"checkpoint.resume={resume}",
        f"schedule.total_steps={total}",
        f"schedule.decay_fraction={steps / total!r}",
    ]
    return overrides, record


def prepare_branch(cfg: RunConfig, from_step: int, steps: int) -> list[str]:
    """The branch folder (its data links and branch.json) and the overrides its training run takes."""
    from pretrain.tools.ladder import share_data

    overrides, record = branch_overrides(cfg, from_step, steps)
    folder = branch_folder(cfg, from_step, steps)
    share_data(cfg, folder)
    atomic_write(folder / BRANCH_FILE, json.dumps(record, indent=1) + "\n")
    return overrides


def read_branch(run_root: Path) -> dict | None:
    """branch.json of a run folder that is a decay branch, else None."""
    try:
        return json.loads((Path(run_root) / BRANCH_FILE).read_text())
    except (OSError, ValueError):
        return None
