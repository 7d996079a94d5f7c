"""Slurm: sbatch scripts for training (one torchrun per node via srun) and data-stage job arrays, submission
with dependencies, status and cancel.

Preemption path (why the script looks the way it does):
- `--signal=B:USR1@<grace>` signals only the batch shell. Its trap forwards USR1 to srun, which forwards it to
  every process of the step (proctrack signals the whole container), so each rank's handler sees it.
- torchrun would die on USR1 (it only handles TERM/INT/HUP/QUIT by default), taking the step down before the
  checkpoint; the per-node wrapper therefore sets USR1 to ignored before exec'ing torchrun (ignored dispositions
  survive exec; the trainer installs its own handler, which overrides the inherited one).
- The trainer finishes its step, checkpoints and exits 75. Each node's torchrun runs under launch/torchrun.py,
  which exits with the ranks' own code (torchrun itself says 1 for any failure); the script requeues on 75 *or*
  on "we forwarded the preemption signal and the step did not succeed", and never on 65 or 69.
- `scontrol requeue` puts the same job id back in the queue; on restart the trainer auto-resumes from the
  latest complete checkpoint. The script ends with `exit $rc` so a failed step never shows as COMPLETED.
- `srun --kill-on-bad-exit=1`: a rank that dies ends the step at once instead of leaving the other nodes blocked
  in a collective. On preemption every rank exits only after the checkpoint is complete (the trainer's barrier),
  so the kill cannot cut a checkpoint short, and the requeue test above still sees "signalled, not 0".
- srun repeats `--cpus-per-task` (and SRUN_CPUS_PER_TASK is exported): since Slurm 22.05 srun no longer
  inherits it from sbatch, and the node's ranks and loader workers would share one CPU.
- The rendezvous port is derived from the job id on the node (20000 + id % 20000, or $LMSTACK_MASTER_PORT, or
  an explicit launch.master_port), so two jobs sharing a node do not collide.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import LmstackError
from core.exit_codes import PREEMPTED
from core.io import atomic_write
from core.layout import RunPaths
from launch.render import Entry, LaunchError, base_env, python_exe, torchrun_args, workdir
from runconfig import RunConfig


def slurm_dir(cfg: RunConfig) -> Path:
    return Path(cfg.launch.slurm.output_dir or RunPaths(cfg.run.root).slurm).resolve()


def gpu_option(cfg: RunConfig) -> str | None:
    """The training job's GPU request (`--gpus-per-node=N` or `--gres=gpu:N`, as the site prefers), or None."""
    sc, n = cfg.launch.slurm, cfg.launch.gpus_per_node
    if not n:
        return None
    count = f"{sc.gpu_type}:{n}" if sc.gpu_type else str(n)
    return f"--gres=gpu:{count}" if sc.gpu_request == "gres" else f"--gpus-per-node={count}"


def train_cpus(cfg: RunConfig) -> int:
    """CPUs for the one torchrun task per node: every rank gets its own core plus its DataLoader workers."""
    sc = cfg.launch.slurm
    if sc.cpus_per_task is not None:
        return sc.cpus_per_task
    per_rank = sc.cpus_per_rank or 1 + cfg.loader.num_workers
    return per_rank * cfg.launch.procs_per_node


def mem_option(cfg: RunConfig) -> str:
    """The training job's memory request: launch.slurm.mem (per node) or mem_per_gpu; neither: `--mem=0`, all
    of each node's memory, which is what a whole-node GPU job gets anyway, now said explicitly."""
    sc = cfg.launch.slurm
    if sc.mem_per_gpu:
        return f"--mem-per-gpu={sc.mem_per_gpu}"
    return f"--mem={sc.mem or 0}"


def port_expr(cfg: RunConfig) -> str:
    """Shell expression for the rendezvous port: $LMSTACK_MASTER_PORT, else an explicit launch.master_port, else
    one derived from the job id (two jobs sharing a node differ)."""
    lc = cfg.launch
    default = "$((20000 + SLURM_JOB_ID % 20000))" if lc.master_port is None else str(lc.master_port)
    return f"${{LMSTACK_MASTER_PORT:-{default}}}"


def data_partition(cfg: RunConfig) -> str | None:
    """Data stages never land on the GPU partition by default: with GPUs in training they use the cluster's
    default partition unless launch.slurm.data_partition names one."""
    sc = cfg.launch.slurm
    if sc.data_partition:
        return sc.data_partition
    return None if cfg.launch.gpus_per_node else sc.partition


def _sbatch_header(
    cfg: RunConfig,
    job_name: str,
    output: str,
    *,
    nodes: int,
    time: str,
    cpus: int,
    mem: str | None,
    partition: str | None,
    mem_opt: str | None = None,
    gpus: str | None = None,
    constraint: str | None = None,
    array: str | None = None,
    training: bool = False,
) -> list[str]:
    sc = cfg.launch.slurm
    opts = [f"--job-name={job_name}", f"--nodes={nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}"]
    opts.append(f"--time={time}")
    if gpus:
        opts.append(gpus)
    if mem_opt:
        opts.append(mem_opt)
    for flag, val in (
        ("mem", mem),
        ("partition", partition),
        ("account", sc.account),
        ("qos", sc.qos),
        ("nodelist", sc.nodelist if training else None),
        ("exclude", sc.exclude),
        ("constraint", constraint),
    ):
        if val:
            opts.append(f"--{flag}={val}")
    if array:
        opts.append(f"--array={array}")
    opts.append(f"--output={output}")
    if training:
        # Requeued runs append to the same log; the grace signal goes to the batch shell only (B:).
        opts += ["--open-mode=append", f"--signal=B:USR1@{sc.signal_grace_s}"]
        opts.append("--requeue" if sc.requeue else "--no-requeue")
    for extra in [*sc.extra_sbatch, *(sc.extra_sbatch_train if training else [])]:
        opts.append(extra if extra.startswith("-") else f"--{extra}")
    return ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts)]


def _preamble(cfg: RunConfig, strict: bool) -> list[str]:
    lines = ["# shellcheck disable=SC1091  # launch.setup may source files that exist only on the cluster"]
    lines += [
        "set -euo pipefail" if strict else "set -uo pipefail",
        f"cd {shlex.quote(workdir(cfg))} || exit 1",
    ]
    lines += cfg.launch.setup
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(base_env(cfg).items())]
    return lines


def _inner(argv: Sequence[str]) -> str:
    """Quote argv for a shell, leaving "$VAR" tokens to be expanded on the node."""
    return " ".join(f'"{a}"' if re.fullmatch(r"\$\{?\w+\}?", a) else shlex.quote(a) for a in argv)


def node_argv(cfg: RunConfig, entry: Entry) -> list[str]:
    """The torchrun command srun starts once per node; rank and master come from the allocation."""
    return [
        python_exe(cfg),
        "-m",
        "launch.torchrun",
        *torchrun_args(cfg, "$SLURM_NODEID", "$MASTER_ADDR", master_port="$MASTER_PORT"),
        "-m",
        entry.module,
        *entry.args,
    ]


def render_train_script(cfg: RunConfig, entry: Entry, job_name: str | None = None) -> str:
    """The sbatch script for a (multi-node) training job with preemption-safe requeue."""
    lc, sc = cfg.launch, cfg.launch.slurm
    if lc.rdzv != "static":
        # Inside Slurm the node rank is known ($SLURM_NODEID): static rendezvous is exact and has no races.
        cfg = cfg.model_copy(update={"launch": lc.model_copy(update={"rdzv": "static"})})
    name = job_name or cfg.run.name
    out = slurm_dir(cfg) / "%x-%j.out"
    lines = _sbatch_header(
        cfg,
        name,
        str(out),
        nodes=lc.nodes,
        time=sc.time,
        cpus=train_cpus(cfg),
        mem=None,
        mem_opt=mem_option(cfg),
        partition=sc.partition,
        gpus=gpu_option(cfg),
        constraint=sc.constraint,
        training=True,
    )
    cpus = train_cpus(cfg)
    node_cmd = 'trap "" USR1; exec ' + _inner(node_argv(cfg, entry))
    lines += [
        "# Generated by `python -m launch sbatch`. Resubmitting it resumes from the last complete checkpoint.",
        *_preamble(cfg, strict=False),
        "",
        "# Rendezvous on the first node of the allocation, by its NodeAddr (node names need not resolve).",
        'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_ADDR=$(scontrol show node \"$first_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | head -n 1)",
        "MASTER_ADDR=${MASTER_ADDR:-$first_node}",
        "# The port comes from the job id, so two jobs sharing a node do not collide ($LMSTACK_MASTER_PORT wins).",
        f"MASTER_PORT={port_expr(cfg)}",
        "export MASTER_ADDR MASTER_PORT",
        "# Slurm >= 22.05: srun does not inherit --cpus-per-task from sbatch; repeat the allocation's own value",
        "# (equal to SLURM_CPUS_PER_TASK: 23.11+ refuses the two when they differ).",
        f'export SRUN_CPUS_PER_TASK="${{SLURM_CPUS_PER_TASK:-{cpus}}}"',
        'echo "[launch] job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} nodes ${SLURM_JOB_NODELIST} '
        'master ${MASTER_ADDR}:${MASTER_PORT}"',
        "",
        "preempted=0",
        "srun_pid=",
        "# shellcheck disable=SC2317  # invoked by the trap",
        "forward_preemption() {",
        "  preempted=1",
        '  echo "[launch] preemption signal: every rank finishes its step, checkpoints and stops"',
        '  if [ -n "$srun_pid" ]; then kill -USR1 "$srun_pid" 2>/dev/null || true; fi',
        "}",
        "trap forward_preemption USR1",
        "",
        "# One torchrun per node; USR1 is ignored by torchrun itself (it would die) and handled by the ranks.",
        "# shellcheck disable=SC2016  # $SLURM_NODEID / $MASTER_ADDR / $MASTER_PORT expand on each node, not here",
        f"node_cmd={shlex.quote(node_cmd)}",
        f'srun --nodes={lc.nodes} --ntasks-per-node=1 --cpus-per-task="$SRUN_CPUS_PER_TASK" --kill-on-bad-exit=1 '
        f"--wait={sc.step_wait_s} "
        'bash -c "$node_cmd" &',
        "srun_pid=$!",
        'if [ "$preempted" -eq 1 ]; then kill -USR1 "$srun_pid" 2>/dev/null || true; fi',
        "# wait returns early whenever the trap runs; keep waiting until srun itself has exited.",
        "while :; do",
        '  wait "$srun_pid"',
        "  rc=$?",
        '  kill -0 "$srun_pid" 2>/dev/null || break',
        "done",
        'echo "[launch] step exited with ${rc} (preemption signal: ${preempted})"',
    ]
    if sc.requeue:
        lines += [
            f'if [ "$rc" -eq {PREEMPTED} ] || {{ [ "$preempted" -eq 1 ] && [ "$rc" -ne 0 ]; }}; then',
            f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {sc.max_requeues} ]; then',
            '    echo "[launch] requeueing job ${SLURM_JOB_ID}; it resumes from the last complete checkpoint"',
            '    scontrol requeue "$SLURM_JOB_ID"',
            "  else",
            f'    echo "[launch] not requeueing: restarted ${{SLURM_RESTART_COUNT}} times (launch.slurm.max_requeues={sc.max_requeues})"',
            "  fi",
            "fi",
        ]
    lines.append('exit "$rc"')
    return "\n".join(lines) + "\n"


def render_stage_script(
    cfg: RunConfig,
    stage_cmds: list[list[str]],
    job_name: str,
    array_size: int | None = None,
    guard: list[str] | None = None,
) -> str:
    """A data-stage job: one command per line; as an array, `{task}` in a command becomes the task id."""
    sc = cfg.launch.slurm
    array = None
    if array_size is not None:
        if array_size < 1:
            raise LaunchError(f"{job_name}: a job array needs at least one task (got {array_size})")
        array = f"0-{array_size - 1}%{sc.array_concurrency}"
    out = slurm_dir(cfg) / ("%x-%A_%a.out" if array else "%x-%j.out")
    lines = _sbatch_header(
        cfg,
        job_name,
        str(out),
        nodes=1,
        time=sc.data_time or sc.time,
        cpus=sc.data_cpus_per_task or cfg.data.clean.workers,
        mem=sc.data_mem,
        partition=data_partition(cfg),
        constraint=sc.data_constraint,
        array=array,
    )
    lines += ["# Generated by `python -m launch pipeline-slurm`.", *_preamble(cfg, strict=True)]
    if guard and array:
        # The array was sized before the previous stage ran; tasks past the real shard count have nothing to do.
        lines += [
            f"n_shards=$({_inner(guard)})",
            'if [ "$SLURM_ARRAY_TASK_ID" -ge "$n_shards" ]; then',
            '  echo "task ${SLURM_ARRAY_TASK_ID}: the corpus has only ${n_shards} shards, nothing to do"',
            "  exit 0",
            "fi",
        ]
    for cmd in stage_cmds:
        lines.append(_inner(["$SLURM_ARRAY_TASK_ID" if a == "{task}" else a for a in cmd]))
    return "\n".join(lines) + "\n"


def data_stage_cmd(
    cfg: RunConfig, stage: str, config_path: str | os.PathLike[str], overrides: list[str], shard: bool = False
) -> list[str]:
    cmd = [
        python_exe(cfg),
        "-m",
        "data_pipeline",
        stage,
        "--config",
        str(Path(config_path).resolve()),
        *overrides,
    ]
    return [*cmd, "--shard-index", "{task}"] if shard else cmd


def write_script(cfg: RunConfig, text: str, name: str) -> Path:
    folder = slurm_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write(folder / f"{name}.sbatch", text, mode=0o755)


# -- talking to Slurm ----------------------------------------------------------------------------------------


class SlurmError(LmstackError, RuntimeError):
    pass


def _run(cmd: list[str]) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: is this a Slurm login node (or is Slurm on PATH)?") from None
    if res.returncode != 0:
        raise SlurmError(
            f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
        )
    return res.stdout


def sbatch_argv(
    script: str | os.PathLike[str], after: Sequence[str] = (), dependency_type: str = "afterok"
) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if after:
        cmd.append(f"--dependency={dependency_type}:{':'.join(after)}")
        cmd.append("--kill-on-invalid-dep=yes")
    return [*cmd, str(script)]


def submit(
    script: str | os.PathLike[str], after: Sequence[str] = (), dependency_type: str = "afterok"
) -> str:
    """`sbatch --parsable` the script (after the given jobs succeed) and return the job id."""
    out = _run(sbatch_argv(script, after, dependency_type)).strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable printed {out!r}, not a job id")
    return job_id


@dataclass
class JobStatus:
    job_id: str
    state: str
    reason: str
    restarts: int
    exit_code: str

    def line(self) -> str:
        return (
            f"{self.job_id} {self.state} reason={self.reason} restarts={self.restarts} exit={self.exit_code}"
        )


def status(job_id: str) -> list[JobStatus]:
    """State of a job (one entry per array task) from the controller; works without accounting (no sacct)."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    rows = []
    for line in out.splitlines():
        f = dict(re.findall(r"(\w+)=(\S*)", line))
        if not f:
            continue
        jid = f["JobId"] if "ArrayTaskId" not in f else f"{f['ArrayJobId']}_{f['ArrayTaskId']}"
        rows.append(
            JobStatus(
                jid,
                f.get("JobState", "?"),
                f.get("Reason", "?"),
                int(f.get("Restarts", 0) or 0),
                f.get("ExitCode", "?"),
            )
        )
    return rows


def cancel(job_id: str, signal: str | None = None) -> None:
    """scancel; with signal (e.g. USR1) deliver it to the batch shell instead, as a preemption drill."""
    _run(["scancel", *([f"--signal={signal}", "--batch"] if signal else []), str(job_id)])


def submit_train(cfg: RunConfig, entry: Entry, after: Sequence[str] = ()) -> tuple[Path, str]:
    path = write_script(cfg, render_train_script(cfg, entry), f"{cfg.run.name}-train")
    return path, submit(path, after)


def pipeline(
    cfg: RunConfig,
    config_path: str | os.PathLike[str],
    overrides: list[str],
    clean_shards: int,
    tokenize_shards: int,
    submit_jobs: bool = True,
) -> list[tuple[str, Path, str | None]]:
    """clean array -> dedup stage arrays -> dedup report + tokenizer job -> tokenize array -> manifest job ->
    training, chained with afterok.

    Returns [(stage, script, job id or None when only rendered)].
    """
    name = cfg.run.name
    # Dedup's array sizes depend on its partition count: fix it now, for every job of the chain.
    overrides = [*overrides, f"data.dedup.partitions={dedup_partitions(cfg, clean_shards)}"]
    stages: list[tuple[str, str]] = [
        (
            "clean",
            render_stage_script(
                cfg,
                [data_stage_cmd(cfg, "clean", config_path, overrides, True)],
                f"{name}-clean",
                clean_shards,
            ),
        ),
        *dedup_array_stages(cfg, config_path, overrides, clean_shards),
        # All dedup tasks are done by now: `dedup` only merges their stats and marks dedup/ complete.
        (
            "dedup+tokenizer",
            render_stage_script(
                cfg,
                [data_stage_cmd(cfg, s, config_path, overrides) for s in ("dedup", "train-tokenizer")],
                f"{name}-prep",
            ),
        ),
        (
            "tokenize",
            render_stage_script(
                cfg,
                [data_stage_cmd(cfg, "tokenize", config_path, overrides, True)],
                f"{name}-tokenize",
                tokenize_shards,
                guard=[
                    python_exe(cfg),
                    "-m",
                    "launch",
                    "corpus-shards",
                    "--config",
                    str(Path(config_path).resolve()),
                    *overrides,
                ],
            ),
        ),
        # A whole-corpus tokenize pass reuses every finished shard and writes the manifest the loader reads.
        (
            "manifest",
            render_stage_script(
                cfg, [data_stage_cmd(cfg, "tokenize", config_path, overrides)], f"{name}-manifest"
            ),
        ),
        ("train", render_train_script(cfg, Entry.train(config_path, overrides), f"{name}-train")),
    ]
    out: list[tuple[str, Path, str | None]] = []
    prev: str | None = None
    for stage, text in stages:
        path = write_script(cfg, text, f"{name}-{_file_stem(stage)}")
        job = submit(path, [prev] if prev else ()) if submit_jobs else None
        out.append((stage, path, job))
        prev = job
    return out


def _file_stem(stage: str) -> str:
    """Script file name of a pipeline stage (the dedup report + tokenizer job is `prep`, as its job name)."""
    return "prep" if stage == "dedup+tokenizer" else stage


def dedup_partitions(cfg: RunConfig, clean_shards: int) -> int:
    """data.dedup.partitions, or an estimate from the clean plan (the corpus does not exist yet)."""
    dd = cfg.data.dedup
    return dd.partitions or max(1, -(-clean_shards * cfg.data.clean.docs_per_shard // dd.docs_per_partition))


def dedup_array_stages(
    cfg: RunConfig, config_path: str | os.PathLike[str], overrides: list[str], clean_shards: int
) -> list[tuple[str, str]]:
    """At most one job per dedup stage: signatures, buckets and filter are job arrays (task i runs
    `python -m data_pipeline dedup --stage S --task-index i`, retried in-process data.task_retries times);
    the connected-components steps (L0, every large/small-star round, labels) need a barrier between steps,
    so they run in order inside one job, each step's tasks side by side on the job's CPUs."""
    from data_pipeline.dedup.stages import plan_shapes

    shapes = plan_shapes(cfg, clean_shards, dedup_partitions(cfg, clean_shards))
    task_cmd = [*data_stage_cmd(cfg, "dedup", config_path, overrides), "--stage"]
    out: list[tuple[str, str]] = []
    components = [(stage, n) for stage, n in shapes if stage.startswith("dedup-components-")]
    for stage, n in shapes:
        if stage.startswith("dedup-components-"):
            if stage == components[0][0]:
                out.append(("dedup-components", _components_script(cfg, task_cmd, components)))
            continue
        cmd = [*task_cmd, stage, "--task-index", "{task}"]
        out.append((stage, render_stage_script(cfg, [cmd], f"{cfg.run.name}-{stage}", n)))
    return out


def _components_script(cfg: RunConfig, task_cmd: list[str], steps: list[tuple[str, int]]) -> str:
    """One job for every connected-components step: `run_stage S N` runs tasks 0..N-1 of step S, up to the
    job's CPU count at once, and fails the job if any task fails (finished tasks are skipped on a rerun)."""
    text = render_stage_script(cfg, [], f"{cfg.run.name}-dedup-components")
    lines = [
        "run_stage() {",
        '  seq 0 $(( $2 - 1 )) | xargs -P "${SLURM_CPUS_PER_TASK:-1}" -I{} '
        + _inner(task_cmd)
        + ' "$1" --task-index {}',
        "}",
        *(f"run_stage {stage} {n}" for stage, n in steps),
    ]
    return text + "\n".join(lines) + "\n"


def chain_lines(jobs: Sequence[tuple[str, Path, str | None]]) -> list[str]:
    """The submission chain as shell lines (what `pipeline` runs through `submit`): each job waits for the
    previous one with afterok. Printed by the dry run; runnable as it is."""
    lines, prev = [], None
    for stage, path, _ in jobs:
        var = re.sub(r"\W", "_", _file_stem(stage).removeprefix("dedup-"))
        after = [f"${prev}"] if prev else []
        argv = sbatch_argv(path, after)
        lines.append(f"{var}=$(" + " ".join([*argv[:-1], shlex.quote(argv[-1])]) + ")")
        prev = var
    return lines
