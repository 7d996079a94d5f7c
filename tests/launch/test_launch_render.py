"""Rendering: what each launcher runs on every node, the sbatch scripts (bash -n + shellcheck), the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.net import free_port
from launch import render, slurm
from launch.__main__ import dry_run_text, main
from launch.render import Entry, LaunchError
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "roberta-tiny.yaml"


def cfg_with(tmp_path, *overrides):
    return load_config(TINY, [f"run.output_dir={tmp_path}/run", *overrides])


def entry():
    return Entry.train(TINY, ["schedule.total_steps=20"])


def test_torchrun_single_node(tmp_path):
    cfg = cfg_with(tmp_path, "launch.procs_per_node=2", "launch.env={NCCL_DEBUG: INFO}")
    (cmd,) = render.node_commands(cfg, entry())
    a = cmd.argv
    assert a[1:3] == ["-m", "launch.torchrun"]
    assert a[a.index("--nproc_per_node") + 1] == "2" and a[a.index("--nnodes") + 1] == "1"
    # The trainer and its arguments come last, untouched.
    assert a[a.index("-m", 3) :] == [
        "-m",
        "pretrain",
        "train",
        "--config",
        str(TINY),
        "schedule.total_steps=20",
    ]
    assert cmd.env["NCCL_DEBUG"] == "INFO" and cmd.env[render.SHUTDOWN_TIMEOUT_ENV] == "120"
    assert cmd.shell().startswith("env NCCL_DEBUG=INFO ")


def test_hostfile_multinode_torchrun(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\ngpu-a slots=4\ngpu-b slots=4  # second\n\n")
    cfg = cfg_with(
        tmp_path,
        f"launch.hostfile={hf}",
        "launch.nodes=2",
        "launch.procs_per_node=4",
        "batch.micro_batch_size=4",
    )
    cmds = render.node_commands(cfg, entry())
    assert [(c.node_rank, c.host) for c in cmds] == [(0, "gpu-a"), (1, "gpu-b")]
    for c in cmds:
        a = c.argv
        assert a[a.index("--node_rank") + 1] == str(c.node_rank)
        assert a[a.index("--master_addr") + 1] == "gpu-a"  # first host is the master
    ssh = render.ssh_command(cmds[1], cfg)
    assert (
        ssh[:7] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", "gpu-b"]
        and "--node_rank 1" in ssh[7]
    )


@pytest.mark.parametrize(
    "text,overrides,msg",
    [
        (
            "a slots=2\nb slots=2\nc slots=2\n",
            ["launch.nodes=2", "launch.procs_per_node=2"],
            "launch.nodes=3",
        ),
        ("a slots=2\nb slots=1\n", ["launch.nodes=2", "launch.procs_per_node=2"], "slots= of ['b']"),
        ("a slots=two\n", [], "expected 'hostname slots=N'"),
        ("a slots=1\na slots=1\n", ["launch.nodes=2", "launch.procs_per_node=1"], "listed twice"),
        ("# nothing\n", [], "lists no hosts"),
    ],
)
def test_bad_hostfiles_name_the_problem(tmp_path, text, overrides, msg):
    hf = tmp_path / "hosts"
    hf.write_text(text)
    cfg = cfg_with(tmp_path, f"launch.hostfile={hf}", *overrides)
    with pytest.raises(LaunchError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        render.node_commands(cfg, entry())


def test_c10d_rendezvous_marks_the_store_host(tmp_path):
    cfg = cfg_with(
        tmp_path,
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.rdzv=c10d",
        "launch.master_addr=10.0.0.1",
        "launch.local_addr=10.0.0.2",
    )
    cmds = render.node_commands(cfg, entry())
    confs = [c.argv[c.argv.index("--rdzv_conf") + 1] for c in cmds]
    assert confs == ["is_host=1,join_timeout=600", "is_host=0,join_timeout=600"]
    assert all(c.argv[c.argv.index("--rdzv_endpoint") + 1] == "10.0.0.1:29500" for c in cmds)
    assert all("--node_rank" not in c.argv and "--local_addr" in c.argv for c in cmds)


def test_deepspeed_launcher(tmp_path):
    (single,) = render.node_commands(cfg_with(tmp_path, "launch.launcher=deepspeed"), entry())
    assert single.argv[1:3] == ["-m", "deepspeed.launcher.runner"] and "--module" in single.argv
    assert "--no_local_rank" in single.argv  # the trainer takes LOCAL_RANK from the environment
    assert single.argv[single.argv.index("--num_gpus") + 1] == "2"
    hf = tmp_path / "hosts"
    hf.write_text("a slots=2\nb slots=2\n")
    cfg = cfg_with(
        tmp_path,
        "launch.launcher=deepspeed",
        f"launch.hostfile={hf}",
        "launch.nodes=2",
        "launch.env={GLOO_SOCKET_IFNAME: eth1}",
    )
    (multi,) = render.node_commands(cfg, entry())
    assert multi.argv[multi.argv.index("--launcher") + 1] == "pdsh"
    assert multi.argv[multi.argv.index("--master_addr") + 1] == "a"
    # Remote ranks get the pass-through env through DS_ENV_FILE (an absolute path DeepSpeed joins as-is).
    env_file = render.write_deepspeed_env(cfg)
    assert multi.env["DS_ENV_FILE"] == str(env_file) and "GLOO_SOCKET_IFNAME=eth1\n" in env_file.read_text()
    with pytest.raises(LaunchError, match="needs a hostfile"):
        render.node_commands(cfg_with(tmp_path, "launch.launcher=deepspeed", "launch.nodes=2"), entry())


def test_node_rank_and_gpus_must_fit():
    with pytest.raises(Exception, match="launch.node_rank"):
        load_config(TINY, ["launch.nodes=2", "launch.node_rank=2"])
    with pytest.raises(Exception, match="exceeds launch.slurm.gpus_per_node"):
        load_config(TINY, ["launch.procs_per_node=4", "launch.slurm.gpus_per_node=2"])


def _check_script(path: Path) -> None:
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (launch/ci_setup.sh installs it)")
    res = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_train_sbatch_script(tmp_path):
    cfg = cfg_with(
        tmp_path,
        "launch.launcher=slurm",
        "launch.nodes=2",
        "launch.procs_per_node=1",
        "launch.slurm.partition=gpu",
        "launch.slurm.account=proj",
        "launch.slurm.qos=high",
        "launch.slurm.gpus_per_node=8",
        "launch.slurm.mem=64G",
        "launch.slurm.signal_grace_s=300",
        "launch.slurm.extra_sbatch_train=[--exclusive]",
        "launch.setup=['source /opt/venv/bin/activate']",
        "launch.env={NCCL_IB_DISABLE: '1'}",
    )
    text = slurm.render_train_script(cfg, entry())
    for opt in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--gpus-per-node=8",
        "--mem=64G",
        "--signal=B:USR1@300",
        "--requeue",
        "--exclusive",
        f"--output={tmp_path}/run/slurm/%x-%j.out",
    ):
        assert f"#SBATCH {opt}\n" in text, opt
    assert "source /opt/venv/bin/activate\n" in text and "export NCCL_IB_DISABLE=1\n" in text
    assert '--node_rank "$SLURM_NODEID" --master_addr "$MASTER_ADDR"' in text
    assert 'trap "" USR1; exec ' in text and "trap forward_preemption USR1" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text and text.rstrip().endswith('exit "$rc"')
    _check_script(slurm.write_script(cfg, text, "train"))

    no_requeue = slurm.render_train_script(cfg_with(tmp_path, "launch.slurm.requeue=false"), entry())
    assert "#SBATCH --no-requeue" in no_requeue and "scontrol requeue" not in no_requeue


def test_stage_array_scripts(tmp_path):
    cfg = cfg_with(tmp_path, "launch.slurm.array_concurrency=2", "launch.slurm.data_time=00:10:00")
    pipe = slurm.pipeline(
        cfg, TINY, ["data.clean.workers=1"], clean_shards=4, tokenize_shards=3, submit_jobs=False
    )
    dedup = ["dedup-signatures", "dedup-buckets", "dedup-components", "dedup-filter"]
    assert [s for s, _, job in pipe] == ["clean", *dedup, "dedup+tokenizer", "tokenize", "manifest", "train"]
    assert all(job is None for _, _, job in pipe)
    # One array per dedup stage, sized from the clean plan (4 shards) and the fixed partition count (1); the
    # component steps (L0, 12 large/small rounds, labels) run in order inside one job.
    arrays = {s: path.read_text() for s, path, _ in pipe if s.startswith("dedup-")}
    for stage, n in zip(["dedup-signatures", "dedup-buckets", "dedup-filter"], [4, 14 + 1, 4], strict=True):
        assert f"#SBATCH --array=0-{n - 1}%2\n" in arrays[stage], stage
        assert "dedup --config" in arrays[stage] and f"--stage {stage} --task-index " in arrays[stage]
        assert '"$SLURM_ARRAY_TASK_ID"' in arrays[stage] and "data.dedup.partitions=1" in arrays[stage]
    comp = arrays["dedup-components"]
    steps = [f"dedup-components-{k}{r}" for r in range(12) for k in ("large", "small")]  # component_rounds
    assert "--array" not in comp and "data.dedup.partitions=1" in comp
    assert [x for x in comp.splitlines() if x.startswith("run_stage ")] == [
        "run_stage dedup-components-L0 2",
        *(f"run_stage {s} 1" for s in steps),
        "run_stage dedup-components-labels 1",
    ]
    every = list(pipe)
    pipe = pipe[:1] + pipe[1 + len(dedup) :]
    clean = pipe[0][1].read_text()
    assert "#SBATCH --array=0-3%2\n" in clean and "#SBATCH --time=00:10:00\n" in clean
    assert '--shard-index "$SLURM_ARRAY_TASK_ID"' in clean and "data.clean.workers=1" in clean
    tok = pipe[2][1].read_text()
    assert "#SBATCH --array=0-2%2\n" in tok and "n_shards=$(" in tok and "corpus-shards" in tok
    assert "--shard-index" not in pipe[3][1].read_text()
    prep = pipe[1][1].read_text()
    assert "--array" not in prep and " dedup " in prep and " train-tokenizer " in prep
    with pytest.raises(LaunchError, match="at least one task"):
        slurm.render_stage_script(cfg, [["true"]], "x", array_size=0)
    for _, path, _ in every:  # the dedup jobs (arrays and the components job) too
        _check_script(path)
    with pytest.raises(LaunchError, match="at least one task"):
        slurm.render_stage_script(cfg, [["true"]], "x", array_size=0)


def test_launch_scripts_pass_shellcheck():
    scripts = sorted((ROOT / "launch").glob("*.sh"))
    assert scripts, "launch/ has shell scripts to check"
    for s in scripts:
        _check_script(s)


def test_cli_help_and_dry_run(tmp_path, capsys):
    res = subprocess.run([sys.executable, "-m", "launch", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0
    for sub in ("run", "sbatch", "status", "cancel", "pipeline-slurm", "pipeline-ray"):
        assert sub in res.stdout
    assert (
        main(
            [
                "run",
                "--config",
                str(TINY),
                "--dry-run",
                f"run.output_dir={tmp_path}/r",
                "launch.launcher=slurm",
                "launch.nodes=2",
                "launch.procs_per_node=1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "# node 0 (srun task" in out and "# node 1 (srun task" in out and "--node_rank 1" in out
    cfg = cfg_with(tmp_path, "launch.nodes=2", "launch.procs_per_node=1", "launch.master_addr=10.1.1.1")
    text = dry_run_text(cfg, entry())
    assert text.count("-m launch.torchrun") == 2 and "--master_addr 10.1.1.1" in text


def test_multinode_without_hostfile_never_silently_uses_loopback(tmp_path, capsys):
    """launch.nodes > 1 with the default master 127.0.0.1 and no hostfile is refused, naming the keys to set."""
    base = [
        "run",
        "--config",
        str(TINY),
        "--dry-run",
        f"run.output_dir={tmp_path}/r",
        "launch.nodes=2",
        "launch.procs_per_node=1",
    ]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "launch.master_addr: launch.nodes=2 without a hostfile would rendezvous at 127.0.0.1" in err
    assert "launch.hostfile" in err
    # Set explicitly (a one-box rehearsal): allowed, with a warning.
    assert main([*base, "launch.master_addr=127.0.0.1"]) == 0
    assert "[launch] warning: launch.master_addr=127.0.0.1 with launch.nodes=2" in capsys.readouterr().err
    # --all-nodes has no host names to ssh to without a hostfile.
    assert (
        main(
            [
                "run",
                "--config",
                str(TINY),
                f"run.output_dir={tmp_path}/r",
                "launch.nodes=2",
                "launch.procs_per_node=1",
                "launch.master_addr=10.0.0.1",
                "--all-nodes",
            ]
        )
        == 2
    )
    assert "--all-nodes starts every node over ssh" in capsys.readouterr().err


def test_cli_reports_bad_hostfile(tmp_path, capsys):
    rc = main(["run", "--config", str(TINY), "--dry-run", f"launch.hostfile={tmp_path}/missing"])
    assert rc == 2 and "launch.hostfile: file not found" in capsys.readouterr().err


SUPERVISE = r"""
import os, signal, subprocess, sys, threading, time
from core.process import supervise as _supervise
child = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75 if len(sys.argv) < 2 else 0))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"] + sys.argv[1:], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
sys.exit(_supervise([child]))
"""


@pytest.mark.parametrize("extra,expected", [([], 75), (["clean-exit"], 0)])
def test_supervisor_forwards_preemption_and_reports_75(extra, expected):
    """`launch run` turns a preemption signal into TERM for torchrun and exits 75 unless the job ended cleanly."""
    res = subprocess.run([sys.executable, "-c", SUPERVISE, *extra], cwd=ROOT, timeout=60)
    assert res.returncode == expected


@pytest.mark.timeout(60)
def test_dry_run_prints_what_this_invocation_runs(tmp_path, capsys):
    """Issue 43 friction 7: `--node-rank 1 --dry-run` printed both nodes' commands, and `--all-nodes --dry-run`
    hid the ssh wrapper that --all-nodes runs."""
    hf = tmp_path / "hosts"
    hf.write_text("node-a slots=1\nnode-b slots=1\n")
    base = [
        "run",
        "--config",
        str(TINY),
        "--dry-run",
        f"run.output_dir={tmp_path}/r",
        f"launch.hostfile={hf}",
        "launch.nodes=2",
        "launch.procs_per_node=1",
    ]
    assert main([*base, "--node-rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "# node 1 (node-b):" in out and "# node 0" not in out and out.count("-m launch.torchrun") == 1
    assert "--node_rank 1" in out and "--node_rank 0" not in out
    assert main([*base, "--all-nodes"]) == 0
    out = capsys.readouterr().out
    ssh = [ln for ln in out.splitlines() if ln.startswith("ssh ")]
    assert len(ssh) == 2 and "node-a" in ssh[0] and "node-b" in ssh[1], out
    assert all("BatchMode=yes" in ln and "launch.torchrun" in ln for ln in ssh), ssh


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_launch_run_does_not_pass_torchruns_omp_banner_through(tmp_path):
    """Issue 43 friction 7: torchrun prints a five-line OMP_NUM_THREADS banner when the variable is unset; the
    launcher sets torchrun's own value (1 per rank) itself, so the ranks get the same and the console no banner.
    The run stops at once (no token shards): the banner comes before any rank starts."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env |= {"PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "run",
            "--config",
            str(TINY),
            f"run.output_dir={tmp_path}/r",
            f"launch.master_port={free_port()}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert "no token shards" in res.stderr, res.stderr[-3000:]
    assert "Setting OMP_NUM_THREADS" not in res.stderr + res.stdout, res.stderr[-3000:]
