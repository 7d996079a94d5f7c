"""T5 (Raffel et al. 2020): encoder-decoder, relative position buckets (no position table), span corruption."""

from __future__ import annotations

from typing import Any

from pretrain.families import shapes
from pretrain.families.registry import default_probe_inputs, implement_family
from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import T5Config

    return T5Config(
        vocab_size=vocab_size,
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


def probe_inputs(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """Encoder inputs plus 8 decoder positions starting from the decoder start token (pad)."""
    import torch

    batch = default_probe_inputs(tokenizer, texts)
    ids = batch["input_ids"]
    batch["decoder_input_ids"] = torch.cat(
        [torch.full((ids.shape[0], 1), tokenizer.pad_token_id), ids[:, :7]], dim=1
    )
    return batch


def attention_layers(m: ModelConfig) -> int:
    """Both stacks; the decoder runs on the (shorter) targets, so this is an upper bound for span corruption."""
    return m.num_layers + (m.num_decoder_layers or m.num_layers)


SPEC = implement_family(
    "t5",
    lora_modules_to_save=(),
    build_config=build_config,
    probe_inputs=probe_inputs,
    attention_layers=attention_layers,
    param_count=shapes.t5,
)
