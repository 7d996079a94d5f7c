"""Training and export with `run.output_dir=s3://...` on a real S3 API (moto in server mode): the real DeepSpeed
engine on 2 CPU ranks reads its token shards from the bucket, saves checkpoints locally and uploads them
(COMPLETE, then `latest`, last), resumes from the bucket after the local staging folder is deleted, and the export
is written to the bucket from a fresh staging folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.storage import RunStore
from tests.moto_s3 import s3_server_module, s3fs_client  # noqa: F401  (fixture)
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun

# one worker runs the module: the remote run (a module fixture) is trained once, not per worker
pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(420),
              pytest.mark.xdist_group("remote-run")]  # fmt: skip

URL = "s3://runs/gpt"


@pytest.fixture(scope="module")
def remote_run(s3_server_module, gpt2_run, tmp_path_factory):  # noqa: F811
    """The prepared tokenizer and token shards uploaded to the bucket (the data path to s3 is tested in
    tests/data_pipeline/test_remote_outputs.py); 8 steps trained there, checkpoints every 4."""
    fs = s3fs_client(s3_server_module)
    fs.mkdir("runs")
    local = gpt2_run.parent / "run"
    RunStore(local.resolve(), URL).push([(local / "tokenizer").resolve(), (local / "tokens").resolve()])
    stage = tmp_path_factory.mktemp("stage") / "a"
    res = torchrun(gpt2_run, [f"run.output_dir={URL}", f"run.local_dir={stage}"])
    return {"fs": fs, "config": gpt2_run, "stage": stage, "log": res.stdout + res.stderr}


def _tags(fs) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls("runs/gpt/checkpoints") if "/step" in p)


def test_train_checkpoints_to_s3_and_resumes_from_the_bucket(remote_run, tmp_path):
    fs, stage = remote_run["fs"], remote_run["stage"]
    fs.invalidate_cache()
    assert _tags(fs) == ["step00000004", "step00000008"]
    assert fs.cat("runs/gpt/checkpoints/latest").decode() == "step00000008"
    complete = json.loads(fs.cat("runs/gpt/checkpoints/step00000008/COMPLETE"))
    for name, entry in complete["files"].items():  # every file COMPLETE lists is in the bucket, same size
        assert fs.size(f"runs/gpt/checkpoints/step00000008/{name}") == entry["size"], name
    assert fs.exists("runs/gpt/logs/metrics.jsonl") and fs.exists("runs/gpt/resolved_config.yaml")
    assert not fs.exists("runs/gpt/train.lock")

    shutil.rmtree(stage)  # the local cache is gone (another node, a wiped scratch disk)
    res = torchrun(remote_run["config"], [f"run.output_dir={URL}", f"run.local_dir={stage}",
                                          "schedule.total_steps=12", "logging.plots=true"])  # fmt: skip
    log = res.stdout + res.stderr
    assert "resumed from" in log and "at step 8" in log, log[-3000:]
    fs.invalidate_cache()
    assert _tags(fs) == ["step00000008", "step00000012"]  # keep_last: 2, in the bucket too
    assert fs.cat("runs/gpt/checkpoints/latest").decode() == "step00000012"
    rows = [json.loads(x) for x in fs.cat("runs/gpt/logs/metrics.jsonl").decode().splitlines()]
    assert max(r["step"] for r in rows) == 12
    assert fs.exists("runs/gpt/logs/plots/loss.png")  # written at the end of training, uploaded with the logs
    fs.rm("runs/gpt/logs/plots", recursive=True)
    res = run_module(["-m", "pretrain", "plot", URL], check=True)  # on demand, from the bucket, into it
    assert "s3://runs/gpt/logs/plots/loss.png" in res.stdout
    fs.invalidate_cache()
    assert fs.exists("runs/gpt/logs/plots/loss.png")


def test_export_from_the_bucket_to_s3(remote_run, tmp_path):
    fs = remote_run["fs"]
    fs.mkdir("exports")
    run_module(["-m", "pretrain", "export", "--config", str(remote_run["config"]), "--out", "s3://exports/gpt-tiny",
                f"run.output_dir={URL}", f"run.local_dir={tmp_path / 'fresh'}"])  # fmt: skip
    fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in fs.find("exports/gpt-tiny")}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "training_state.json"} <= names
    got = tmp_path / "downloaded"
    fs.get("exports/gpt-tiny/", str(got), recursive=True)
    code = ("import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; "
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(type(m).__name__, len(t('a test')['input_ids']) > 0)")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", code, str(got)], capture_output=True, text=True, env=child_env(),
                         cwd=ROOT, timeout=120)  # fmt: skip
    assert res.returncode == 0 and "GPT2LMHeadModel True" in res.stdout, res.stderr[-2000:]
    state = json.loads((got / "training_state.json").read_text())
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] <= 1e-5


def _fake_checkpoint(ckpt_dir: Path, tag: str, payload: bytes) -> None:
    """A checkpoint folder as save_checkpoint leaves it (files, then COMPLETE listing them; no engine needed)."""
    from pretrain.checkpoint.verify import write_complete
    from pretrain.checkpoint.writer import file_entries

    folder = ckpt_dir / tag
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(payload)
    (folder / "rng_rank00000.pt").write_bytes(b"rng" + payload[:8])
    write_complete(
        folder,
        {"step": int(tag[4:]), "world_size": 1},
        file_entries(folder, ["mp_rank_00_model_states.pt", "rng_rank00000.pt"]),
    )
    (ckpt_dir / "latest").write_text(tag)


def test_resume_skips_a_damaged_or_unfinished_remote_checkpoint(s3_server_module, tmp_path, capsys):  # noqa: F811
    from pretrain.checkpoint.remote import upload_checkpoint
    from pretrain.checkpoint.resume import select_resume_tag

    fs = s3fs_client(s3_server_module)
    fs.mkdir("ckpts")
    url = "s3://ckpts/run/checkpoints"
    src = tmp_path / "writer/checkpoints"
    for step, payload in ((4, b"a" * 4096), (8, b"b" * 4096)):
        _fake_checkpoint(src, f"step{step:08d}", payload)
        assert upload_checkpoint(src, f"step{step:08d}", url, keep_last=3)
    assert "uploaded step00000008" in capsys.readouterr().out
    # step 12 was cut off during its upload: files but no COMPLETE in the bucket
    _fake_checkpoint(src, "step00000012", b"c" * 4096)
    fs.put(str(src / "step00000012/mp_rank_00_model_states.pt"), "ckpts/run/checkpoints/step00000012/")
    # step 8 was damaged in the bucket after its upload: same size, other bytes
    fs.pipe("ckpts/run/checkpoints/step00000008/mp_rank_00_model_states.pt", b"x" * 4096)
    fresh = tmp_path / "reader/checkpoints"
    warnings: list[str] = []
    assert select_resume_tag(fresh, warn=warnings.append, remote=url) == "step00000004"
    assert any(
        "skipping damaged checkpoint" in w and "step00000008" in w and "checksum" in w for w in warnings
    )
    assert not (fresh / "step00000012").exists()  # never downloaded: its COMPLETE is not in the bucket
    assert (fresh / "step00000004/COMPLETE").is_file()
    # a local copy damaged in place (same size) while the bucket's is good: fetched again, not skipped
    (fresh / "step00000004/mp_rank_00_model_states.pt").write_bytes(b"z" * 4096)
    fs.pipe("ckpts/run/checkpoints/latest", b"step00000004")
    assert select_resume_tag(fresh, warn=warnings.append, remote=url) == "step00000004"
    assert (fresh / "step00000004/mp_rank_00_model_states.pt").read_bytes() == b"a" * 4096
    # a local checkpoint newer than the bucket's (its upload failed): verified, uploaded, used
    _fake_checkpoint(fresh, "step00000016", b"d" * 4096)
    assert select_resume_tag(fresh, warn=warnings.append, remote=url) == "step00000016"
    assert any("step00000016 is newer than every checkpoint" in w for w in warnings)
    assert fs.exists("ckpts/run/checkpoints/step00000016/COMPLETE")


def test_checkpoint_resume_may_name_a_checkpoint_in_a_bucket(s3_server_module, tmp_path):  # noqa: F811
    from core.preflight import check_train
    from pretrain.checkpoint.remote import fetch_url, upload_checkpoint
    from pretrain.checkpoint.verify import verify_files
    from runconfig import load_config
    from runconfig.load import ConfigError

    fs = s3fs_client(s3_server_module)
    fs.mkdir("loads")
    src = tmp_path / "w/checkpoints"
    _fake_checkpoint(src, "step00000006", b"q" * 1000)
    assert upload_checkpoint(src, "step00000006", "s3://loads/a/checkpoints", keep_last=2)
    local, tag = fetch_url("s3://loads/a/checkpoints/step00000006", tmp_path / "cache")
    assert tag == "step00000006" and not verify_files(local / tag)
    over = [f"run.output_dir={tmp_path}/run"]
    check_train(load_config(ROOT / "configs/gpt2-tiny.yaml", [*over, "checkpoint.resume=s3://loads/a/checkpoints/"
                                                                       "step00000006"]), "cpu")  # fmt: skip
    with pytest.raises(
        ConfigError,
        match=r"checkpoint.resume: s3://loads/a/checkpoints/step00000009 is not a "
        r"complete checkpoint \(no COMPLETE file\)",
    ):
        check_train(
            load_config(
                ROOT / "configs/gpt2-tiny.yaml",
                [*over, "checkpoint.resume=s3://loads/a/checkpoints/step00000009"],
            ),
            "cpu",
        )
