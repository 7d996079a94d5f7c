"""On a real local Slurm (2 nodes): the data path as chained job arrays (clean -> dedup stages -> tokenizer ->
tokenize -> manifest), and a 2-node DeepSpeed training job that is
preempted (grace signal), checkpoints, requeues itself and finishes from the checkpoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.storage import RunStore
from launch import slurm
from runconfig import load_config
from tests.launch.conftest import ROOT, child_env, training_run, write_tiny_config
from tests.moto_s3 import s3_server, s3fs_client  # noqa: F401  (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slurm, pytest.mark.timeout(600)]


def launch_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch", *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_clean_job_array_cleans_four_shards(slurm_cluster, tmp_path):
    cfg_path = write_tiny_config(tmp_path, "arr", tmp_path / "run", "")
    cfg = load_config(cfg_path, ["launch.slurm.array_concurrency=2"])
    # The same scripts `python -m launch pipeline-slurm` submits; here only the clean array is submitted.
    stages = slurm.pipeline(cfg, cfg_path, ["launch.slurm.array_concurrency=2"], 4, 4, submit_jobs=False)
    clean_script = stages[0][1]
    assert "#SBATCH --array=0-3%2" in clean_script.read_text()
    job = slurm.submit(clean_script)
    # The dedup stage arrays, dedup report + tokenizer, the tokenize array and the manifest job, each waiting on
    # the previous job with afterok, as pipeline-slurm chains them: the whole data path on Slurm.
    prev = job
    submitted = {}
    for stage, path, _ in stages[1:]:
        if stage == "train":  # the chain's last job; training on Slurm is the next test
            break
        prev = submitted[stage] = slurm.submit(path, after=[prev])
    assert list(submitted)[-3:] == ["dedup+tokenizer", "tokenize", "manifest"], list(submitted)
    prep_job = submitted["dedup+tokenizer"]
    assert slurm_cluster.job_fields(prep_job).get("Reason") in ("Dependency", "None", "Resources", "Priority")
    # Generous waits: ~30 chained jobs (one per dedup step), each a Python start; beside the chaos test on the other
    # xdist worker the prep job took 140 s (a 120 s wait failed in CI). Correctness is checked here, not speed.
    deadline = time.monotonic() + 300
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = slurm_cluster.array_states(job)
        if len(states) == 4 and all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in states.values()):
            break
        time.sleep(1)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted((tmp_path / "run" / "slurm").glob("*.out")))
    assert states == {str(i): "COMPLETED" for i in range(4)}, logs
    shards = sorted((tmp_path / "run" / "clean" / "bbc").glob("shard-*.jsonl.zst"))
    assert [p.name for p in shards] == [f"shard-0000{i}.jsonl.zst" for i in range(4)]
    assert len(list((tmp_path / "run" / "slurm").glob("arr-clean-*_*.out"))) == 4  # one log per task
    st = launch_cli("status", job)
    assert st.returncode == 0 and st.stdout.count("COMPLETED") == 4, st.stdout + st.stderr
    prep = slurm_cluster.wait_state(prep_job, {"COMPLETED", "FAILED", "CANCELLED"}, 400)
    assert prep["JobState"] == "COMPLETED", "\n".join(
        p.read_text()[-2000:] for p in sorted((tmp_path / "run" / "slurm").glob("arr-*.out"))
    )
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()
    dedup = json.loads((tmp_path / "run" / "dedup" / "dedup_stats.json").read_text())
    assert dedup["tasks"]["dedup-signatures"] == 4 and dedup["docs_in"] > 0  # every stage ran as array tasks
    last = slurm_cluster.wait_state(submitted["manifest"], {"COMPLETED", "FAILED", "CANCELLED"}, 300)
    assert last["JobState"] == "COMPLETED", "\n".join(
        p.read_text()[-2000:] for p in sorted((tmp_path / "run" / "slurm").glob("*.out"))
    )
    manifest = json.loads((tmp_path / "run" / "tokens" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["missing_shards"] == 0
    assert manifest["totals"]["docs"] > 0 and manifest["totals"]["tokens"] > 0, manifest["totals"]


def _checkpoint_steps(run: Path) -> list[int]:
    return sorted(
        int(m.group(1))
        for p in (run / "checkpoints").glob("step*")
        if (p / "COMPLETE").exists() and (m := re.search(r"(\d+)$", p.name))
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_node_training_preempted_requeued_and_resumed(
    slurm_cluster, prepared_run, tmp_path, request, where
):
    """`where=s3`: run.output_dir is a bucket (moto's real S3 API), and the local staging folder is deleted while
    the requeued job waits, as when Slurm starts it on another node: it resumes from the bucket."""
    extra: list[str] = []
    if where == "local":
        cfg_path, run = training_run(tmp_path, "pre", prepared_run, "")
        stage = None
        slurm_dir = run / "slurm"
        steps = lambda: _checkpoint_steps(run)  # noqa: E731
        metrics_text = lambda: (run / "logs" / "metrics.jsonl").read_text()  # noqa: E731
    else:
        env = request.getfixturevalue("s3_server")
        fs = s3fs_client(env)
        fs.mkdir("runs")
        url, stage, slurm_dir = "s3://runs/pre", tmp_path / "stage", tmp_path / "slurm"
        RunStore(prepared_run.resolve(), url).push([prepared_run / "tokenizer", prepared_run / "tokens"])
        cfg_path = write_tiny_config(tmp_path, "pre", url)
        extra = [f"run.local_dir={stage}", f"launch.slurm.output_dir={slurm_dir}"]

        def steps() -> list[int]:
            fs.invalidate_cache()
            found = fs.glob("runs/pre/checkpoints/step*/COMPLETE")
            return sorted(int(re.search(r"step(\d+)/COMPLETE$", p).group(1)) for p in found)

        metrics_text = lambda: fs.cat("runs/pre/logs/metrics.jsonl").decode()  # noqa: E731
    overrides = [
        "launch.launcher=slurm",
        "launch.master_port=29611",
        "launch.slurm.signal_grace_s=60",
        "launch.slurm.cpus_per_task=1",
        "schedule.total_steps=100",
        "checkpoint.every_steps=5",
        "launch.env={GLOO_SOCKET_IFNAME: lo}",
        *extra,
    ]
    sub = launch_cli("sbatch", "--config", str(cfg_path), *overrides, "--submit")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    t0 = time.monotonic()
    log = slurm_dir / f"pre-{job}.out"

    def text() -> str:
        return log.read_text() if log.exists() else ""

    # Wait for the first complete checkpoint, then deliver the preemption warning exactly as Slurm would.
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not steps():
        assert slurm_cluster.job_fields(job).get("JobState") not in ("FAILED", "COMPLETED"), text()
        time.sleep(1)
    assert steps(), f"no checkpoint within 150 s:\n{text()}"
    assert launch_cli("cancel", job, "--signal", "USR1").returncode == 0
    t_signal = time.monotonic() - t0

    # The job requeues itself (same id, Restarts=1), resumes from the checkpoint it wrote and finishes.
    deadline = time.monotonic() + 200
    fields: dict[str, str] = {}
    began_later: list[float] = []
    while time.monotonic() < deadline:
        fields = slurm_cluster.job_fields(job)
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            # Slurm holds a requeued job back for a while (begin time); a test need not wait for all of it.
            if stage is not None and not began_later:
                shutil.rmtree(stage)  # "another node": nothing of the run is on this disk
            if not began_later:
                began_later.append(time.monotonic() - t0)
            slurm_cluster.release_requeued(job, fields)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(1)
    out = text()
    print(
        f"first checkpoint + signal after {t_signal:.0f}s, finished after {time.monotonic() - t0:.0f}s; "
        f"requeued job held for BeginTime at {began_later[:1]}"
    )
    assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1", (
        f"{fields}\n{out[-6000:]}\n{slurm_cluster.log_tail()}"
    )
    assert "[launch] preemption signal" in out and "[launch] requeueing job" in out
    resumed = re.findall(r"resumed from \S+ at step (\d+)", out)
    assert resumed and int(resumed[0]) >= 5, out[-6000:]
    assert max(steps()) == 100
    if stage is not None:
        assert began_later, (
            f"the requeued job was never seen waiting, so its staging folder was kept:\n{fields}"
        )
    metrics = [json.loads(line) for line in metrics_text().splitlines() if line.strip()]
    assert any(m.get("step") == 100 for m in metrics)
