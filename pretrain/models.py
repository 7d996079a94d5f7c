"""Family + size -> a `transformers` model built from scratch (no pretrained weights are ever fetched).

The family's spec (pretrain/families/) gives the HF config and class. Initialisation is each family's own
`_init_weights` in transformers (BERT/RoBERTa N(0, 0.02); GPT-2's 1/sqrt(2L)-scaled residual projections; T5's
factor-scaled fan-in init), which is what the papers specify.
"""

from __future__ import annotations

from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.families import get_family
from runconfig.model import ModelConfig


def padded_vocab_size(tokenizer_len: int, multiple: int) -> int:
    """Round the embedding rows up for fast matmuls. Ids >= len(tokenizer) are never produced: the tokenizer
    cannot emit them, collators draw random tokens from the real vocabulary, and exported generation configs
    suppress them."""
    return -(-tokenizer_len // multiple) * multiple


def build_hf_config(m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PretrainedConfig:
    vocab = padded_vocab_size(len(tokenizer), m.vocab_pad_multiple)
    return get_family(m.family).build_config(m, tokenizer, seq_len, vocab)


def build_model(m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PreTrainedModel:
    return get_family(m.family).model_cls()(build_hf_config(m, tokenizer, seq_len))


def count_parameters(model: PreTrainedModel, exclude_embeddings: bool = False) -> int:
    seen: set[int] = set()
    total = 0
    emb = {
        id(p)
        for n, p in model.named_parameters()
        if "embed" in n or "wte" in n or "wpe" in n or "shared" in n
    }
    for p in model.parameters():
        if id(p) in seen or (exclude_embeddings and id(p) in emb):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
