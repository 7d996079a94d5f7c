"""train x SIGKILL for the families no other kill test covers (issue 25): T5 (span corruption, dropout 0.1),
GPT-2 and Llama (causal, contiguous blocks). RoBERTa takes 20 kills in tests/pretrain/test_chaos.py, ModernBERT
and ELECTRA 3 in tests/pretrain/test_exact_resume.py; this file reuses that test's kill helpers.

Each family: a ZeRO-2 run on 2 ranks, SIGKILLed 3 times at different steps (the first while a checkpoint is being
written, the others at a seeded random moment after the restart made progress), resumed each time. The final
weights equal an uninterrupted run's tensor for tensor, and so does the loss trace: every train row the killed
run logged (also those of steps it redid after a kill) has the same loss, gradient norm and LR as the reference's
row of that step, and every eval row the same loss."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

from pretrain.checkpoint import complete_tags
from tests.pretrain.conftest import ROOT, RUN_YAML, gpt2_run, t5_run, torchrun  # noqa: F401 - session fixtures used by name
from tests.pretrain.test_exact_resume import OVERRIDES, _final_weights, _kill_tree, _saving_now, _start
from tests.pretrain.test_train_deepspeed import isolated

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(900)]

KILLS = 3
# Train rows: the values that follow from the weights, data and schedule alone (not the clock).
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_seen")


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory, gpt2_run) -> Path:  # noqa: F811 - gpt2_run is the imported fixture
    """Llama reads the same byte-level BPE tokens as GPT-2 (`<|endoftext|>` between documents): share them."""
    root = tmp_path_factory.mktemp("llama")
    out = root / "run"
    out.mkdir()
    for stage in ("clean", "dedup", "tokenizer", "tokens"):
        (out / stage).symlink_to((gpt2_run.parent / "run" / stage).resolve())
    cfg = root / "llama.yaml"
    cfg.write_text(RUN_YAML.format(root=ROOT, family="llama", out=out))
    return cfg


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def _trace_differences(ref_dir: Path, got_dir: Path) -> list[str]:
    """Every row of the killed run against the reference's row of the same step and split."""
    ref = {(r["split"], r["step"]): r for r in _rows(ref_dir)}
    got = _rows(got_dir)
    assert {(r["split"], r["step"]) for r in got} == set(ref), "the killed run logged other steps"
    diffs = []
    for r in got:
        want = ref[(r["split"], r["step"])]
        for key in TRAIN_KEYS if r["split"] == "train" else ("loss",):
            if r[key] != want[key]:
                diffs.append(f"{r['split']} step {r['step']} {key}: {r[key]!r} != {want[key]!r}")
    return diffs


@pytest.mark.parametrize("family", ["t5", "gpt2", "llama"])
def test_three_sigkills_then_resume_is_bit_exact(family, request, tmp_path):
    run_config = request.getfixturevalue(f"{family}_run")
    ref_dir, kill_dir = tmp_path / "ref", tmp_path / "killed"
    ref_dir.mkdir()
    kill_dir.mkdir()
    torchrun(run_config, [isolated(run_config, ref_dir), *OVERRIDES], timeout=600)

    out = isolated(run_config, kill_dir)
    ckpt_dir = kill_dir / "run" / "checkpoints"
    rng = random.Random(f"{family}-20261124")
    kills: list[str] = []
    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as log:
        # Kill 1: while a checkpoint is being written (after the first complete one). Kills 2 and 3: a seeded
        # random moment after the restarted run has written a new complete checkpoint, so each restart really
        # resumes mid-run and the kills land at different steps.
        while len(kills) < KILLS:
            before = set(complete_tags(ckpt_dir))
            p = _start(run_config, out, log)
            t0, kill_at = time.time(), None
            while p.poll() is None:
                done_now = set(complete_tags(ckpt_dir)) - before
                if not kills and done_now and _saving_now(ckpt_dir):
                    _kill_tree(p)
                    kills.append(f"mid-checkpoint after {sorted(done_now)}")
                elif kills and done_now and kill_at is None:
                    kill_at = time.time() + rng.uniform(0.0, 1.5)
                elif kill_at is not None and time.time() >= kill_at:
                    _kill_tree(p)
                    kills.append(f"at {time.time() - t0:.1f}s, complete: {complete_tags(ckpt_dir)}")
                time.sleep(0.005)
            assert p.returncode != 0, f"the run finished before kill {len(kills) + 1}: {kills}"
        p = _start(run_config, out, log)
        assert p.wait(timeout=600) == 0, log_path.read_text()[-4000:]
    text = log_path.read_text()
    assert text.count("resumed from") >= KILLS, text[-3000:]
    assert (
        "skipping damaged checkpoint" not in text
    )  # a kill leaves an incomplete folder, never a damaged one

    ref, got = _final_weights(ref_dir / "run"), _final_weights(kill_dir / "run")
    assert ref.keys() == got.keys()
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not different, (
        f"{family} after kills {kills}: {len(different)} tensors differ, e.g. {different[:3]}"
    )
    diffs = _trace_differences(ref_dir / "run", kill_dir / "run")
    assert not diffs, f"{family} after kills {kills}: the loss trace differs: {diffs[:5]}"
