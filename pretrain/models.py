"""Family + size -> a `transformers` model built from scratch (no pretrained weights are ever fetched).

Initialisation is each family's own `_init_weights` in transformers (BERT/RoBERTa N(0, 0.02); GPT-2's
1/sqrt(2L)-scaled residual projections; T5's factor-scaled fan-in init), which is what the papers specify.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForMaskedLM,
    T5Config,
    T5ForConditionalGeneration,
)

from runconfig.model import ModelConfig

MODEL_CLASSES = {"roberta": RobertaForMaskedLM, "gpt2": GPT2LMHeadModel, "t5": T5ForConditionalGeneration}


def padded_vocab_size(tokenizer_len: int, multiple: int) -> int:
    """Round the embedding rows up for fast matmuls. Ids >= len(tokenizer) are never produced: the tokenizer
    cannot emit them, collators draw random tokens from the real vocabulary, and exported generation configs
    suppress them."""
    return -(-tokenizer_len // multiple) * multiple


def _special_ids(tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    return {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def build_hf_config(m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PretrainedConfig:
    vocab = padded_vocab_size(len(tokenizer), m.vocab_pad_multiple)
    ids = _special_ids(tokenizer)
    if m.family == "roberta":
        return RobertaConfig(
            vocab_size=vocab,
            hidden_size=m.hidden_size,
            num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads,
            intermediate_size=m.ffn_size,
            max_position_embeddings=m.max_position_embeddings,
            hidden_dropout_prob=m.dropout,
            attention_probs_dropout_prob=m.attention_dropout,
            layer_norm_eps=m.layer_norm_eps,
            initializer_range=m.initializer_range,
            type_vocab_size=1,
            tie_word_embeddings=m.tie_word_embeddings,
            **ids,
        )
    if m.family == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_positions=m.max_position_embeddings,
            n_embd=m.hidden_size,
            n_layer=m.num_layers,
            n_head=m.num_heads,
            n_inner=m.ffn_size,
            resid_pdrop=m.dropout,
            embd_pdrop=m.dropout,
            attn_pdrop=m.attention_dropout,
            layer_norm_epsilon=m.layer_norm_eps,
            initializer_range=m.initializer_range,
            tie_word_embeddings=m.tie_word_embeddings,
            **ids,
        )
    if m.family == "t5":
        return T5Config(
            vocab_size=vocab,
            d_model=m.hidden_size,
            d_kv=m.d_kv or m.hidden_size // m.num_heads,
            d_ff=m.ffn_size,
            num_layers=m.num_layers,
            num_decoder_layers=m.num_decoder_layers or m.num_layers,
            num_heads=m.num_heads,
            dropout_rate=m.dropout,
            layer_norm_epsilon=m.layer_norm_eps,
            initializer_factor=m.initializer_range,
            feed_forward_proj=m.feed_forward_proj,
            tie_word_embeddings=m.tie_word_embeddings,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    raise ValueError(f"model.family: unknown family {m.family!r}")


def build_model(m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PreTrainedModel:
    config = build_hf_config(m, tokenizer, seq_len)
    model = MODEL_CLASSES[m.family](config)
    return model


def count_parameters(model: PreTrainedModel, exclude_embeddings: bool = False) -> int:
    seen: set[int] = set()
    total = 0
    emb = {id(p) for n, p in model.named_parameters() if "embed" in n or "wte" in n or "wpe" in n or "shared" in n}
    for p in model.parameters():
        if id(p) in seen or (exclude_embeddings and id(p) in emb):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
