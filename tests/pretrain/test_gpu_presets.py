"""The GPU presets (issue 42, item 5): no dropout where the family's reference allows it, no KV cache in training,
activation checkpointing only where `pretrain plan` says memory needs it, the chunked LM-head loss."""

from __future__ import annotations

import pytest
import torch

from pretrain.objectives import prepare_model
from pretrain.run.models import build_model
from pretrain.tools.plan import _VocabOnly, activation_gib, param_counts
from runconfig import load_config

pytestmark = pytest.mark.timeout(120)
CARD_GIB = 80


@pytest.mark.parametrize("preset", ["gpt2-medium", "llama-medium"])
def test_gpu_presets_fit_one_card_without_checkpointing(preset):
    cfg = load_config(f"configs/{preset}.yaml")
    assert cfg.model.dropout == cfg.model.attention_dropout == 0.0
    assert cfg.objective.chunked_loss and not cfg.deepspeed.activation_checkpointing
    total, _ = param_counts(cfg)
    model_state = 16 * total / 2**30  # ZeRO 0, mixed precision: 16 bytes a parameter
    assert model_state + activation_gib(cfg, cfg.batch.micro_batch_size, 50304) < 0.6 * CARD_GIB


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_training_builds_no_kv_cache(family):
    cfg = load_config(f"configs/{family}-tiny.yaml")
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len).train()
    prepare_model(cfg, model)
    ids = torch.randint(5, 1000, (2, 16))
    out = model(input_ids=ids, labels=ids)
    assert not model.config.use_cache and out.past_key_values is None
