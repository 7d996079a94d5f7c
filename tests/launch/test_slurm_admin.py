"""What a Slurm admin checks in a 4-node x 8-GPU job before accepting it (no Slurm needed): srun gets its CPUs,
the job asks for memory, the rendezvous port is derived from the job id, a dead rank ends the step while the
requeue path stays, the data stages are at most one job each, and the dry run shows the afterok chain."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from launch import slurm
from launch.__main__ import main
from launch.render import Entry
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
MEDIUM = ROOT / "configs" / "gpt2-medium.yaml"
BIG = [
    "launch.launcher=slurm",
    "launch.nodes=4",
    "launch.procs_per_node=8",
    "launch.backend=nccl",
    "launch.slurm.partition=gpu",
]


def big_cfg(tmp_path, *extra):
    return load_config(MEDIUM, [f"run.output_dir={tmp_path}/run", *BIG, *extra])


def srun_line(text: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith("srun ")]
    return line


def test_four_nodes_by_eight_gpus_script(tmp_path):
    cfg = big_cfg(tmp_path, "launch.slurm.mem_per_gpu=80G")
    text = slurm.render_train_script(cfg, Entry.train(MEDIUM))
    header = {x for x in text.splitlines() if x.startswith("#SBATCH ")}
    assert {
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --mem-per-gpu=80G",
    } <= header, sorted(header)
    srun = srun_line(text)
    # Slurm >= 22.05: srun does not inherit --cpus-per-task from sbatch; say it on srun and in the environment.
    # (the allocation's own value, equal to SLURM_CPUS_PER_TASK, which Slurm 23.11+ requires)
    assert '--cpus-per-task="$SRUN_CPUS_PER_TASK"' in srun
    assert 'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-16}"' in text
    assert "--kill-on-bad-exit=1" in srun and "--kill-on-bad-exit=0" not in text
    # The rendezvous port comes from the job id (two jobs sharing a node differ), overridable at submit time.
    assert re.search(
        r"MASTER_PORT=\$\{LMSTACK_MASTER_PORT:-\$\(\(20000 \+ SLURM_JOB_ID % 20000\)\)\}", text
    ), text
    assert '--master_port "$MASTER_PORT"' in text and "29500" not in text
    # The requeue path is still there.
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text and "#SBATCH --requeue" in header
    # The port expression really yields distinct ports in range for neighbouring job ids.
    ports = set()
    for job in (12345, 12346, 99999):
        out = subprocess.run(
            [
                "bash",
                "-c",
                f"SLURM_JOB_ID={job}; unset LMSTACK_MASTER_PORT; "
                + next(x for x in text.splitlines() if x.startswith("MASTER_PORT="))
                + '; echo "$MASTER_PORT"',
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        port = int(out.stdout)
        assert 20000 <= port < 40000
        ports.add(port)
    assert len(ports) == 3
    # An explicit launch.master_port is kept (a site with a fixed open port range).
    fixed = slurm.render_train_script(big_cfg(tmp_path, "launch.master_port=31000"), Entry.train(MEDIUM))
    assert "MASTER_PORT=${LMSTACK_MASTER_PORT:-31000}" in fixed


def test_memory_request_is_typed_and_has_a_default(tmp_path):
    text = slurm.render_train_script(big_cfg(tmp_path), Entry.train(MEDIUM))
    assert "#SBATCH --mem=0\n" in text  # a whole-node GPU job: all of each node's memory, said explicitly
    text = slurm.render_train_script(big_cfg(tmp_path, "launch.slurm.mem=480G"), Entry.train(MEDIUM))
    assert "#SBATCH --mem=480G\n" in text and "--mem-per-gpu" not in text
    with pytest.raises(Exception, match="launch.slurm.mem_per_gpu"):
        big_cfg(tmp_path, "launch.slurm.mem_per_gpu=lots")
    with pytest.raises(Exception, match="mem and launch.slurm.mem_per_gpu"):
        big_cfg(tmp_path, "launch.slurm.mem=100G", "launch.slurm.mem_per_gpu=80G")


def test_data_stages_are_one_job_each_and_dry_run_prints_the_chain(tmp_path, capsys):
    argv = [
        "pipeline-slurm",
        "--config",
        str(MEDIUM),
        f"run.output_dir={tmp_path}/run",
        *BIG,
        "--clean-shards",
        "4",
        "--dry-run",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    scripts = sorted(p.name for p in (tmp_path / "run" / "slurm").glob("*.sbatch"))
    names = [n.removeprefix("gpt2-medium-").removesuffix(".sbatch") for n in scripts]
    assert sorted(names) == sorted(
        [
            "clean",
            "dedup-signatures",
            "dedup-buckets",
            "dedup-components",
            "dedup-filter",
            "prep",
            "tokenize",
            "manifest",
            "train",
        ]
    ), names
    comp = (tmp_path / "run" / "slurm" / "gpt2-medium-dedup-components.sbatch").read_text()
    # Every component round runs inside that one job, in order, each round's tasks before the next round.
    rounds = re.findall(r"run_stage (dedup-components-\S+) (\d+)", comp)
    assert [r for r, _ in rounds][:3] == [
        "dedup-components-L0",
        "dedup-components-large0",
        "dedup-components-small0",
    ]
    assert rounds[-1][0] == "dedup-components-labels" and len(rounds) == 2 + 2 * 12
    assert "--array" not in comp
    # The dry run shows the submission chain with afterok dependencies, in order.
    chain = [x for x in out.splitlines() if "sbatch --parsable" in x]
    assert len(chain) == 9 and "--dependency" not in chain[0]
    for prev, line in zip(chain, chain[1:], strict=False):
        var = prev.split("=", 1)[0]
        assert f"--dependency=afterok:${var}" in line, line
    assert chain[-1].startswith("train=$(sbatch")
    # The chain is runnable shell: with a stub sbatch (no Slurm here) it submits nine jobs in order.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(
        '#!/bin/bash\nn=$(( $(wc -l < "$LOG" 2>/dev/null || echo 0) + 100 ))\n'
        'echo "$n $*" >> "$LOG"\necho "$n"\n'
    )
    (bindir / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    subprocess.run(
        ["bash", "-euc", "\n".join(chain)],
        check=True,
        env={"PATH": f"{bindir}:/usr/bin:/bin", "LOG": str(log)},
    )
    calls = log.read_text().splitlines()
    assert len(calls) == 9 and "--dependency=afterok:107" in calls[8]
