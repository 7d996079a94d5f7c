"""bench/electra_context.py: the token-identity bound it compares the discriminator against is the BCE of the best
classifier that sees each token alone, checked against a simulation of the corruption it models."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import electra_context as ec  # noqa: E402


def test_identity_bound_matches_the_simulated_best_per_token_classifier():
    rng = np.random.default_rng(0)
    special, candidates = {0}, list(range(1, 21))
    # a Zipf-like stream over 20 tokens with some special tokens in it (never replaced)
    weights = 1.0 / np.arange(1, 21)
    stream = rng.choice(np.arange(1, 21), size=20_000, p=weights / weights.sum())
    stream[::50] = 0
    bound = ec.identity_bound(Counter(stream.tolist()), candidates, special)

    # Simulate the corruption many times; the best token-identity classifier predicts, for each shown token, the
    # fraction of its showings that were replacements; its BCE is the conditional entropy of the simulation.
    shown, replaced = [], []
    for _ in range(40):
        sel = (rng.random(stream.shape) < ec.MASK_RATE) & (stream != 0)
        draw = rng.choice(candidates, size=stream.shape)
        corrupted = np.where(sel, draw, stream)
        shown.append(corrupted)
        replaced.append(corrupted != stream)
    shown, replaced = np.concatenate(shown), np.concatenate(replaced)
    h = 0.0
    for w in np.unique(shown):
        y = replaced[shown == w]
        p = y.mean()
        if 0 < p < 1:
            h -= len(y) * (p * math.log(p) + (1 - p) * math.log(1 - p))
    simulated = h / len(shown)
    assert abs(bound - simulated) < 0.01 * simulated
    # and it is below the prior: token identity alone tells something
    q = replaced.mean()
    assert bound < -(q * math.log(q) + (1 - q) * math.log(1 - q)) - 0.01


# ------------------------------------------------------------------------------- ModernBERT ablations (issue 46)
def _tiny_wordpiece():
    from tokenizers import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    wp = BertWordPieceTokenizer(lowercase=True)
    text = ["shares rose on tuesday as markets closed higher", "the team won the final match at home"] * 20
    wp.train_from_iterator(text, vocab_size=200, show_progress=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=wp._tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


TINY = ["model.num_layers=2", "model.hidden_size=32", "model.num_heads=2", "model.ffn_size=48"]


@pytest.mark.integration  # eight tiny bodies built and trained: a few seconds each on a loaded 2-core host
@pytest.mark.timeout(300)
@pytest.mark.parametrize("switch", [*ec.ABLATIONS, "post_ln+abs_pos"])
def test_each_ablation_reverts_its_difference_and_trains(switch, monkeypatch):
    import torch

    monkeypatch.setattr(ec, "SEQ_LEN", 16)
    hf = _tiny_wordpiece()
    torch.manual_seed(0)
    base, _, _ = ec.build("modernbert", hf, len(hf), TINY)
    torch.manual_seed(0)
    model, _, logits_of = ec.build(f"modernbert:{switch}", hf, len(hf), TINY)
    b, m = base.body, model.body
    switches = switch.split("+")
    if "post_ln" in switches:
        assert type(m.layers[0]).__name__ == "PostLN" and isinstance(m.final_norm, torch.nn.Identity)
    if "abs_pos" in switches:
        assert m.embeddings.tok_embeddings.pos.weight.shape[1] == 32
        ids = torch.tensor([[5, 6, 7, 8]])
        cos, sin = m.rotary_emb(m.embeddings(ids), torch.arange(4)[None], "full_attention")
        assert bool((cos == 1).all()) and bool((sin == 0).all())
    if "geglu" in switches:
        assert b.layers[0].mlp.Wi.out_features == 96 and m.layers[0].mlp.Wi.out_features == 48
    if "bias" in switches:
        assert b.layers[0].attn.Wqkv.bias is None and m.layers[0].attn.Wqkv.bias is not None
        assert m.layers[0].mlp.Wi.bias is not None and m.final_norm.bias is not None
    if "embedding_norm" in switches:
        assert isinstance(m.embeddings.norm, torch.nn.Identity)
    if "depth_init" in switches:  # the output projections at the plain std, not std / sqrt(2 L) = std / 2
        assert float(m.layers[0].mlp.Wo.weight.detach().std()) > 1.5 * float(
            b.layers[0].mlp.Wo.weight.detach().std()
        )
    if "local_attention" in switches:
        assert b.config.layer_types[1] == "sliding_attention"
        assert set(m.config.layer_types) == {"full_attention"}
    # a few training steps on the replaced-token task move the loss
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(5, len(hf), (8, 16), generator=torch.Generator().manual_seed(0))
    y = (torch.rand(8, 16, generator=torch.Generator().manual_seed(1)) < 0.15).float()
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits_of(ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_unknown_ablation_and_ablating_another_body_are_refused():
    with pytest.raises(ValueError, match="unknown switch"):
        ec._parse_ablation("geglu+rope")
    with pytest.raises(ValueError, match="modernbert body only"):
        ec.build("electra:geglu", _tiny_wordpiece(), 200, TINY)


@pytest.mark.timeout(120)
def test_minutes_picks_the_steps_from_a_timed_copy_and_trains_that_many(monkeypatch, capsys):
    """`--minutes` (the GPU run of issue 46): the step count is fixed by timing a throwaway copy first, so the
    schedule is whole; the floor is 100 steps."""
    import torch

    monkeypatch.setattr(ec, "SEQ_LEN", 16)
    hf = _tiny_wordpiece()
    data = torch.randint(5, len(hf), (64, 16), generator=torch.Generator().manual_seed(0))
    cand = torch.arange(5, len(hf))
    special = torch.tensor(sorted(set(hf.all_special_ids)))
    rep = ec.C.Report("electra_context_test", save=False)
    bce = ec.train("electra", hf, data, data[:8], cand, special, 0, 1e-3, TINY, rep, batch=4, minutes=1e-4)
    out = capsys.readouterr().out
    assert "ms per step of 4 sequences on cpu: 100 steps" in out, out
    assert "step 100: held-out BCE" in out and math.isfinite(bce)
