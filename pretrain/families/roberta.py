"""RoBERTa (Liu et al. 2019): post-LN BERT encoder, learned positions offset by padding_idx + 1, MLM head.
This module is the whole family: its spec (data, fine-tune recipe, builders) and its config builder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pretrain.families import shapes
from pretrain.families.registry import bert_config_keys, masked_encoder, token_ids_for

if TYPE_CHECKING:
    from runconfig.model import ModelConfig


def build_config(m: ModelConfig, tokenizer: Any, vocab_size: int):
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=vocab_size,
        **bert_config_keys(m),
        type_vocab_size=1,
        **token_ids_for(tokenizer, "pad_token_id", "bos_token_id", "eos_token_id"),
    )


SPEC = masked_encoder(
    name="roberta",
    reserved_positions=2,
    mlm_head="lm_head",
    model_class="RobertaForMaskedLM",
    # Liu et al. 2019, Table 10 (GLUE): warmup 6% of the steps, weight decay 0.1. Their LRs (1e-5..3e-5) are for
    # 125M-355M models; the budget presets' 4 x 128 encoders (both arms) fine-tune at 3e-4..1e-3 (measured,
    # bench/transfer.py), as small BERTs do (Turc et al. 2019: 1e-4..3e-4 and above).
    finetune_defaults={"lr_grid": [3.0e-4, 1.0e-3], "warmup_ratio": 0.06, "weight_decay": 0.1},
    lora_modules_to_save=("classifier",),
    build_config=build_config,
    mup_readout=("lm_head.layer_norm", "lm_head.decoder"),
    param_count=shapes.roberta,
)
