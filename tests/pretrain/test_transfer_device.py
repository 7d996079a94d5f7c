"""Transfer scoring on the model's own device. The Trainer moves a fine-tuned model to the GPU; the scoring that
follows (label-string ranking, classifier logits, the probe's pooled states, the token-cosine check) fed it CPU
batches, so `pretrain transfer` on a GPU machine failed after its first fine-tune. Runs where CUDA is (the lent
GPU machine), skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tokenizer(n: int = 64):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(n - 3)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]", eos_token="</s>")


def _encoded(tok, n: int = 12):
    from pretrain.transfer import Encoded

    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 60, size=int(rng.integers(6, 20)))) for _ in range(n)]
    feats = [{"input_ids": tok(t)["input_ids"], "labels": 0} for t in texts]
    return Encoded(feats, np.arange(n), np.arange(n) % 2)


def test_scoring_runs_on_the_models_device():
    from transformers import (
        ElectraConfig,
        ElectraForSequenceClassification,
        ElectraModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    from pretrain.transfer import _pooled, _predict, token_cosine
    from runconfig.finetune import FinetuneConfig

    tok, ft = _tokenizer(), FinetuneConfig()
    enc = _encoded(tok)
    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64, pad_token_id=0)  # fmt: skip
    cls = ElectraForSequenceClassification(ElectraConfig(num_labels=2, **small)).cuda()
    assert _predict(cls, tok, enc, ft, False, None).shape == (12,)
    t5 = T5ForConditionalGeneration(
        T5Config(
            vocab_size=64,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            pad_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=0,
        )  # fmt: skip
    ).cuda()
    pred = _predict(t5, tok, enc, ft, True, [[3, 2], [4, 2]])
    assert pred.shape == (12,) and set(pred) <= {0, 1}
    body = ElectraModel(ElectraConfig(**small)).cuda()
    assert _pooled(body, tok, enc, ft).shape == (12, 32)
    assert 0.0 < token_cosine(body, tok, enc, ft) < 1.0
