"""Configs that used to be accepted silently or failed only at run time (issue 12, items 13-14): rejected at
load or before the first stage, with the key named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.preflight import check_output_writable, check_train
from runconfig import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "configs/demo.yaml")


def test_duplicate_yaml_keys_are_rejected_naming_key_and_lines(tmp_path):
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(f"inherit: [{DEMO}]\noptim: {{lr: 1.0e-3, lr: 50.0}}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'optim.lr': line 2 column 9 and line 2 column 21"):
        load_config(cfg)
    cfg.write_text(f"inherit: [{DEMO}]\nschedule:\n  total_steps: 10\n  warmup_steps: 1\n  total_steps: 20\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'schedule.total_steps': line 3 .* and line 5"):
        load_config(cfg)
    with pytest.raises(ConfigError, match="duplicate key 'lr'"):
        load_config(DEMO, ["optim={lr: 1, lr: 2}"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=.inf", "optim.lr: Input should be a finite number"),
        ("optim.eps=.nan", "optim.eps: Input should be a finite number"),
        ("optim.grad_clip=.inf", "optim.grad_clip: Input should be a finite number"),
        ("model.initializer_range=.inf", "model.initializer_range: Input should be a finite number"),
        ("optim.betas=[0.9,1.0]", "optim.betas.1: 1.0 is outside [0, 1)"),
        ("optim.betas=[-0.1,0.9]", "optim.betas.0: -0.1 is outside [0, 1)"),
        ("model.layer_norm_eps=0", "model.layer_norm_eps: Input should be greater than 0"),
        ("model.layer_norm_eps=-1e-5", "model.layer_norm_eps: Input should be greater than 0"),
        ("checkpoint.async_mode=maybe", "checkpoint.async_mode: Input should be 'disabled' or 'async'"),
    ],
)
def test_bad_numbers_fail_at_load(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, [override])
    assert message in str(e.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("checkpoint.async_save=false", "checkpoint.async_save was removed (False given): it is now checkpoint.async_mode (async_save: true -> "
         "async_mode: async, false -> disabled)"),
        ("checkpoint.async_writer=process", "checkpoint.async_writer was removed ('process' given): the writer process is gone"),
    ],
)  # fmt: skip
def test_the_old_async_checkpoint_keys_are_refused_naming_async_mode(override, message):
    """Two keys said one thing (issue 65, item 3): the old ones stop at load, the message naming the new key."""
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, [override])
    assert message in str(e.value) and len(str(e.value).splitlines()) == 2, str(e.value)  # file, then the key


def test_fp16_on_cpu_and_missing_resume_fail_before_training(tmp_path):
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}/run", "deepspeed.precision=fp16"])
    with pytest.raises(ConfigError, match="deepspeed.precision: fp16 needs a GPU accelerator"):
        check_train(cfg, "cpu")
    check_train(cfg, "cuda")
    cfg = load_config(
        DEMO, [f"run.output_dir={tmp_path}/run", f"checkpoint.resume={tmp_path}/nope/step00000010"]
    )
    with pytest.raises(ConfigError, match="checkpoint.resume: .*/nope/step00000010 does not exist"):
        check_train(cfg, "cpu")
    (tmp_path / "half").mkdir()
    cfg = load_config(DEMO, [f"run.output_dir={tmp_path}/run", f"checkpoint.resume={tmp_path}/half"])
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        check_train(cfg, "cpu")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere; the read-only case needs a normal user")
def test_unwritable_output_dir_unprivileged(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    cfg = load_config(DEMO, [f"run.output_dir={ro}/run"])
    with pytest.raises(ConfigError, match="run.output_dir: .* is not writable"):
        check_output_writable(cfg)


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the run folder should go")
    cfg = load_config(DEMO, [f"run.output_dir={blocker}/run"])
    with pytest.raises(ConfigError, match=r"run.output_dir: .*file/run is not writable"):
        check_output_writable(cfg)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_data_path_matching_nothing_names_the_source_key(tmp_path):
    res = _cli(
        "-m",
        "data_pipeline",
        "clean",
        "--config",
        DEMO,
        f"run.output_dir={tmp_path}/run",
        f"data.sources.1.paths=[{tmp_path}/missing/*.txt]",
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "data.sources.1.paths.0 (source 'bbc'): no files match" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "run" / "clean").exists()


def test_unwritable_output_dir_stops_before_any_stage(tmp_path):
    (tmp_path / "file").write_text("x")
    res = _cli("-m", "data_pipeline", "all", "--config", DEMO, f"run.output_dir={tmp_path}/file/run")
    assert res.returncode == 2 and "run.output_dir:" in res.stderr and "not writable" in res.stderr, (
        res.stderr
    )
    assert "Traceback" not in res.stderr


def test_absurd_vocabulary_warns():
    with pytest.warns(UserWarning, match="tokenizer.vocab_size"):
        load_config(DEMO, ["tokenizer.vocab_size=50000000"])


def test_adafactor_needs_zero_stage_0_naming_both_keys():
    """ZeRO shards would hide the whole matrices Adafactor factors and scales by: refused at load, not trained."""
    with pytest.raises(ConfigError, match=r"optim.name: 'adafactor' needs deepspeed.zero_stage: 0 \(got 2\)"):
        load_config(DEMO, ["optim.name=adafactor"])
    assert load_config(DEMO, ["optim.name=adafactor", "deepspeed.zero_stage=0"]).optim.name == "adafactor"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "override,suggests",
    [
        ("schedule.warmup_stpes=3", "schedule.warmup_stpes: unknown key; did you mean 'warmup_steps'?"),
        ("optim.weight_decy=0.1", "optim.weight_decay"),
        ("data.clean.langid.treshold=0.5", "threshold"),
        ("data.sources.0.text_feild=body", "text_field"),
    ],
)
def test_an_unknown_key_suggests_the_nearest(override, suggests):
    """Issue 43 friction 7: family names got a did-you-mean, misspelled keys did not."""
    from core.errors import ConfigError
    from runconfig import load_config

    with pytest.raises(ConfigError) as err:
        load_config(Path(__file__).resolve().parents[2] / "configs" / "roberta-tiny.yaml", [override])
    msg = str(err.value)
    assert "unknown key" in msg and "did you mean" in msg and suggests.split(".")[-1].split(":")[0] in msg, (
        msg
    )
    if "did you mean" in suggests:
        assert suggests in msg, msg
