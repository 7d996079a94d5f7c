"""FLOPs per token, PaLM appendix B: 6N + 12 * layers * width * seq, where N counts matmul weights, so the input
embedding of an untied model (Llama: a lookup) is left out and a tied one (GPT-2: also the LM head) stays.
The expected figures are worked out by hand below, not by the code under test; the models are built on the
meta device (shapes only)."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from pretrain.run.metrics import flops_per_token, untied_input_embedding
from pretrain.run.models import count_parameters
from runconfig.model import ModelConfig

pytestmark = pytest.mark.timeout(60)


def test_gpt2_medium_counts_its_tied_embedding_once_as_the_head():
    v, d, layers, ffn, seq = 50304, 1024, 24, 4096, 1024
    with torch.device("meta"):
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=v,
                n_positions=seq,
                n_embd=d,
                n_layer=layers,
                n_head=16,
                n_inner=ffn,
                tie_word_embeddings=True,
            )
        )
    m = ModelConfig(family="gpt2", hidden_size=d, num_layers=layers, num_heads=16, ffn_size=ffn)
    # wte 50,304 x 1,024 = 51,511,296; wpe 1,024 x 1,024 = 1,048,576; ln_f 2,048; per layer: ln_1 2,048 +
    # c_attn 3,145,728 + 3,072 + c_proj 1,048,576 + 1,024 + ln_2 2,048 + c_fc 4,194,304 + 4,096 + c_proj 4,194,304
    # + 1,024 = 12,596,224; x 24 = 302,309,376
    n = 51_511_296 + 1_048_576 + 2_048 + 302_309_376
    assert n == 354_871_296
    assert count_parameters(model) == n and untied_input_embedding(model) == 0
    # 6N = 2,129,227,776; 12 x 24 x 1,024 x 1,024 = 301,989,888
    expected = 2_129_227_776 + 301_989_888
    assert flops_per_token(m, count_parameters(model), seq, untied_input_embedding(model)) == expected


def test_tinyllama_leaves_out_its_untied_input_embedding():
    v, d, layers, ffn, seq = 32000, 2048, 22, 5632, 2048
    with torch.device("meta"):
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=v,
                hidden_size=d,
                intermediate_size=ffn,
                num_hidden_layers=layers,
                num_attention_heads=32,
                num_key_value_heads=4,
                max_position_embeddings=seq,
                tie_word_embeddings=False,
            )
        )
    m = ModelConfig(
        family="llama",
        hidden_size=d,
        num_layers=layers,
        num_heads=32,
        ffn_size=ffn,
        tie_word_embeddings=False,
    )
    # embed_tokens 32,000 x 2,048 = 65,536,000 (a lookup); lm_head the same (a matmul); norm 2,048; per layer:
    # q 4,194,304 + k 524,288 (4 KV heads x 64) + v 524,288 + o 4,194,304 + gate/up/down 3 x 11,534,336
    # + 2 norms 4,096 = 44,044,288; x 22 = 968,974,336
    n = 65_536_000 + 65_536_000 + 2_048 + 968_974_336
    assert n == 1_100_048_384
    assert count_parameters(model) == n and untied_input_embedding(model) == 65_536_000
    # 6 x (1,100,048,384 - 65,536,000) = 6 x 1,034,512,384 = 6,207,074,304; 12 x 22 x 2,048 x 2,048 = 1,107,296,256
    expected = 6_207_074_304 + 1_107_296_256
    assert flops_per_token(m, count_parameters(model), seq, untied_input_embedding(model)) == expected


@pytest.mark.parametrize(
    "preset,vocab,pad,expected",
    [
        ("gpt2-medium", 50257, 50304, 2_129_227_776 + 301_989_888),  # the tied GPT-2 medium above
        ("llama-1b", 32000, 32000, 6_207_074_304 + 1_107_296_256),
    ],  # TinyLlama above: its input embedding left out
)
def test_a_configs_flops_per_token_leaves_out_the_untied_input_embedding(preset, vocab, pad, expected):
    """What `pretrain plan` and bench/gpu.py count from a config alone, without building the model: the same
    figures as the trainer (an H200 run of bench/gpu.py once counted the 1.1B Llama's input embedding: +5.4% MFU)."""
    from pathlib import Path

    from pretrain.tools.plan import config_flops_per_token
    from runconfig import load_config

    root = Path(__file__).resolve().parents[2]
    overrides = [f"tokenizer.vocab_size={vocab}", f"model.vocab_pad_multiple={pad}"]
    cfg = load_config(root / "configs" / f"{preset}.yaml", overrides)
    assert config_flops_per_token(cfg) == expected


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_the_sequence_contrastive_loss_counts_its_second_discriminator_pass(weight):
    """modernbert-rtd-budget's SCL runs the discriminator again, forward and backward, on 0.9 of each sequence
    (issue 46): the trainer's MFU and `plan` count it, as 0.9 x the discriminator's own FLOPs per token."""
    from pathlib import Path

    from pretrain.run.metrics import flops_per_token, objective_rerun
    from pretrain.tools.plan import config_flops_per_token, meta_module
    from runconfig import load_config

    root = Path(__file__).resolve().parents[2]
    on = load_config(
        root / "configs" / "modernbert-rtd-budget.yaml", [f"objective.options.contrastive_weight={weight}"]
    )
    off = load_config(
        root / "configs" / "modernbert-rtd-budget.yaml", ["objective.options.contrastive_weight=0"]
    )
    # The discriminator (body + detection head), h 128, 4 layers, feed-forward 192, bias-free body: embedding norm
    # 128; per layer Wqkv 128 x 384 = 49,152 + Wo 16,384 + GeGLU Wi 128 x 384 = 49,152 + Wo 192 x 128 = 24,576 + the
    # MLP norm 128 + the attention norm 128 (not in layer 0: ModernBERT's first layer has none) = 139,520; x 4 - 128
    # = 557,952; final norm 128; head 128 x 128 + 128 = 16,512 and 128 + 1 = 129. Its input embedding is a lookup.
    weights = 128 + 557_952 + 128 + 16_512 + 129
    assert weights == 574_849
    module = meta_module(on)  # the module the trainer trains, as its meta-device twin
    assert objective_rerun(on, module) == ((weights, 0.9) if weight else (0, 0.0))
    # seq 128 within every layer's window: 4 x 128 keys, 12 x 128 x 512 attention FLOPs per token
    extra = 0.9 * (6 * weights + 12 * 128 * 512) if weight else 0.0
    assert config_flops_per_token(on) == pytest.approx(config_flops_per_token(off) + extra)
    # the trainer's count
    n = count_parameters(module)
    assert flops_per_token(on.model, n, 128, untied_input_embedding(module), objective_rerun(on, module)) == (
        pytest.approx(flops_per_token(off.model, n, 128, untied_input_embedding(module)) + extra)
    )
