"""`python -m launch`: turn a run config into a running (multi-node / Slurm) training job.

run             render and execute for launch.launcher (torchrun | deepspeed | slurm); --dry-run prints
                exactly what runs on every node
sbatch          write the Slurm batch script; --submit submits it (sbatch --parsable) and prints the job id
status JOB      job state, reason, restart count (works without Slurm accounting)
cancel JOB      scancel (or --signal USR1: a preemption drill: checkpoint, requeue, resume)
pipeline-slurm  clean array -> dedup stage arrays -> tokenizer -> tokenize array -> train, chained with
                --dependency=afterok
pipeline-ray    clean -> dedup stages -> tokenizer -> tokenize, every task on a Ray cluster
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any

from core.process import dies_with_this_process, supervise
from launch import render, slurm
from launch.render import Entry, LaunchError, NodeCommand
from runconfig.cli import Command, config_from_args, dispatch, run_cli


def _describe(cfg) -> str:
    lc = cfg.launch
    return (
        f"# launcher={lc.launcher} nodes={lc.nodes} procs_per_node={lc.procs_per_node} "
        f"world_size={lc.world_size} backend={lc.backend} rdzv={lc.rdzv}"
    )


def dry_run_text(cfg, entry: Entry, node_rank: int | None = None, all_nodes: bool = False) -> str:
    """Exactly what `run` would execute, node by node (for Slurm: the batch script and each node's srun task):
    with `node_rank`, that node's command only; with `all_nodes`, the ssh command that starts each node."""
    lines = [_describe(cfg)]
    if cfg.launch.launcher == "slurm":
        lines.append(f"# sbatch script ({slurm.slurm_dir(cfg)}/{cfg.run.name}-train.sbatch):")
        lines.append(slurm.render_train_script(cfg, entry).rstrip())
        for rank in range(cfg.launch.nodes):
            argv = [a.replace("$SLURM_NODEID", str(rank)) for a in slurm.node_argv(cfg, entry)]
            lines.append(
                f"# node {rank} (srun task, SLURM_NODEID={rank}; MASTER_ADDR = first node's NodeAddr):"
            )
            lines.append(NodeCommand(rank, "", argv, render.base_env(cfg)).shell())
        return "\n".join(lines)
    cmds = render.node_commands(cfg, entry)
    if node_rank is not None and not all_nodes:
        cmds = [c for c in cmds if c.node_rank == min(node_rank, len(cmds) - 1)]
    for c in cmds:
        lines.append(f"# node {c.node_rank} ({c.host}){' over ssh' if all_nodes else ''}:")
        lines.append(shlex.join(render.ssh_command(c, cfg)) if all_nodes else c.shell())
    if cfg.launch.launcher == "deepspeed" and cfg.launch.nodes > 1:
        lines.append(f"# {render.deepspeed_env_file(cfg)} (DS_ENV_FILE, exported to every remote rank):")
        lines += [f"#   {k}={v}" for k, v in sorted(render.base_env(cfg).items())]
    return "\n".join(lines)


def cmd_run(args) -> int:
    cfg = config_from_args(args)
    if args.node_rank is not None:
        cfg.launch.node_rank = args.node_rank
    entry = Entry.train(args.config, args.overrides)
    if args.all_nodes and not cfg.launch.hostfile and cfg.launch.launcher != "slurm":
        raise LaunchError(
            "launch.hostfile: --all-nodes starts every node over ssh and needs their host names"
        )
    if args.dry_run:
        print(dry_run_text(cfg, entry, args.node_rank, args.all_nodes))
        return 0
    if cfg.launch.launcher == "slurm":
        path, job = slurm.submit_train(cfg, entry)
        print(f"submitted {path} as job {job}", file=sys.stderr)
        print(job)
        return 0
    cmds = render.node_commands(cfg, entry)
    if cfg.launch.launcher == "deepspeed" and cfg.launch.nodes > 1:
        render.write_deepspeed_env(cfg)
    if args.all_nodes:
        render.check_hosts_reachable(cfg, [c.host for c in cmds])
    elif (
        cfg.launch.launcher == "deepspeed" and cfg.launch.nodes > 1 and cfg.launch.multinode_runner == "pdsh"
    ):
        render.check_hosts_reachable(cfg, render.resolve_hosts(cfg)[0])
    elif cfg.launch.launcher == "torchrun" and cfg.launch.nodes > 1 and cfg.launch.node_rank > 0:
        render.wait_for_master(cfg, render.resolve_hosts(cfg)[1])
    # before the chdir: a relative run folder is relative to here
    ckpt_dir = os.path.abspath(cfg.checkpoint_dir)
    os.chdir(render.workdir(cfg))
    if args.all_nodes:
        argvs = [(render.ssh_command(c, cfg), None) for c in cmds]
    else:
        mine = next(c for c in cmds if c.node_rank == min(cfg.launch.node_rank, len(cmds) - 1))
        argvs = [(mine.argv, mine.env)]
    for argv, _ in argvs:
        print("[launch] " + " ".join(argv), file=sys.stderr)
    # torchrun gives each rank OMP_NUM_THREADS=1 when it is unset, with a five-line banner saying so: the same
    # value set here, silently; one from the shell or launch.env wins.
    omp = {"OMP_NUM_THREADS": "1"} if cfg.launch.launcher == "torchrun" else {}
    # torchrun (or ssh, the DeepSpeed launcher) gets SIGTERM when this process dies, even by SIGKILL, and shuts its
    # ranks down (they checkpoint at the step end): nothing goes on training, holding the port and the run folder.
    procs = [
        subprocess.Popen(argv, env={**omp, **os.environ, **(env or {})}, preexec_fn=dies_with_this_process())
        for argv, env in argvs
    ]
    # Ranks are torchrun's children; the DeepSpeed launcher has one more process (launcher.launch) in between.
    # Over ssh / pdsh the remote ranks are out of reach: the local client gets the signal.
    remote = args.all_nodes or (cfg.launch.launcher == "deepspeed" and cfg.launch.nodes > 1)
    depth = 0 if remote else (2 if cfg.launch.launcher == "deepspeed" else 1)
    return supervise(procs, depth, ckpt_dir)


def cmd_sbatch(args) -> int:
    cfg = config_from_args(args)
    entry = Entry.train(args.config, args.overrides)
    text = slurm.render_train_script(cfg, entry)
    path = slurm.write_script(cfg, text, f"{cfg.run.name}-train")
    if args.print:
        print(text, end="")
    if args.submit:
        job = slurm.submit(path, args.after or ())
        print(f"submitted {path} as job {job}", file=sys.stderr)
        print(job)
    elif not args.print:
        print(path)
    return 0


def cmd_status(args) -> int:
    rows = slurm.status(args.job_id)
    for r in rows:
        print(r.line())
    return 0 if rows else 1


def cmd_cancel(args) -> int:
    slurm.cancel(args.job_id, args.signal)
    print(f"{'signalled ' + args.signal + ' to' if args.signal else 'cancelled'} job {args.job_id}")
    return 0


def cmd_pipeline(args) -> int:
    cfg = config_from_args(args)
    clean_n = args.clean_shards or _default_clean_shards(cfg)
    # The corpus after cleaning (and dedup) has at most as many shards as the clean plan; tasks past the real
    # count exit early, so the array can be submitted before cleaning has run.
    tok_n = args.tokenize_shards or clean_n
    jobs = slurm.pipeline(cfg, args.config, args.overrides, clean_n, tok_n, submit_jobs=not args.dry_run)
    for stage, path, job in jobs:
        print(f"{stage:16s} {job or '(not submitted)':>16s}  {path}")
        if args.dry_run:
            print(path.read_text())
    if args.dry_run:
        print(
            "# submission chain (each job starts only after the previous one succeeded; runnable as it is):"
        )
        print("\n".join(slurm.chain_lines(jobs)))
    return 0


def cmd_corpus_shards(args) -> int:
    """How many final corpus shards exist (the tokenize array's real size; extra tasks exit early)."""
    from data_pipeline.shards import corpus_shards

    print(sum(len(v) for v in corpus_shards(config_from_args(args)).values()))
    return 0


def _default_clean_shards(cfg) -> int:
    """Array size for cleaning: the cleaning stage's own shard plan when it offers one."""
    try:
        from data_pipeline import clean  # the cleaning engineer's module; optional API

        for name in ("num_shards", "num_input_shards"):
            fn = getattr(clean, name, None)
            if fn is not None:
                n = fn(cfg)
                return n if isinstance(n, int) else len(n)
    except ImportError:
        pass
    raise SystemExit("error: pass --clean-shards N (the data pipeline does not report its input shard count)")


def cmd_pipeline_ray(args) -> int:
    """clean -> dedup stages -> tokenizer -> tokenize, every task on a Ray cluster (data.executor=ray)."""
    from data_pipeline.stage_tasks import run_data_path

    cfg = config_from_args(args)
    cfg.data.executor = "ray"
    if args.address:
        cfg.data.ray.address = args.address
    out = run_data_path(cfg)
    print(
        json.dumps(
            {k: out[k] for k in ("executor", "seconds")}
            | {
                "kept": out["dedup"]["kept"],
                "tokens": out["tokenize"].get("totals"),
                "manifest": out["tokenize"].get("manifest"),
            },
            indent=1,
            default=str,
        )
    )
    return 0


def _local_pipeline(args: argparse.Namespace) -> int:
    from launch.pipeline import run_demo

    run_demo(config_from_args(args))
    return 0


# The packages whose import registers the built-in implementations.
IMPLEMENTATIONS = (
    "data_pipeline.executors",
    "data_pipeline.filters",
    "data_pipeline.objectives",
    "data_pipeline.readers",
    "data_pipeline.tokenizers",
    "pretrain.families",
    "pretrain.objectives",
)


def registry_listing() -> dict[str, dict[str, Any]]:
    """Every registry with its entries: the top floor imports every implementation, so the listing shows the
    built-ins complete (data spec and implementation) beside what outside packages add through entry points."""
    import importlib

    from core.registry import REGISTRIES

    for module in IMPLEMENTATIONS:
        importlib.import_module(module)  # each registers its built-ins

    def origin(obj: Any) -> str:
        impl = getattr(obj, "build_config", None) or getattr(obj, "build_collator", None) or obj
        return getattr(impl, "__module__", None) or type(impl).__module__

    return {
        name: {
            "key": reg.key,
            "entry_point_group": reg.group,
            "description": reg.description,
            "entries": {n: origin(obj) for n, obj in reg.items()},
        }
        for name, reg in REGISTRIES.items()
    }


def cmd_registry(args: argparse.Namespace) -> int:
    listing = registry_listing()
    if args.json:
        print(json.dumps(listing, indent=1))
        return 0
    for name, reg in listing.items():
        print(f"{name} ({reg['key']}; entry points: {reg['entry_point_group']}): {reg['description']}")
        for entry, module in reg["entries"].items():
            print(f"  {entry:<24} {module}")
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run", action="store_true", help="print exactly what runs on every node, run nothing"
    )
    p.add_argument("--node-rank", type=int, default=None, help="torchrun multi-node: which node this is")
    p.add_argument("--all-nodes", action="store_true", help="torchrun multi-node: start every node over ssh")


def _sbatch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--submit", action="store_true", help="sbatch --parsable it and print the job id")
    p.add_argument("--print", action="store_true", help="print the script")
    p.add_argument("--after", nargs="*", help="start only after these job ids succeed (afterok)")


def _job_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id")


def _cancel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id")
    p.add_argument("--signal", default=None, help="send this signal to the batch shell instead of cancelling")


def _pipeline_slurm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clean-shards", type=int, default=None, help="clean array size (input shards)")
    p.add_argument("--tokenize-shards", type=int, default=None, help="tokenize array size (default: clean's)")
    p.add_argument("--dry-run", action="store_true", help="write and print the scripts, submit nothing")


def _pipeline_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        default=None,
        help="Ray address (auto | host:port | ray://host:10001 | local); default data.ray.address",
    )


def _registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


COMMANDS = (
    Command(
        "run",
        "render and execute for launch.launcher (--dry-run: print every node's command)",
        cmd_run,
        _run_args,
    ),
    Command("sbatch", "write the training sbatch script; --submit to submit it", cmd_sbatch, _sbatch_args),
    Command("status", "state of a Slurm job (and its array tasks)", cmd_status, _job_id, config=False),
    Command(
        "cancel",
        "cancel a Slurm job, or --signal USR1 to rehearse preemption",
        cmd_cancel,
        _cancel_args,
        config=False,
    ),
    Command(
        "pipeline-slurm",
        "data-stage job arrays -> training, chained with afterok",
        cmd_pipeline,
        _pipeline_slurm_args,
    ),
    Command(
        "pipeline-ray",
        "the data path (clean, dedup stages, tokenizer, tokenize) as tasks on a Ray cluster "
        "(data.ray.address)",
        cmd_pipeline_ray,
        _pipeline_ray_args,
    ),
    Command(
        "pipeline",
        "every stage on this machine: data -> pretrain -> export -> fine-tune (what `make demo` runs)",
        _local_pipeline,
    ),
    Command(
        "registry",
        "list what every registry holds (families, objectives, filters, readers, executors, "
        "tokenizer conventions), built-ins and outside packages' entry points",
        cmd_registry,
        _registry_args,
        config=False,
    ),
    Command(
        "corpus-shards",
        "print the number of final corpus shards (used by the tokenize array)",
        cmd_corpus_shards,
    ),
)


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda a: dispatch("python -m launch", __doc__, COMMANDS, a), argv)


if __name__ == "__main__":
    sys.exit(main())
