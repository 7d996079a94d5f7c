"""GPU jobs on Slurm: the README's own commands render GPU, CPU and partition requests a GPU cluster needs, and
a real Slurm controller (declaring GPU nodes) accepts the script (`sbatch --test-only`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest

from launch import slurm
from launch.__main__ import main
from launch.render import Entry
from runconfig import load_config
from tests.launch.slurm_cluster import LocalSlurm, missing_reason

ROOT = Path(__file__).resolve().parents[2]


def readme_commands(subcommand: str) -> list[list[str]]:
    """`python -m launch <subcommand> ...` commands of the README and docs/launching.md (continuation lines
    joined), as argv lists."""
    docs = (ROOT / "README.md", ROOT / "docs" / "launching.md")
    text = re.sub(r"\\\n\s*", "", "\n".join(p.read_text() for p in docs))
    return [shlex.split(m) for m in re.findall(rf"^python -m launch {subcommand} .*$", text, flags=re.M)]


def sbatch_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line.startswith("#SBATCH ")}


def test_readme_sbatch_command_requests_gpus_and_cpus(tmp_path, capsys):
    cmds = [c for c in readme_commands("sbatch") if "--print" in c]
    assert cmds, "README shows `python -m launch sbatch ... --print`"
    argv = [*cmds[0][3:6], f"run.output_dir={tmp_path}/run", *cmds[0][6:]]
    assert "launch.backend=nccl" in argv and "launch.procs_per_node=8" in argv
    assert main(argv) == 0
    lines = sbatch_lines(capsys.readouterr().out)
    # One rank per GPU, 2 CPUs per rank (the rank + loader.num_workers=1 DataLoader worker) for the node's 8 ranks.
    assert {
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --partition=gpu",
    } <= lines, sorted(lines)

    # Sites that want GRES syntax, a GPU type, or a CPU count of their own.
    assert (
        main(
            [
                *argv[:4],
                "launch.slurm.gpu_request=gres",
                "launch.slurm.gpu_type=a100",
                "launch.slurm.cpus_per_rank=6",
                *argv[4:],
            ]
        )
        == 0
    )
    lines = sbatch_lines(capsys.readouterr().out)
    assert {"#SBATCH --gres=gpu:a100:8", "#SBATCH --cpus-per-task=48"} <= lines
    assert not any(x.startswith("#SBATCH --gpus-per-node") for x in lines)


def test_readme_pipeline_data_stages_stay_off_the_gpu_partition(tmp_path, capsys):
    (cmd,) = readme_commands("pipeline-slurm")
    argv = [*cmd[3:6], f"run.output_dir={tmp_path}/run", *cmd[6:], "--clean-shards", "4", "--dry-run"]
    assert main(argv) == 0
    capsys.readouterr()
    scripts = {p.name: p.read_text() for p in (tmp_path / "run" / "slurm").glob("*.sbatch")}
    train = scripts.pop("gpt2-medium-train.sbatch")
    assert {"#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu"} <= sbatch_lines(train)
    # clean, the dedup stages, manifest, tokenize (tokenizer training runs in the dedup report job): every data stage of the pipeline, none of them on the GPUs
    assert {"gpt2-medium-clean.sbatch", "gpt2-medium-manifest.sbatch", "gpt2-medium-tokenize.sbatch"} <= set(
        scripts
    )
    assert any("dedup" in name for name in scripts), sorted(scripts)
    for name, text in scripts.items():
        lines = sbatch_lines(text)
        assert not any("--partition" in x or "gpu" in x.split("=")[0] or "--gres" in x for x in lines), (
            name,
            lines,
        )
        assert "#SBATCH --cpus-per-task=2" in lines  # data.clean.workers, not the training job's 16

    assert (
        main(
            [
                *argv[:4],
                "launch.slurm.data_partition=cpu",
                "launch.slurm.data_cpus_per_task=8",
                "launch.slurm.data_mem=16G",
                "launch.slurm.data_time=00:30:00",
                *argv[4:],
            ]
        )
        == 0
    )
    capsys.readouterr()
    clean = (tmp_path / "run" / "slurm" / "gpt2-medium-clean.sbatch").read_text()
    assert {
        "#SBATCH --partition=cpu",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=16G",
        "#SBATCH --time=00:30:00",
    } <= sbatch_lines(clean)


def test_gpu_defaults_follow_the_backend(tmp_path):
    tiny = ROOT / "configs" / "roberta-tiny.yaml"
    gloo = load_config(tiny, [f"run.output_dir={tmp_path}", "launch.procs_per_node=2"])
    assert gloo.launch.gpus_per_node == 0 and slurm.gpu_option(gloo) is None
    # no GPUs: same one
    assert slurm.data_partition(load_config(tiny, ["launch.slurm.partition=cpu"])) == "cpu"
    nccl = load_config(tiny, ["launch.backend=nccl", "launch.procs_per_node=4"])
    assert slurm.gpu_option(nccl) == "--gpus-per-node=4"
    assert (
        slurm.gpu_option(load_config(tiny, ["launch.backend=nccl", "launch.slurm.gpus_per_node=0"])) is None
    )
    with pytest.raises(Exception, match="launch.slurm: array_cpus_per_task is now data_cpus_per_task"):
        load_config(tiny, ["launch.slurm.array_cpus_per_task=4"])


@pytest.fixture(scope="module")
def gpu_slurm():
    reason = missing_reason()
    if reason:
        pytest.skip(f"local Slurm unavailable: {reason}")
    root = Path(tempfile.mkdtemp(prefix="lmtest-gpuslurm-"))
    os.chmod(root, 0o755)
    cluster = LocalSlurm(root, cpus=32, gpus=8).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.slurm
def test_sbatch_test_only_accepts_gpu_scripts(gpu_slurm, tmp_path):
    """The controller of a 2-node cluster with 8 GPUs and 32 CPUs per node would run the generated scripts."""
    cfg_path = ROOT / "configs" / "gpt2-medium.yaml"
    overrides = [
        f"run.output_dir={tmp_path}/run",
        "launch.launcher=slurm",
        "launch.nodes=2",
        "launch.procs_per_node=8",
        "launch.backend=nccl",
        "launch.slurm.partition=debug",
    ]
    cfg = load_config(cfg_path, overrides)
    for variant in ({}, {"gpu_request": "gres"}):
        c = cfg.model_copy(
            update={
                "launch": cfg.launch.model_copy(update={"slurm": cfg.launch.slurm.model_copy(update=variant)})
            }
        )
        path = slurm.write_script(c, slurm.render_train_script(c, Entry.train(cfg_path)), "train")
        res = gpu_slurm.run(["sbatch", "--test-only", str(path)], check=False)
        assert res.returncode == 0 and "to start at" in res.stderr, (
            variant,
            res.stderr,
            path.read_text()[:600],
        )
    # Asking for more GPUs than a node has is rejected by the same check, so the test can fail.
    big = cfg.model_copy(
        update={
            "launch": cfg.launch.model_copy(
                update={"slurm": cfg.launch.slurm.model_copy(update={"gpus_per_node": 16})}
            )
        }
    )
    path = slurm.write_script(big, slurm.render_train_script(big, Entry.train(cfg_path)), "big")
    assert gpu_slurm.run(["sbatch", "--test-only", str(path)], check=False).returncode != 0
    for stage, path, _ in slurm.pipeline(cfg, cfg_path, overrides, 4, 4, submit_jobs=False)[:4]:
        res = gpu_slurm.run(["sbatch", "--test-only", str(path)], check=False)
        assert res.returncode == 0, (stage, res.stderr)
