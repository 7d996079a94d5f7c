"""GPT causal LM collator: labels, padding, and document masking proven against a real GPT2LMHeadModel."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from data_pipeline.objectives import CausalCollator, build_collator
from pretrain.objectives import prepare_model
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
# Only the special-token ids matter to this collator; ids 0..4 as contract 2's BPE: <s> <pad> </s> <unk> <mask>.
TOK = SimpleNamespace(pad_token_id=1, eos_token_id=2)
VOCAB = 97


def _packed(docs: list[np.ndarray], seq: int, pad: int = 1, eos: int = 2) -> dict:
    """One contiguous block: doc EOS doc EOS ..., padded at the end, segment_ids = document index."""
    ids = np.concatenate([np.append(d, eos) for d in docs])
    seg = np.concatenate([np.full(len(d) + 1, k) for k, d in enumerate(docs)])
    assert ids.size <= seq
    # Padding gets the last document's index, as a packer that just extends the array would do.
    return {
        "input_ids": np.pad(ids, (0, seq - ids.size), constant_values=pad),
        "segment_ids": np.pad(seg, (0, seq - seg.size), constant_values=seg[-1]),
        "sample_id": 0,
        "epoch": 0,
    }


@pytest.fixture(scope="module")
def docs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(5, VOCAB, size=n) for n in (13, 21, 9)]


def _gpt2(attn: str) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=2,
        eos_token_id=2,
        pad_token_id=1,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    cfg._attn_implementation = attn
    model = GPT2LMHeadModel(cfg)
    # transformers only detects packed documents from position_ids when no KV cache is built: the trainer
    # calls this hook (a no-op for other objectives) on the model it trains.
    prepare_model(
        load_config(ROOT / "configs" / "gpt2-tiny.yaml", ["objective.document_masking=true"]), model
    )
    assert model.config.use_cache is False
    return model


def test_plain_concatenation_labels_and_padding(docs):
    out = CausalCollator(TOK)([_packed(docs, 64), _packed(docs[:1], 64)])
    ids, labels = out["input_ids"], out["labels"]
    assert set(out) == {"input_ids", "attention_mask", "labels"}
    pad = ids == 1
    assert (labels[pad] == -100).all() and torch.equal(labels[~pad], ids[~pad])
    assert torch.equal(out["attention_mask"].bool(), ~pad)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_document_masking_matches_documents_run_alone(attn, docs):
    model = _gpt2(attn)  # training mode (no dropout), as the trainer runs it
    sample = _packed(docs, 64)
    batch = CausalCollator(TOK, document_masking=True)([sample, _packed(docs[::-1], 64)])
    assert set(batch) == {"input_ids", "position_ids", "labels"}
    with torch.no_grad():
        packed = model(**batch).logits
        plain = model(input_ids=batch["input_ids"]).logits
    start = 0
    for k, d in enumerate(docs):
        n = len(d) + 1
        alone_ids = torch.from_numpy(np.append(d, 2))[None]
        with torch.no_grad():
            alone = model(input_ids=alone_ids).logits[0]
        diff = (packed[0, start : start + n] - alone).abs().max().item()
        assert diff <= 1e-5, (k, diff)
        if k:  # without document masking, later documents see earlier ones: the test can tell
            assert (plain[0, start : start + n] - alone).abs().max().item() > 1e-3
        # positions restart, the first token of each document is not predicted from the previous document
        assert batch["position_ids"][0, start : start + n].tolist() == list(range(n))
        assert batch["labels"][0, start].item() == -100
        assert torch.equal(batch["labels"][0, start + 1 : start + n], alone_ids[0, 1:])
        start += n
    assert (batch["labels"][0, start:] == -100).all()


def test_gpt2_loss_finite_and_masking_changes_loss(docs):
    model = _gpt2("sdpa")
    samples = [_packed(docs, 64), _packed(docs[1:], 64)]
    plain = model(**CausalCollator(TOK)(samples)).loss
    masked = model(**CausalCollator(TOK, document_masking=True)(samples)).loss
    assert torch.isfinite(plain) and torch.isfinite(masked) and plain.item() != masked.item()
    masked.backward()


def test_pad_equals_eos_keeps_real_eos_labels(docs):
    tok = SimpleNamespace(pad_token_id=2, eos_token_id=2)
    s = _packed(docs[:2], 64, pad=2)
    out = CausalCollator(tok)([s])
    n = len(docs[0]) + len(docs[1]) + 2
    assert out["labels"][0, n - 1].item() == 2  # the final EOS is a real target
    assert (out["labels"][0, n:] == -100).all()
    assert out["attention_mask"][0, :n].all() and not out["attention_mask"][0, n:].any()


def test_line_by_line_and_errors(docs):
    cfg = load_config(
        ROOT / "configs" / "gpt2-tiny.yaml", ["packing.mode=line_by_line", "objective.document_masking=true"]
    )
    coll = build_collator(cfg, TOK)
    assert isinstance(coll, CausalCollator) and not coll.packed
    out = coll([{"input_ids": d, "sample_id": i} for i, d in enumerate(docs)])
    assert out["input_ids"].shape == (3, max(map(len, docs)))
    assert (out["labels"][1, len(docs[1]) :] == -100).all()
    packed = build_collator(
        load_config(ROOT / "configs" / "gpt2-tiny.yaml", ["objective.document_masking=true"]), TOK
    )
    with pytest.raises(KeyError, match="segment_ids"):
        packed([{"input_ids": docs[0], "sample_id": 0}])
    with pytest.raises(ValueError, match="1-D"):
        packed(
            [{"input_ids": np.zeros((2, 3), dtype=np.int64), "segment_ids": np.zeros((2, 3)), "sample_id": 0}]
        )


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_full_blocks_carry_no_attention_mask(attn):
    """Packed blocks without padding need no mask: an all-ones mask changes no logit, but transformers reads it on
    the host every forward (a device sync) and, under torch.compile, cannot drop it, so SDPA leaves its flash
    kernel. Measured on an H100 (bench/mfu_gpu.py), so the collator leaves it out."""
    rng = np.random.default_rng(3)
    full = [{"input_ids": rng.integers(5, VOCAB, size=32), "sample_id": i, "epoch": 0} for i in range(3)]
    out = CausalCollator(TOK)(full)
    assert set(out) == {"input_ids", "labels"}
    model = _gpt2(attn).eval()
    with torch.no_grad():
        bare = model(**out)
        masked = model(**out, attention_mask=torch.ones_like(out["input_ids"]))
    torch.testing.assert_close(bare.logits, masked.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(bare.loss, masked.loss, rtol=0, atol=1e-6)
    # one padded row is enough for the whole batch to carry the mask
    padded = CausalCollator(TOK)(full[:2] + [dict(full[2], input_ids=full[2]["input_ids"][:20])])
    assert set(padded) == {"input_ids", "attention_mask", "labels"}
