"""sbatch job-array script for a data stage (clean, tokenize): one array task per work shard.

`render_array_script(cfg, stage, num_tasks)` returns the script text; task i runs
`python -m data_pipeline <stage> --config ... --shard-index $SLURM_ARRAY_TASK_ID`. At most
`launch.slurm.array_concurrency` tasks run at once (`--array=0-(N-1)%C`). Shards that finished before
(completion markers) are skipped by a rerun, so resubmitting the array after failures is safe; with
`launch.slurm.requeue` a preempted task is requeued by Slurm and redoes only its own shard.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import yaml

STAGES = ("clean", "tokenize")


def render_array_script(cfg, stage: str, num_tasks: int, config_path: str | None = None,
                        overrides: list[str] | tuple[str, ...] = (), python: str | None = None,
                        workdir: str | None = None) -> str:
    """The sbatch script text.

    Without `config_path` the fully resolved config is embedded in the script (written next to the job log
    at run time), so the job runs exactly the config it was rendered from even if the YAML changes later.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES} (got {stage!r}); dedup is one global job")
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1 (got {num_tasks})")
    sc = cfg.launch.slurm
    log_dir = sc.output_dir or f"{cfg.run.root}/slurm"
    name = f"{cfg.run.name}-{stage}"
    # data_* size data tasks apart from training jobs; a data task never lands on the GPU partition by default.
    cpus = sc.data_cpus_per_task or 1
    time_limit = sc.data_time or sc.time
    mem = sc.data_mem
    partition = sc.data_partition or (None if cfg.launch.gpus_per_node else sc.partition)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --array=0-{num_tasks - 1}%{sc.array_concurrency}",
             "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={cpus}", f"#SBATCH --time={time_limit}",
             f"#SBATCH --output={log_dir}/%x-%A_%a.out", "#SBATCH --open-mode=append"]
    for opt, val in (("partition", partition), ("account", sc.account), ("qos", sc.qos), ("mem", mem)):
        if val:
            lines.append(f"#SBATCH --{opt}={val}")
    if sc.requeue:
        lines.append("#SBATCH --requeue")
    lines += [f"#SBATCH {x}" if not x.startswith("#SBATCH") else x for x in sc.extra_sbatch]
    py = python or sys.executable
    body = ["", "set -euo pipefail", f"cd {shlex.quote(workdir or str(Path.cwd()))}", f"mkdir -p {shlex.quote(log_dir)}"]
    if config_path is None:
        cfg_file = f"{log_dir}/{name}-${{SLURM_ARRAY_JOB_ID}}.config.yaml"
        dumped = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
        body += [f'CFG="{cfg_file}"', "cat > \"$CFG\" <<'LMSTACK_CONFIG_EOF'", dumped.rstrip("\n"), "LMSTACK_CONFIG_EOF"]
        cfg_arg = '"$CFG"'
        ov = ""
    else:
        cfg_arg = shlex.quote(config_path)
        ov = "".join(" " + shlex.quote(o) for o in overrides)
    # One worker per task: the array provides the parallelism; progress bars only clutter job logs.
    body.append(f"exec {shlex.quote(py)} -m data_pipeline {stage} --config {cfg_arg}{ov} "
                f"data.clean.workers=1 data.clean.progress=false --shard-index \"$SLURM_ARRAY_TASK_ID\"")
    return "\n".join(lines + body) + "\n"
