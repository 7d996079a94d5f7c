"""A quiet console: DeepSpeed's accelerator notice and zero_to_fp32's prints and progress bars, torch-style FutureWarnings,
transformers' load reports and "Loading weights" progress bars, and warcio's "Record not followed by newline" go to <run>/logs/third_party.log, not the terminal; --verbose shows
them. Real libraries, imported after the CLI has read its config (as every command does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import argparse, io, sys, warnings
from runconfig.cli import add_config_args, config_from_args
p = argparse.ArgumentParser()
add_config_args(p)
p.add_argument("--deepspeed", action="store_true")
args = p.parse_args(sys.argv[1:])
cfg = config_from_args(args)
if args.deepspeed:
    import deepspeed  # logs "Setting accelerator to CPU" while importing
warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated", FutureWarning)
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers.modeling_utils").warning("RobertaModel LOAD REPORT from: x")
from data_pipeline.readers.warc import ArchiveIterator
bad = (b"WARC/1.0\r\nWARC-Type: resource\r\nWARC-Target-URI: http://x/\r\nWARC-Record-ID: <urn:x>\r\n"
       b"Content-Length: 5\r\n\r\nhello world\r\n\r\n")
list(ArchiveIterator(io.BytesIO(bad)))
import tempfile
from transformers import GPT2Config, GPT2LMHeadModel
d = tempfile.mkdtemp()
GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).save_pretrained(d)
GPT2LMHeadModel.from_pretrained(d)  # transformers 5 draws a "Loading weights" progress bar on stderr
from core.log import third_party_prints
from tqdm import tqdm
with third_party_prints("DeepSpeed"):  # as export calls DeepSpeed's zero_to_fp32, which print()s and draws tqdm bars
    print("Reconstructed fp32 state dict with 52 params")
    for _ in tqdm(range(2), desc="Loading checkpoint shards"):  # on stderr (seen in a fresh-clone make demo)
        pass
print("our one-line message")
"""


def _run(tmp_path, *extra):
    argv = [
        sys.executable,
        "-c",
        SCRIPT,
        "--config",
        "configs/demo.yaml",
        f"run.output_dir={tmp_path}/run",
        *extra,
    ]
    # DS_ACCELERATOR unset (make exports it): DeepSpeed then detects the CPU and says so, the notice checked below.
    # HF_HUB_DISABLE_PROGRESS_BARS too: an in-process test that routed third-party output set it in this worker.
    dropped = ("LMSTACK_VERBOSE", "DS_ACCELERATOR", "HF_HUB_DISABLE_PROGRESS_BARS")
    env = {k: v for k, v in __import__("os").environ.items() if k not in dropped}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_third_party_notices_go_to_the_run_log(tmp_path):
    res = _run(tmp_path, "--deepspeed")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "our one-line message\n" and res.stderr == "", (res.stdout, res.stderr)
    log = (tmp_path / "run" / "logs" / "third_party.log").read_text()
    for needle in (
        "Setting accelerator to CPU",
        "FutureWarning",
        "LOAD REPORT",
        "Record not followed by newline",
        "Reconstructed fp32 state dict",
        "Loading checkpoint shards",
    ):
        assert needle in log, needle


def test_verbose_shows_them(tmp_path):
    res = _run(tmp_path, "--verbose")
    assert res.returncode == 0, res.stderr
    for needle in ("FutureWarning", "LOAD REPORT", "Record not followed by newline", "Loading weights"):
        assert needle in res.stderr, needle
    assert "Reconstructed fp32 state dict" in res.stdout + res.stderr
    assert "Loading checkpoint shards" in res.stderr
    assert not (tmp_path / "run" / "logs" / "third_party.log").exists()


def _warn_like_a_load_report() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.modeling_utils").warning("LOAD REPORT from a worker")


def test_transfer_arm_workers_route_third_party_notices_too(tmp_path, capfd, monkeypatch):
    """The transfer stage fine-tunes its arms in spawned worker processes: their transformers load reports go to
    the run's log file as the parent's do, not to the terminal (seen in `make demo`)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from adapt.transfer import _arm_worker_init

    monkeypatch.delenv("LMSTACK_VERBOSE", raising=False)
    with ProcessPoolExecutor(
        1, mp_context=mp.get_context("spawn"), initializer=_arm_worker_init, initargs=(1, tmp_path / "logs")
    ) as pool:
        pool.submit(_warn_like_a_load_report).result()
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err
    assert "LOAD REPORT from a worker" in (tmp_path / "logs" / "third_party.log").read_text()
