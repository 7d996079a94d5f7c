"""Transfer scoring on the model's own device. The Trainer moves a fine-tuned model to the GPU; the scoring that
follows (label-string ranking, classifier logits, the probe's pooled states, the token-cosine check) fed it CPU
batches, so `adapt transfer` on a GPU machine failed after its first fine-tune. Runs where CUDA is (the lent
GPU machine), skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_scoring_runs_on_the_models_device():
    from transformers import (
        ElectraConfig,
        ElectraForSequenceClassification,
        ElectraModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    from adapt.probes import pooled, token_cosine
    from adapt.transfer import _predict
    from runconfig.finetune import FinetuneConfig
    from tests.adapt.tiny_text import TINY_ELECTRA, word_examples, word_tokenizer

    tok, ft = word_tokenizer(), FinetuneConfig()
    enc = word_examples(tok, 12, np.arange(12) % 2, min_len=6, max_len=20)
    cls = ElectraForSequenceClassification(ElectraConfig(num_labels=2, **TINY_ELECTRA)).cuda()
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
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    ).cuda()
    pred = _predict(t5, tok, enc, ft, True, [[3, 1], [4, 1]])
    assert pred.shape == (12,) and set(pred) <= {0, 1}
    body = ElectraModel(ElectraConfig(**TINY_ELECTRA)).cuda()
    assert pooled(body, tok, enc, ft).shape == (12, 32)
    assert 0.0 < token_cosine(body, tok, enc, ft) < 1.0
