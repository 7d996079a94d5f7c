"""`python -m pretrain mixture`: proxy runs at sampled source weights, each source's held-out loss fitted on the
weights, the proposed mixture; a killed search reruns only the runs it did not finish; one source is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError
from pretrain.tools.mixture import (
    MIN_WEIGHT,
    capped,
    fit_losses,
    predict,
    propose,
    run_mixture,
    sample_mixtures,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_mixtures_fit_and_proposal_on_a_known_law():
    w = sample_mixtures(3, 12, seed=0)
    assert np.allclose(w[0], 1 / 3) and np.allclose(w.sum(axis=1), 1) and (w >= MIN_WEIGHT * 0.9).all()
    # each source's loss falls as its own weight grows, with diminishing returns: the best mixture is interior
    target = np.array([0.5, 0.3, 0.2])
    losses = 3.0 - 2 * w * target * 3 + 3 * w**2 * target
    coef = fit_losses(w, losses)
    assert np.allclose(predict(coef, w), losses.mean(axis=1), atol=1e-2)
    best, predicted = propose(coef, 3, seed=0)
    assert np.allclose(best.sum(), 1) and predicted <= predict(coef, np.full((1, 3), 1 / 3))[0]


@pytest.mark.timeout(60)
def test_no_mixture_exceeds_a_share_cap():
    """A source that `--max-epochs` passes cannot fill beyond 5% of a run is held at 5%, sampled or proposed: the
    search can no longer find that memorising a tiny source lowers its own held-out loss."""
    cap = np.array([0.05, 1.0, 0.6])
    w = capped(np.array([[0.5, 0.3, 0.2], [0.01, 0.09, 0.9], [0.2, 0.2, 0.6]]), cap)
    assert np.allclose(w.sum(axis=1), 1) and (w <= cap + 1e-12).all()
    assert np.allclose(w[0], [0.05, 0.3 + 0.45 * 0.6, 0.2 + 0.45 * 0.4])  # the excess spread by share
    assert np.allclose(w[1], [0.04, 0.36, 0.6])  # the third capped too: its excess spread by share
    draws = sample_mixtures(3, 500, seed=1, cap=cap)
    assert (draws <= cap + 1e-12).all() and np.allclose(draws.sum(axis=1), 1) and (draws[:, 0] > 0).all()
    # a law under which the tiny source's share lowers the loss most: the proposal sits at its cap
    losses = 3.0 - 4 * draws[:, [0]] - 0.1 * draws
    best, _ = propose(fit_losses(draws, np.repeat(losses[:, :1], 3, axis=1)), 3, seed=0, cap=cap)
    assert best[0] <= cap[0] + 1e-9 and best[0] > 0.04


@pytest.mark.timeout(60)
def test_one_source_or_too_few_runs_is_refused():
    with pytest.raises(ConfigError, match=r"a mixture search needs 2 sources or more \(the config has 1"):
        run_mixture(
            ROOT / "configs" / "gpt2-tiny.yaml", ["data.sources=[{name: a, format: jsonl, paths: [x]}]"]
        )
    with pytest.raises(ConfigError, match=r"--runs 3: the fit over 2 sources needs 6 runs or more"):
        run_mixture(ROOT / "configs" / "gpt2-tiny.yaml", [], runs=3)


@pytest.mark.timeout(60)
def test_each_proxy_run_checkpoints_in_its_own_folder_whatever_the_configs_checkpoint_dir(tmp_path):
    """A config's `checkpoint.dir` (and a `checkpoint.resume` folder) is the main run's: every proxy run used to
    inherit it, so run1 resumed run0's checkpoints (at another mixture). Each proxy run's resolved config
    checkpoints under its own folder and resumes only from there."""
    from pretrain.tools.mixture import mixture_overrides
    from runconfig import load_config

    config = ROOT / "configs" / "gpt2-tiny.yaml"
    shared = tmp_path / "shared-checkpoints"
    user = [
        f"run.output_dir={tmp_path}/run",
        f"checkpoint.dir={shared}",
        f"checkpoint.resume={shared}/step00000050",
    ]
    cfg = load_config(config, user)
    root = tmp_path / "run" / "mixture"
    folders = set()
    for k, weights in enumerate(sample_mixtures(2, 3, seed=0)):
        folder = root / f"run{k}"
        proxy = load_config(config, [*user, *mixture_overrides(cfg, weights, folder, 40)])
        assert Path(proxy.run.root) == folder and Path(proxy.checkpoint_dir) == folder / "checkpoints"
        assert proxy.checkpoint.resume == "auto"
        folders.add(Path(proxy.checkpoint_dir))
    assert len(folders) == 3


class FakeTraining:
    """Stands in for `run_training` (torchrun of `pretrain train`) in a proxy run's folder, as the trainer would
    meet it: before it "trains" it reads what `checkpoint.resume=auto` would resume from there (None, "own": made
    under these overrides, "other": made under other ones), then leaves a checkpoint stamped with its overrides
    and, unless it is the run `stop_at` names (killed after that checkpoint), an evaluation row."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources
        self.stop_at: str | None = None
        self.calls: list[tuple[str, str | None]] = []  # (folder name, what it resumed)

    def __call__(self, config: Path, overrides: list[str], folder: Path, nproc: int, what: str) -> None:
        from core.exit_codes import PREEMPTED
        from pretrain.tools.ladder import LadderError

        # the data stages' links share_data made are there (and still are after a folder was cleared)
        assert (folder / "tokens").is_symlink() and (folder / "tokenizer").is_symlink()
        ckpts = folder / "checkpoints"
        made = [json.loads(p.read_text()) for p in sorted(ckpts.glob("step*/made_under.json"))]
        self.calls.append((folder.name, None if not made else "own" if made[-1] == overrides else "other"))
        tag = ckpts / f"step{len(made) + 1:08d}"
        tag.mkdir(parents=True)
        (tag / "made_under.json").write_text(json.dumps(overrides))
        if folder.name == self.stop_at:
            raise LadderError(f"{what} stopped at a signal and checkpointed", exit_code=PREEMPTED)
        value = dict(o.split("=", 1) for o in overrides)
        width = int(value.get("model.hidden_size", 64))
        row = {"split": "eval", "step": 4, "loss": 2.0 + 3.0 * 64 / width}
        for i, s in enumerate(self.sources):
            row[f"loss/{s}"] = 3.0 - float(value.get(f"data.sources.{i}.weight", 0.5))
        (folder / "logs").mkdir(exist_ok=True)
        (folder / "logs" / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def fake_data_stages(run: Path) -> None:
    """The token shards and tokenizer `share_data` links into each proxy run's folder (only their presence is
    checked)."""
    (run / "tokens").mkdir(parents=True)
    (run / "tokens" / "manifest.json").write_text("{}")
    (run / "tokenizer").mkdir()


@pytest.mark.timeout(120)
def test_a_run_at_other_settings_starts_over_in_its_folder_not_from_its_checkpoints(tmp_path, monkeypatch):
    """Another `--seed` gives run1..run5 other mixtures in the same folders. A run finished (or killed) at
    another mixture used to be trained again in its folder as it was: the trainer's auto-resume then continued
    the other mixture's checkpoints (or refused them). Such a folder is now cleared first, all but the links to
    the run's data; a killed run at the same mixture still resumes its own checkpoint, a finished one is kept."""
    from pretrain.tools import ladder, mixture

    config = ROOT / "configs" / "gpt2-tiny.yaml"
    user = [f"run.output_dir={tmp_path}/run"]
    fake_data_stages(tmp_path / "run")
    fake = FakeTraining(["crawl", "bbc"])
    monkeypatch.setattr(ladder, "run_training", fake)
    monkeypatch.setattr(mixture, "share_caps", lambda cfg, steps, max_epochs: (np.ones(2), {}))
    root = tmp_path / "run" / "mixture"

    fake.stop_at = "run3"  # seed 0, killed in run3
    with pytest.raises(ladder.LadderError, match="run3 stopped"):
        run_mixture(config, user, runs=6, steps=4, seed=0)
    assert fake.calls == [("run0", None), ("run1", None), ("run2", None), ("run3", None)]
    fake.calls.clear()
    fake.stop_at = "run4"  # seed 0 again: run0..2 kept, run3 resumes its own checkpoint; killed in run4
    with pytest.raises(ladder.LadderError, match="run4 stopped"):
        run_mixture(config, user, runs=6, steps=4, seed=0)
    assert fake.calls == [("run3", "own"), ("run4", None)]
    fake.calls.clear()
    fake.stop_at = None  # seed 1: run0 (the uniform mixture whatever the seed) kept; run1..4 start over
    report = run_mixture(config, user, runs=6, steps=4, seed=1)
    assert fake.calls == [(f"run{k}", None) for k in range(1, 6)]
    assert report["runs"][1]["weights"] == list(mixture.sample_mixtures(2, 6, 1)[1])
    for k in range(6):
        folder = root / f"run{k}"
        assert (folder / "tokens").resolve() == (tmp_path / "run" / "tokens").resolve()
        assert (folder / "tokenizer").resolve() == (tmp_path / "run" / "tokenizer").resolve()
        assert len(list((folder / "checkpoints").glob("step*"))) == 1  # the other mixture's removed


TWO = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: mix, output_dir: {out}}}
data:
  sources: [{{name: money, format: text_folder, paths: ["{bbc}/business"]}},
            {{name: games, format: text_folder, paths: ["{bbc}/sports"]}}]
tokenizer: {{vocab_size: 1000}}
packing: {{seq_len: 64}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, ffn_size: 128, max_position_embeddings: 64}}
batch: {{global_batch_size: 8, micro_batch_size: 4}}
schedule: {{total_steps: 6, warmup_steps: 1}}
deepspeed: {{zero_stage: 0, precision: fp32}}
loader: {{num_workers: 0, eval_fraction: 0.1}}
eval: {{max_batches: 2}}
launch: {{procs_per_node: 1}}
logging: {{every_steps: 1, progress_bar: false, tensorboard: false, plots: false}}
finetune: {{tasks: []}}
"""


def _prepare(tmp_path: Path) -> Path:
    from core.run_layout import RunLayout
    from data_pipeline.shards import mark_done, write_shard
    from data_pipeline.tokenize import run_tokenize
    from data_pipeline.tokenizers import train_tokenizer
    from runconfig import load_config
    from tests.pretrain.test_smoke_deepspeed import BBC

    config = tmp_path / "mix.yaml"
    config.write_text(TWO.format(root=ROOT, out=tmp_path / "run", bbc=BBC))
    cfg = load_config(str(config))
    for name, topic in (("money", "business"), ("games", "sports")):
        texts = [f.read_text(errors="replace") for f in sorted((BBC / topic).glob("*.txt"))[:60]]
        shard = RunLayout(cfg).clean / name / "shard-00000.jsonl.zst"
        shard.parent.mkdir(parents=True)
        write_shard(
            shard,
            [
                {"id": f"{name}{i}", "text": t, "url": None, "timestamp": None, "source": name}
                for i, t in enumerate(texts)
            ],
        )
        mark_done(shard, {"rows": len(texts)})
    train_tokenizer(cfg)
    assert run_tokenize(cfg)["complete"]
    return config


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_a_killed_search_reruns_only_unfinished_runs(tmp_path):
    config = _prepare(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pretrain", "mixture", "--config", str(config), "--runs", "6"]
    first = tmp_path / "run" / "mixture" / "run1" / "run.json"
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 400
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert first.exists(), (tmp_path / "first.log").read_text()[-3000:]
    kept = first.stat().st_mtime_ns
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert first.stat().st_mtime_ns == kept and "run1: done before, kept" in res.stdout
    report = json.loads((tmp_path / "run" / "mixture" / "mixture.json").read_text())
    assert len(report["runs"]) == 6 and report["sources"] == ["money", "games"]
    assert all(set(r["losses"]) == {"money", "games"} for r in report["runs"])
    w = report["proposal"]["weights"]
    assert abs(sum(w.values()) - 1) < 1e-6 and np.isfinite(report["proposal"]["predicted_mixed_loss"])
    assert "proposed:" in res.stdout
    # the weights are shares (loader.mixing: proportion), within the caps the sources' samples allow
    assert all("loader.mixing=proportion" in r["overrides"] for r in report["runs"])
    caps = report["share_caps"]
    assert caps["from"]["max_epochs"] == 4 and all(
        r["weights"][0] <= caps["money"] + 1e-9 for r in report["runs"]
    )
    # runs so long that 4 passes over both sources cannot fill them: refused before any trains
    with pytest.raises(ConfigError, match=r"--max-epochs 4: runs of 100000 steps read 800,000 samples"):
        run_mixture(config, [], runs=6, steps=100_000)
