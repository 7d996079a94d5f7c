"""Issue 25 row 11 / item 8: `pretrain plan` runs the load-time checks `train` runs, without loading the model,
and a bad config ends in one `error:` line naming the key, never a traceback or a normal-looking plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "roberta-tiny.yaml"


def _tokens(run: Path) -> None:
    """A run folder whose token stage has finished (plan reads the manifest's presence only)."""
    (run / "tokens").mkdir(parents=True)
    (run / "tokens" / "manifest.json").write_text(json.dumps({"sources": {}}))


def _plan(capsys, *overrides: str) -> tuple[int, str, str]:
    from pretrain.__main__ import main

    try:
        rc = main(["plan", "--config", str(TINY), *overrides])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_of_a_good_config_still_prints_the_plan(tmp_path, capsys):
    _tokens(tmp_path / "run")
    rc, out, err = _plan(capsys, f"run.output_dir={tmp_path}/run")
    assert rc == 0 and "resume" in out and not err, err
    # Before the data stages ran: the plan, and a note that the tokens are still to be made.
    rc, out, err = _plan(capsys, f"run.output_dir={tmp_path}/fresh")
    assert rc == 0 and "resume" in out and "note: run.output_dir: no token shards" in err, err


@pytest.mark.parametrize(
    "case", ["resume_missing", "resume_incomplete", "fp16_cpu", "no_data", "unwritable", "ckpt_under_file"]
)
def test_plan_refuses_what_train_refuses(tmp_path, capsys, case):
    run = tmp_path / "run"
    _tokens(run)
    over = [f"run.output_dir={run}"]
    key = {
        "resume_missing": "checkpoint.resume",
        "resume_incomplete": "checkpoint.resume",
        "fp16_cpu": "deepspeed.precision",
        "no_data": "data.sources.0.paths.0",
        "unwritable": "run.output_dir",
        "ckpt_under_file": "checkpoint.dir",
    }[case]
    if case == "resume_missing":
        over.append(f"checkpoint.resume={tmp_path}/nowhere/step00000100")
    elif case == "resume_incomplete":
        (tmp_path / "ck" / "step00000100").mkdir(parents=True)
        over.append(f"checkpoint.resume={tmp_path}/ck/step00000100")
    elif case == "fp16_cpu":
        from pretrain.run.engine import accelerator_name

        if accelerator_name() != "cpu":
            pytest.skip("fp16 is fine on a GPU accelerator")
        over.append("deepspeed.precision=fp16")
    elif case == "no_data":  # no token shards yet, and the sources the data stages would read are missing
        over = [f"run.output_dir={tmp_path}/other", f"data.sources.0.paths=[{tmp_path}/no-such-corpus/*.txt]"]
    elif case == "unwritable":
        over = ["run.output_dir=/proc/lmstack-plan-test"]  # refused even to root
    elif case == "ckpt_under_file":
        (tmp_path / "afile").write_text("x")
        over.append(f"checkpoint.dir={tmp_path}/afile/checkpoints")
    rc, out, err = _plan(capsys, *over)
    assert rc == 2, (out, err)
    assert err.startswith("error: ") and key in err, err
    assert "Traceback" not in err and "resume            " not in out
