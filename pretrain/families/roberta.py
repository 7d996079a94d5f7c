"""RoBERTa (Liu et al. 2019): post-LN BERT encoder, learned positions offset by padding_idx + 1, MLM head."""

from __future__ import annotations

from typing import Any

from pretrain.families.registry import FamilySpec, register_family
from runconfig.model import ModelConfig


def special_ids(tokenizer: Any) -> dict[str, Any]:
    return {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id}  # fmt: skip


def build_config(m: ModelConfig, tokenizer: Any, seq_len: int, vocab_size: int):
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=vocab_size,
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
        **special_ids(tokenizer),
    )


SPEC = register_family(FamilySpec(
    name="roberta",
    build_config=build_config,
    model_class="RobertaForMaskedLM",
    task="masked_lm",
    objectives=("mlm",),
    tokenizer_types=("bpe", "wordpiece"),
    auto_class="AutoModelForMaskedLM",
    reserved_positions=2,
    mlm_head="lm_head",
    # Liu et al. 2019, Table 10 (GLUE): warmup 6% of the steps, weight decay 0.1. Their LRs (1e-5..3e-5) are
    # for 125M-355M models; the budget presets' 4 x 128 encoders (both arms) fine-tune at 3e-4..1e-3 (measured,
    # bench/transfer.py), as small BERTs do (Turc et al. 2019: 1e-4..3e-4 and above for the smallest).
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.06, "weight_decay": 0.1},
))
