"""The transfer signal in the loop (issue 44 item 1), end to end on 2 DeepSpeed CPU ranks: a GPT-2 trained on two
sources (the WARC sample crawl and BBC News) logs, at every eval, the held-out loss of each source beside the mixed
one, and a linear probe on the BBC task for the current weights and, once at the start, for random init. Checked
against a recomputation from the final checkpoint, in TensorBoard's event files, in the plots, across a resume, and
against a run without the probe (the probe must not move the training RNG: GPT-2 trains with dropout here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pretrain.run.probe_eval import PROBE_MAX_EXAMPLES
from tests.pretrain.conftest import ROOT, run_module, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(1800)]

# configs/gpt2-tiny.yaml keeps the demo's two sources (crawl, bbc with a labelled hold-out)
RUN_YAML = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: it-evalsig, output_dir: {out}}}
data: {{clean: {{docs_per_shard: 400, workers: 2}}}}
tokenizer: {{vocab_size: 1500}}
packing: {{seq_len: 64}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, ffn_size: 128}}
batch: {{global_batch_size: 8, micro_batch_size: 2}}
optim: {{lr: 1.0e-3}}
schedule: {{total_steps: 8, warmup_steps: 2}}
checkpoint: {{every_steps: 4, keep_last: 3}}
eval: {{every_steps: 4, max_batches: 3, probe_task: bbc}}
loader: {{num_workers: 1, eval_fraction: 0.1}}
logging: {{every_steps: 1, progress_bar: false, peak_flops: 1.0e+11, plots: true}}
finetune: {{source: bbc, max_length: 64, eval_batch_size: 32}}
"""


@pytest.fixture(scope="module")
def two_source_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evalsig")
    cfg = root / "run.yaml"
    cfg.write_text(RUN_YAML.format(root=ROOT, out=root / "run"))
    run_module(["-m", "data_pipeline", "all", "--config", str(cfg)], timeout=600)
    return cfg


def _fresh(config: Path, folder: Path) -> str:
    """Its own run folder, sharing the prepared data."""
    out = folder / "run"
    out.mkdir(parents=True)
    for name in ("clean", "dedup", "tokenizer", "tokens"):
        (out / name).symlink_to((config.parent / "run" / name).resolve())
    return f"run.output_dir={out}"


def _rows(run: Path, split: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r["split"] == split}


def _recomputed(cfg, ckpt_dir: Path, tag: str) -> dict[str, tuple[float, int]]:
    """Each source's held-out loss of the checkpointed weights, on the batches every rank evaluates, outside
    DeepSpeed: (sample-weighted loss, samples)."""
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from pretrain.export.convert import load_trained_model

    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    model = load_trained_model(cfg, ckpt_dir, tag, tok)
    out = {}
    loaders = [PretrainLoader(cfg, r, 2, split="eval", collate_fn=build_collator(cfg, tok)) for r in range(2)]
    for name in loaders[0].source_names:
        total, n = 0.0, 0
        with torch.no_grad():
            for ld in loaders:
                for w, batch in ld.iter_source(name, cfg.eval.max_batches):
                    if w:
                        total += float(model(**batch).loss) * w
                        n += w
        out[name] = (total / max(n, 1), n)
    return out


def _tensorboard_tags(logs: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logs))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_per_source_loss_and_probe_in_the_loop(two_source_run, tmp_path):
    from runconfig import load_config

    overrides = [_fresh(two_source_run, tmp_path / "probe")]
    torchrun(two_source_run, overrides, timeout=600)
    cfg = load_config(two_source_run, overrides)
    run = Path(cfg.run.root)
    ev = _rows(run, "eval")
    assert sorted(ev) == [0, 4, 8]

    # the random-init probe, once, before the first step; then the current weights at each eval
    start = ev[0]
    assert start["probe/task"] == "bbc" and 0.0 <= start["probe/accuracy"] <= 1.0
    assert start["probe/random_init_accuracy"] == start["probe/accuracy"]
    for step in (4, 8):
        row = ev[step]
        assert 0.0 <= row["probe/accuracy"] <= 1.0 and 0.0 <= row["probe/train_accuracy"] <= 1.0
        assert row["probe/random_init_accuracy"] == start["probe/accuracy"]
        cap = PROBE_MAX_EXAMPLES
        assert 0 < row["probe/train_examples"] <= cap and 0 < row["probe/dev_examples"] <= cap
        assert 0 < row["probe/majority_accuracy"] < 1

    # per source: present, and what the checkpointed weights give on the same batches outside DeepSpeed
    want = _recomputed(cfg, Path(cfg.checkpoint_dir), "step00000008")
    assert set(want) == {"crawl", "bbc"} and all(n > 0 for _, n in want.values()), want
    for name, (loss, _) in want.items():
        assert ev[8][f"loss/{name}"] == pytest.approx(loss, rel=1e-4), name
        assert ev[8][f"perplexity/{name}"] == pytest.approx(math.exp(loss), rel=1e-3), name
    mixed = sum(loss * n for loss, n in want.values()) / sum(n for _, n in want.values())
    assert ev[8]["loss"] == pytest.approx(mixed, rel=1e-4)
    assert ev[8]["loss/crawl"] != pytest.approx(ev[8]["loss/bbc"], rel=1e-3)  # two figures, not one copied

    tags = _tensorboard_tags(run / "logs")
    for tag in ("eval/probe/accuracy", "eval/probe/random_init_accuracy", "eval/loss/bbc", "eval/loss/crawl"):
        assert tag in tags, sorted(tags)
    assert tags["eval/probe/accuracy"] == pytest.approx([ev[s]["probe/accuracy"] for s in (0, 4, 8)])
    assert {"probe.png", "loss_by_source.png"} <= {p.name for p in (run / "logs" / "plots").iterdir()}

    # the probe leaves the training RNG alone: the same run without it trains the same losses (dropout on)
    plain = [_fresh(two_source_run, tmp_path / "plain"), "eval.probe_task=null"]
    torchrun(two_source_run, plain, timeout=600)
    plain_run = Path(load_config(two_source_run, plain).run.root)
    losses = {s: r["loss"] for s, r in _rows(run, "train").items()}
    assert losses == {s: r["loss"] for s, r in _rows(plain_run, "train").items()}
    assert all("probe/accuracy" not in r for r in _rows(plain_run, "eval").values())

    # a resume takes the random-init figure from the checkpoint: nothing measured again at its start
    torchrun(two_source_run, [*overrides, "schedule.total_steps=12"], timeout=600)
    after = _rows(run, "eval")
    assert sorted(after) == [0, 4, 8, 12] and after[0] == start
    assert after[12]["probe/random_init_accuracy"] == start["probe/accuracy"]
