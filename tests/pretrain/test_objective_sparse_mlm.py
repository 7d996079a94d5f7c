"""Sparse prediction for MLM (ModernBERT / Cramming): the vocabulary projection runs only on masked positions.

It must be the same objective: the loss and every gradient equal the dense forward's (up to float reduction
order), the logits without labels (parity, export, fine-tuning) are the full dense ones, and the key turns it off.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from data_pipeline.objectives import MLMCollator
from pretrain.objectives import prepare_model
from pretrain.run.models import build_model
from runconfig import ConfigError, load_config


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {
        t: i
        for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", *(f"w{i}" for i in range(300))])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def _cfg(*extra: str):
    return load_config(
        "configs/roberta-tiny.yaml",
        [
            "model.hidden_size=32",
            "model.num_heads=2",
            "model.ffn_size=64",
            "model.dropout=0.0",
            "model.attention_dropout=0.0",
            "packing.seq_len=32",
            *extra,
        ],
    )


def _batch(tok, n: int = 6, seq: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tok), (n, seq), generator=g)
    ids[:, 0], ids[:, -1] = tok.bos_token_id, tok.eos_token_id
    coll = MLMCollator(tok, seed=0, mlm_probability=0.15)
    return coll([{"input_ids": r.numpy(), "sample_id": i, "epoch": 0} for i, r in enumerate(ids)])


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_sparse_prediction_is_the_same_objective():
    tok = _tokenizer()
    batch = _batch(tok)
    assert (batch["labels"] != -100).sum() > 0
    torch.manual_seed(0)
    dense = build_model(_cfg().model, tok, 32)
    sparse = build_model(_cfg().model, tok, 32)
    sparse.load_state_dict(dense.state_dict())
    prepare_model(_cfg(), sparse)  # sparse_prediction defaults to on for MLM
    prepare_model(_cfg("objective.sparse_prediction=false"), dense)
    d_out, d_grads = _loss_and_grads(dense, batch)
    s_out, s_grads = _loss_and_grads(sparse, batch)
    assert torch.allclose(d_out.loss, s_out.loss, rtol=1e-6, atol=1e-7)
    assert d_out.logits.shape[:2] == batch["input_ids"].shape  # dense: every position
    assert s_out.logits.shape[0] == int((batch["labels"] != -100).sum())  # sparse: the masked ones only
    assert d_grads.keys() == s_grads.keys()
    for name, g in d_grads.items():
        assert torch.allclose(g, s_grads[name], rtol=1e-4, atol=1e-7), name
    plain = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():  # no labels (parity, export, fine-tune features): the full dense logits
        assert torch.equal(dense(**plain).logits, sparse(**plain).logits)
    assert "sparse" not in "".join(sparse.state_dict())  # nothing added to the checkpointed weights


def test_sparse_prediction_key_is_validated():
    with pytest.raises(ConfigError, match="objective.sparse_prediction"):
        load_config("configs/roberta-tiny.yaml", ["objective.sparse_prediction=maybe"])


def test_a_deep_copy_runs_its_own_weights():
    """copy.deepcopy of a model with sparse prediction (an EMA or reference copy, a bench's second arm) trains and
    predicts with the copy's weights, not the original's: the replaced forward is bound to its model."""
    import copy

    tok = _tokenizer()
    cfg = _cfg()
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, cfg.packing.seq_len).eval()
    prepare_model(cfg, model)
    batch = _batch(tok)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
        ours, theirs = model(**batch).loss, twin(**batch).loss
        dense = type(twin).forward(twin, **batch).loss
    assert not torch.allclose(ours, theirs)
    assert torch.allclose(theirs, dense, atol=1e-5)  # the copy's sparse loss is its own dense loss
