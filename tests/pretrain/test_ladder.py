"""`python -m pretrain ladder`: rungs of one family trained on the same shards, the loss fitted against the
non-embedding parameters, a bigger rung predicted; a killed ladder reruns only the rungs it did not finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from pretrain.tools.ladder import fit_power_law, parse_rungs, predict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(60)
def test_the_fit_recovers_a_known_law():
    ns = [1e4, 3e4, 1e5, 3e5, 1e6]
    losses = [2.0 + 3.0 * (n / 1e4) ** -0.4 for n in ns]
    fit = fit_power_law([int(n) for n in ns], losses)
    assert fit["E"] == pytest.approx(2.0, rel=1e-3) and fit["alpha"] == pytest.approx(0.4, rel=1e-3)
    assert fit["rms_relative_residual"] < 1e-6 and fit["leave_one_out_relative_error"] < 1e-4
    assert predict(fit, 3_000_000) == pytest.approx(2.0 + 3.0 * 300**-0.4, rel=1e-4)


@pytest.mark.timeout(60)
def test_bad_rungs_are_refused_naming_the_flag():
    assert parse_rungs("64,128x3, 192") == [(64, None), (128, 3), (192, None)]
    with pytest.raises(ConfigError, match="--rungs: 'wide' is not WIDTH"):
        parse_rungs("64,wide")
    with pytest.raises(ConfigError, match="3 rungs or more"):
        fit_power_law([10, 20], [3.0, 2.5])


def _ladder(config, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pretrain",
        "ladder",
        "--config",
        str(config),
        "--rungs",
        "32,64,96",
        "--tokens-per-param",
        "0.2",
        "--predict",
        "128",
        "launch.procs_per_node=1",
        *extra,
    ]


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_a_killed_ladder_reruns_only_unfinished_rungs(tmp_path):
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    first = out / "ladder" / "w32-l2" / "rung.json"
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(
            _ladder(config), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 400
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert first.exists(), (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(3)  # into the second rung
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    kept = first.stat().st_mtime_ns
    res = subprocess.run(_ladder(config), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert first.stat().st_mtime_ns == kept  # the finished rung was not trained again
    assert "w32-l2: done before" in res.stdout
    report = json.loads((out / "ladder" / "ladder.json").read_text())
    assert [r["name"] for r in report["rungs"]] == ["w32-l2", "w64-l2", "w96-l2"]
    params = [r["params"] for r in report["rungs"]]
    assert params == sorted(params) and all(r["loss"] > 0 for r in report["rungs"])
    (pred,) = report["predictions"]
    assert pred["name"] == "w128-l2" and pred["params"] > params[-1] and pred["predicted_loss"] > 0
    assert (out / "ladder" / "ladder.png").stat().st_size > 0 and "predicted" in res.stdout
    # each rung read the run's shards: no data stage ran in a rung's folder
    assert not (out / "ladder" / "w64-l2" / "clean").exists()
    # scaled by default: the rungs' batch and LR differ from the config's, and say so
    assert report["hparams"]["rule"] == "scaled" and len({r["lr"] for r in report["rungs"]}) == 3
    # a changed setting on the rerun (the config's batch and LR for every rung) trains every rung again
    res = subprocess.run(
        _ladder(config, "--hparams", "fixed"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert first.stat().st_mtime_ns != kept and "done before" not in res.stdout
    report = json.loads((out / "ladder" / "ladder.json").read_text())
    assert report["hparams"] == "fixed" and {r["lr"] for r in report["rungs"]} == {0.0}


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_ctrl_c_on_a_ladder_checkpoints_the_rung_exits_75_and_a_rerun_resumes_it(tmp_path):
    """Fault matrix: Ctrl-C (SIGINT to the ladder's process group, as a terminal sends it) while a rung trains.
    The ladder passes it to the rung's ranks, which checkpoint at the step end; it waits for them and exits 75
    naming the rung, with no rank left running. It used to be killed by its own KeyboardInterrupt 0.25 s later
    (subprocess.run's SIGKILL of torchrun), leaving the ranks to finish alone; a SIGTERM left them training on."""
    import psutil

    from pretrain.checkpoint import complete_tags
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run

    config, out = prepare_smoke_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    rung = out / "ladder" / "w32-l2"
    args = _ladder(config, "checkpoint.every_steps=1000")  # a checkpoint at the signal only
    args[args.index("0.2")] = "1"  # a first rung of 67 steps: the signal lands in it
    metrics = rung / "logs" / "metrics.jsonl"
    with open(tmp_path / "first.log", "wb") as log:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + 400
        while (
            proc.poll() is None
            and time.time() < deadline
            and not (metrics.is_file() and metrics.read_text().count('"split": "train"') >= 2)
        ):
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        job = psutil.Process(proc.pid).children(recursive=True)  # torchrun and its rank
        assert len(job) >= 2
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=120)
    text = (tmp_path / "first.log").read_text()
    assert rc == 75, text[-3000:]
    assert "rung w32-l2 stopped at a signal and checkpointed" in text
    assert not [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # none trains on
    tags = complete_tags(rung / "checkpoints")
    assert tags and not (rung / "rung.json").exists()
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = [ln for ln in (rung / "train.log").read_text().splitlines() if "[train] resumed from" in ln]
    assert len(resumed) == 1 and tags[-1] in resumed[0], resumed
    assert json.loads((rung / "rung.json").read_text())["loss"] > 0


@pytest.mark.timeout(120)
def test_a_rung_that_would_not_fit_is_refused_before_any_trains(tmp_path):
    from pretrain.tools.ladder import run_ladder

    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    with pytest.raises(ConfigError, match=r"rung w256-l2 needs about .* GiB per rank"):
        run_ladder(config, [f"run.output_dir={tmp_path}/run"], "64,128,256", memory_gib=0.09)
    assert not (tmp_path / "run" / "ladder").exists()


@pytest.mark.timeout(120)
def test_rungs_scale_batch_and_lr_from_the_configs_own_model():
    """The config's width keeps its batch and LR; a rung of ratio r parameters gets batch x r^(2/3) (whole
    micro-batches per rank) and LR x r^(-1/3); `fixed` gives every rung the config's; μP keeps the LR."""
    from pretrain.tools.ladder import anchor_of, make_rung
    from runconfig import load_config

    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    cfg = load_config(config, ["model.num_heads=4"])  # head size 32, batch 32 of micro 8 on 2 ranks, LR 1e-3
    anchor = anchor_of(cfg)
    own = make_rung(cfg, 128, None, 5.0, anchor)
    assert (own.params, own.global_batch, own.micro_batch) == (anchor.params, 32, 8)
    assert own.lr == pytest.approx(1e-3)
    small = make_rung(cfg, 32, None, 5.0, anchor)
    ratio = small.params / anchor.params
    assert (
        small.global_batch == 2 * round(32 * ratio ** (2 / 3) / 2)
        and small.micro_batch == small.global_batch // 2
    )
    assert small.lr == pytest.approx(1e-3 * ratio ** (-1 / 3))
    assert small.steps == -(-small.tokens // (small.global_batch * cfg.packing.seq_len))
    mid = make_rung(cfg, 96, None, 5.0, anchor)  # 21.9 sequences wanted: 2 ranks x 2 micro-batches of 5
    assert (mid.global_batch, mid.micro_batch) == (20, 5)
    big = make_rung(cfg, 256, None, 5.0, anchor)
    want = 32 * (big.params / anchor.params) ** (2 / 3)
    assert abs(big.global_batch - want) <= big.global_batch / big.micro_batch and big.micro_batch <= 8
    assert big.global_batch % (2 * big.micro_batch) == 0 and big.lr < 1e-3
    assert (
        "lr_scaling.rule=none" in big.overrides
        and f"batch.global_batch_size={big.global_batch}" in big.overrides
    )
    fixed = make_rung(cfg, 32, None, 5.0)
    assert (fixed.global_batch, fixed.lr) == (0, 0.0) and not any("optim.lr" in o for o in fixed.overrides)
    # under lr_scaling the anchor is the scaled LR, and the rung's LR is not scaled again by its batch
    scaled = load_config(
        config, ["model.num_heads=4", "lr_scaling.rule=linear", "lr_scaling.reference_batch_size=16"]
    )
    assert anchor_of(scaled).lr == pytest.approx(2e-3)
    mup = load_config(config, ["model.num_heads=4", "model.parametrization=mup", "model.mup_base_width=64"])
    assert make_rung(mup, 64, None, 5.0, anchor_of(mup)).lr == 0.0
    with pytest.raises(ConfigError, match=r"--rungs: rung w32-l2: .*mup_base_width \(64\) is above"):
        make_rung(mup, 32, None, 5.0, anchor_of(mup))
    with pytest.raises(ConfigError, match="--hparams: 'tuned' is not one of scaled, fixed"):
        from pretrain.tools.ladder import run_ladder

        run_ladder(config, [], "32,64,96", hparams="tuned")


@pytest.mark.timeout(60)
def test_each_rung_checkpoints_in_its_own_folder_whatever_the_configs_checkpoint_dir(tmp_path):
    """A config's `checkpoint.dir` (and a `checkpoint.resume` folder) is the main run's: every rung used to inherit
    it, so a later rung resumed an earlier rung's checkpoints. Each rung's resolved config checkpoints under its
    own folder and resumes only from there."""
    from pretrain.tools.ladder import Rung, rung_config_overrides
    from runconfig import load_config

    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    shared = tmp_path / "shared-checkpoints"
    user = [
        f"run.output_dir={tmp_path}/run",
        f"checkpoint.dir={shared}",
        f"checkpoint.resume={shared}/step00000050",
    ]
    cfg = load_config(config, user)
    root = tmp_path / "run" / "ladder"
    folders = {}
    for width in (64, 128, 192):  # gpt2-tiny's head size is 64
        rung = Rung(f"w{width}-l2", width, 2, width // 64, 4 * width, 0, 0, 0, 8)
        rungs_cfg = load_config(config, [*user, *rung_config_overrides(cfg, rung, root)])
        folders[rung.name] = Path(rungs_cfg.checkpoint_dir)
        assert Path(rungs_cfg.run.root) == root / rung.name
        assert folders[rung.name] == root / rung.name / "checkpoints"
        assert rungs_cfg.checkpoint.resume == "auto"
    assert len(set(folders.values())) == 3


@pytest.mark.timeout(60)
def test_a_proxy_run_is_supervised_on_its_own_checkpoint_folder(tmp_path, monkeypatch):
    """run_training tells the supervisor (which decides a signalled run's exit 75 from a checkpoint written after
    the signal) the checkpoint folder of the run's resolved config, not one guessed from its output folder."""
    import core.process
    from pretrain.tools import ladder

    seen = {}

    def supervise(procs, rank_depth=1, checkpoint_dir=None, name=""):
        seen["checkpoint_dir"] = Path(checkpoint_dir)
        return 0

    monkeypatch.setattr(core.process, "supervise", supervise)
    monkeypatch.setattr(ladder.subprocess, "Popen", lambda *a, **k: object())
    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    folder = tmp_path / "run" / "ladder" / "w32-l2"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "scratch" / "w32-l2"
    overrides = [f"run.output_dir={folder}", f"checkpoint.dir={elsewhere}"]
    ladder.run_training(Path(config), overrides, folder, 1, "[ladder] rung w32-l2")
    assert seen["checkpoint_dir"] == elsewhere


@pytest.mark.timeout(120)
def test_a_rung_killed_at_other_settings_starts_over_not_from_its_checkpoints(tmp_path, monkeypatch):
    """A rung killed under other settings (here another --hparams) has no rung.json: it used to be trained in its
    folder as it was, and the trainer's auto-resume continued the other settings' checkpoint. The settings its
    folder trained under are now written before each run (started.json): such a folder is cleared first, as a
    finished rung's is, all but the links to the run's data; a rung killed under the same settings resumes."""
    from pretrain.tools import ladder
    from tests.pretrain.test_mixture import FakeTraining, fake_data_stages

    config = os.path.join(ROOT, "configs", "gpt2-tiny.yaml")
    user = [f"run.output_dir={tmp_path}/run"]
    fake_data_stages(tmp_path / "run")
    fake = FakeTraining([])
    monkeypatch.setattr(ladder, "run_training", fake)

    def ladder_run(hparams: str, stop_at: str | None) -> None:
        fake.calls.clear()
        fake.stop_at = stop_at
        ladder.run_ladder(config, user, "64,128,192", tokens_per_param=0.1, memory_gib=100, hparams=hparams)

    with pytest.raises(ladder.LadderError, match="w128-l2 stopped"):
        ladder_run("scaled", "w128-l2")
    assert fake.calls == [("w64-l2", None), ("w128-l2", None)]
    with pytest.raises(ladder.LadderError, match="w192-l2 stopped"):
        ladder_run("scaled", "w192-l2")  # w64 kept, w128 resumes its own checkpoint
    assert fake.calls == [("w128-l2", "own"), ("w192-l2", None)]
    ladder_run("fixed", None)  # finished or killed under scaled: every rung starts over
    assert fake.calls == [("w64-l2", None), ("w128-l2", None), ("w192-l2", None)]
    for name in ("w64-l2", "w128-l2", "w192-l2"):
        folder = tmp_path / "run" / "ladder" / name
        assert (folder / "tokens").resolve() == (tmp_path / "run" / "tokens").resolve()
        assert len(list((folder / "checkpoints").glob("step*"))) == 1
