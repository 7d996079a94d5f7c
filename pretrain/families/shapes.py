"""Parameter counts from the config alone (no torch, no transformers): what `pretrain plan` prints in a second
instead of building the model. Each family's count mirrors the module tree its transformers class builds
(shared/tied weights counted once); tests/pretrain/test_plan_speed.py checks them against a meta-device build.

Each function returns (total parameters, parameters of the largest single module), the two numbers the ZeRO
memory estimators take.
"""

from __future__ import annotations

from typing import Any


def padded_vocab(cfg: Any) -> int:
    """The embedding rows the model gets: the tokenizer's size rounded up to model.vocab_pad_multiple."""
    mult = cfg.model.vocab_pad_multiple
    return -(-cfg.tokenizer.vocab_size // mult) * mult


def generator_shape(hidden: int, layers: int, opts: Any) -> dict[str, int]:
    """The ELECTRA generator's width, depth, heads and FFN from the discriminator's and the `electra` objective's
    options (reference: get_generator_config)."""
    width = int(round(hidden * opts.generator_hidden_fraction))
    return {
        "hidden_size": width,
        "num_hidden_layers": max(1, int(round(layers * opts.generator_layers_fraction))),
        "num_attention_heads": opts.generator_num_heads or max(1, width // 64),
        "intermediate_size": opts.generator_ffn_size or 4 * width,
    }


def bert_layer(h: int, f: int) -> int:
    """Self-attention (q, k, v, output with biases) + LayerNorm, FFN in/out with biases + LayerNorm."""
    return 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h


def roberta(cfg: Any) -> tuple[int, int]:
    m, v = cfg.model, padded_vocab(cfg)
    h, f = m.hidden_size, m.ffn_size
    emb = v * h + m.max_position_embeddings * h + h + 2 * h  # word, position, one token type, LayerNorm
    head = h * h + h + 2 * h + v + (0 if m.tie_word_embeddings else v * h)  # dense, LayerNorm, decoder bias
    return emb + m.num_layers * bert_layer(h, f) + head, v * h + v


def gpt2(cfg: Any) -> tuple[int, int]:
    m, v = cfg.model, padded_vocab(cfg)
    h, f = m.hidden_size, m.ffn_size
    layer = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
    head = 0 if m.tie_word_embeddings else v * h
    return v * h + m.max_position_embeddings * h + m.num_layers * layer + 2 * h + head, v * h


def t5(cfg: Any, buckets: int = 32) -> tuple[int, int]:
    m, v = cfg.model, padded_vocab(cfg)
    h, f, heads = m.hidden_size, m.ffn_size, m.num_heads
    inner = (m.d_kv or h // heads) * heads
    ffn = (3 if m.feed_forward_proj.startswith("gated") else 2) * h * f
    attn = 4 * h * inner  # q, k, v, o without biases
    enc = m.num_layers * (h + attn + h + ffn) + buckets * heads + h
    dec = (m.num_decoder_layers or m.num_layers) * (h + attn + h + attn + h + ffn) + buckets * heads + h
    head = 0 if m.tie_word_embeddings else v * h
    return v * h + enc + dec + head, v * h


def modernbert(cfg: Any) -> tuple[int, int]:
    """No biases but the decoder's; LayerNorms without bias; the first layer's attention norm is an identity."""
    m, v = cfg.model, padded_vocab(cfg)
    h, f = m.hidden_size, m.ffn_size
    layer = h + 3 * h * h + h * h + h + h * 2 * f + f * h
    head = h * h + h + v + (0 if m.tie_word_embeddings else v * h)
    return v * h + h + m.num_layers * layer - h + h + head, v * h + v
