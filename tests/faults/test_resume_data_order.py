"""Issue 25 row 7 / item 6: run.seed, the tokenizer and the data sources cannot change on resume without a new
data order. `plan` and `train` refuse them at load (checkpoint.accept_config_changes does not cover them), naming
the key and the two ways forward: a new output folder, or `--reset-data-order` (the resumed weights continue
with a fresh loader state over the new data order)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runconfig import load_config
from runconfig.load import to_dict

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "roberta-tiny.yaml"


def _checkpoint_with_config(run: Path, step: int, overrides: list[str]) -> Path:
    """A checkpoint folder as `plan` reads it: COMPLETE with the step and the resolved config it was written with."""
    cfg = load_config(TINY, [f"run.output_dir={run}", *overrides])
    folder = run / "checkpoints" / f"step{step:08d}"
    folder.mkdir(parents=True)
    (folder / "COMPLETE").write_text(json.dumps({"step": step, "config": to_dict(cfg), "files": {}}))
    (run / "tokens").mkdir()
    (run / "tokens" / "manifest.json").write_text("{}")
    return folder


def _plan(capsys, *args: str) -> subprocess.CompletedProcess:
    """`python -m pretrain plan` in this process (its imports cost seconds per subprocess on a loaded box)."""
    from pretrain.__main__ import main

    try:
        rc = main(["plan", *args])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


@pytest.mark.parametrize(
    "override, key",
    [
        ("run.seed=99", "run.seed"),
        ("tokenizer.vocab_size=9000", "tokenizer.vocab_size"),
        ("data.sources.0.weight=2.0", "data.sources.0.weight"),
    ],
)
def test_plan_refuses_a_data_order_change_on_resume(tmp_path, capsys, override, key):
    run = tmp_path / "run"
    _checkpoint_with_config(run, 30, ["schedule.total_steps=60"])
    base = ["--config", str(TINY), f"run.output_dir={run}", "schedule.total_steps=60", override]
    for extra in ([], ["checkpoint.accept_config_changes=true"]):  # accepting changes does not cover these
        res = _plan(capsys, *base, *extra)
        assert res.returncode == 2, res.stdout + res.stderr
        assert key in res.stderr and "new output folder" in res.stderr and "--reset-data-order" in res.stderr
        assert "Traceback" not in res.stderr
    res = _plan(capsys, "--reset-data-order", *base)
    assert res.returncode == 0, res.stderr
    assert f"data order reset: {key}" in res.stdout


def test_unchanged_data_order_plans_a_normal_resume(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint_with_config(run, 30, ["schedule.total_steps=60"])
    res = _plan(
        capsys, "--config", str(TINY), f"run.output_dir={run}", "schedule.total_steps=60", "optim.lr=5e-4"
    )
    assert res.returncode == 0, res.stderr
    assert "applied: optim.lr" in res.stdout and "data order reset" not in res.stdout


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(600)
def test_train_refuses_a_changed_seed_then_resets_the_data_order_on_request(roberta_run, tmp_path):
    from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE, complete_tags
    from tests.pretrain.conftest import run_module
    from tests.pretrain.test_train_deepspeed import isolated

    out = isolated(roberta_run, tmp_path)
    ckpts = Path(out.split("=", 1)[1]) / "checkpoints"
    base = [out, "checkpoint.every_steps=4", "eval.every_steps=1000", "logging.every_steps=1"]

    def train(*extra: str) -> subprocess.CompletedProcess:
        flags = [x for x in extra if x.startswith("--")]
        over = [x for x in extra if not x.startswith("--")]
        return run_module(
            ["-m", "pretrain", "train", *flags, "--config", str(roberta_run), *base, *over], check=False
        )

    res = train("schedule.total_steps=4")
    assert res.returncode == 0, res.stderr[-3000:]
    res = train("schedule.total_steps=8", "run.seed=99")
    assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
    assert "run.seed: checkpoint 1234, now 99" in res.stderr and "--reset-data-order" in res.stderr
    assert "Traceback" not in res.stderr and "loader state does not match" not in res.stderr
    assert complete_tags(ckpts) == ["step00000004"]

    res = train("--reset-data-order", "schedule.total_steps=8", "run.seed=99")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "data order reset at step 4" in res.stdout
    assert complete_tags(ckpts) == ["step00000004", "step00000008"]
    # A requeue runs the same command again: the data order of the new seed continues, nothing is reset twice.
    res = train("--reset-data-order", "schedule.total_steps=12", "run.seed=99")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "data order reset" not in res.stdout and "resumed from" in res.stdout
