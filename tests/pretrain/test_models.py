"""Models from the size ladder: the right transformers classes, paper sizes, tied embeddings, padded vocab."""

import pytest
import torch

from pretrain.run.models import build_model, padded_vocab_size
from pretrain.tools.plan import _VocabOnly, model_param_counts
from runconfig import load_config


def test_padded_vocab():
    assert padded_vocab_size(50265, 8) == 50272 and padded_vocab_size(8000, 64) == 8000
    assert padded_vocab_size(8001, 64) == 8064


@pytest.mark.parametrize(
    "preset,lo,hi",
    [
        ("roberta-base", 124e6, 126e6),
        ("gpt2-small", 123e6, 125e6),
        ("gpt2-medium", 353e6, 356e6),
        ("t5-small", 60e6, 61e6),
        ("t5-base", 222e6, 224e6),
        ("modernbert-base", 149.5e6, 149.8e6),
        ("modernbert-large", 395.7e6, 396e6),  # published: 149M, 395M
    ],
)
def test_ladder_parameter_counts_match_papers(preset, lo, hi):
    total, _ = model_param_counts(load_config(f"configs/{preset}.yaml"))
    assert lo <= total <= hi, total


@pytest.mark.parametrize("preset", ["roberta-tiny", "gpt2-tiny", "t5-tiny", "modernbert-tiny"])
def test_tiny_models_tie_embeddings_and_run(preset):
    cfg = load_config(f"configs/{preset}.yaml")
    tok = _VocabOnly(1000)
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    assert model.config.vocab_size == padded_vocab_size(1000, cfg.model.vocab_pad_multiple)
    out_emb, in_emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert out_emb.data_ptr() == in_emb.data_ptr()
    ids = torch.randint(5, 1000, (2, 16))
    kwargs = {"labels": ids} if cfg.model.family != "roberta" else {"labels": ids}
    loss = model(input_ids=ids, **kwargs).loss
    assert torch.isfinite(loss)


def test_gpt2_uses_the_fused_tanh_gelu():
    """GPT-2's tanh GELU as one fused kernel (`gelu_pytorch_tanh`, the same function as `gelu_new` to 2e-7): the
    composed `gelu_new` ran as a chain of elementwise kernels, the largest non-matmul cost in an H100 profile."""
    cfg = load_config("configs/gpt2-tiny.yaml")
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    assert model.config.activation_function == "gelu_pytorch_tanh"


@pytest.mark.parametrize("preset", ["roberta-tiny", "gpt2-tiny"])
def test_seq_len_is_checked_where_the_model_is_built(preset):
    """The family builders never read seq_len (issue 47 item 6): the model builder checks it against the family's
    position table, naming both keys; a length that fits builds."""
    cfg = load_config(f"configs/{preset}.yaml")
    limit = cfg.model.max_position_embeddings - (2 if preset.startswith("roberta") else 0)
    with pytest.raises(
        ValueError, match=rf"packing.seq_len \({limit + 1}\).*max_position_embeddings.*{limit} usable"
    ):
        build_model(cfg.model, _VocabOnly(1000), limit + 1)
    assert build_model(cfg.model, _VocabOnly(1000), limit).config.vocab_size >= 1000


def test_t5_has_no_position_table_to_bound_seq_len():
    cfg = load_config("configs/t5-tiny.yaml")
    assert build_model(cfg.model, _VocabOnly(1000), 10 * cfg.model.max_position_embeddings) is not None
