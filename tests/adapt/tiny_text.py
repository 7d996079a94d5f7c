"""Tiny word-level text, tokenizer and ELECTRA shapes for the transfer-scoring tests: no corpus, no training."""

from __future__ import annotations

from typing import Any

import numpy as np

TINY_ELECTRA: dict[str, Any] = dict(
    vocab_size=64,
    embedding_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    pad_token_id=0,
)


def word_tokenizer(n: int = 64):
    """Words `w0` .. `w{n-3}` after [PAD]=0 and [UNK]=1."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(n - 2)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="[PAD]", unk_token="[UNK]")


def word_examples(tok, n: int, gold: np.ndarray, min_len: int = 8, max_len: int = 30):
    """`n` random word sequences as transfer.Encoded, one window per example, with the given gold labels."""
    from adapt.inputs import Encoded

    rng = np.random.default_rng(0)
    texts = [
        " ".join(f"w{i}" for i in rng.integers(0, 62, size=int(rng.integers(min_len, max_len))))
        for _ in range(n)
    ]
    feats = [{"input_ids": tok(t)["input_ids"], "labels": 0} for t in texts]
    return Encoded(feats, np.arange(n), gold)
