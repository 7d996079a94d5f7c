"""ELECTRA replaced-token detection: config errors at load, the collator's sampling uniforms, the exactness and
statistics of the generator's samples, embedding sharing, and the two-folder export (in-process, CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import ElectraForMaskedLM, ElectraForPreTraining, ElectraForSequenceClassification

from data_pipeline.objectives import build_collator
from data_pipeline.objectives.mlm import special_token_ids
from pretrain.objectives import wrap_model
from pretrain.objectives.rtd import GENERATOR_DIR, export_pair, sample_tokens
from pretrain.run.models import build_model
from runconfig import load_config
from runconfig.load import ConfigError
from tests.data_pipeline.test_objective_mlm import ROOT, _full_sentences, wordpiece  # noqa: F401 (fixture)

TINY = str(ROOT / "configs" / "electra-tiny.yaml")
SEQ = 64


def _cfg(*overrides: str):
    return load_config(
        TINY,
        [
            "model.hidden_size=64",
            "model.num_layers=2",
            "model.num_heads=2",
            "model.ffn_size=128",
            f"packing.seq_len={SEQ}",
            *overrides,
        ],
    )


# ------------------------------------------------------------------------------------------- config errors
def _error(*overrides: str) -> str:
    with pytest.raises((ConfigError, ValueError)) as e:
        _cfg(*overrides)
    return str(e.value)


def test_generator_wider_than_discriminator_names_the_key():
    msg = _error("objective.options.generator_hidden_fraction=1.5")
    assert "objective.options.generator_hidden_fraction" in msg and "wider than the discriminator" in msg, msg


def test_electra_on_a_family_without_encoder_is_refused():
    msg = _error("model.family=gpt2", "tokenizer.type=bpe", "packing.mode=full_sentences")
    assert "objective.type" in msg and "'gpt2' has none" in msg and "electra" in msg, msg


def test_unknown_objective_lists_registered_ones():
    msg = _error("objective.type=electraa")
    assert "objective.type" in msg and "'electra'" in msg and "'mlm'" in msg, msg


def test_unknown_and_bad_options_name_the_key():
    assert "objective.options.generator_size" in _error("objective.options.generator_size=0.5")
    assert "objective.options.discriminator_weight" in _error("objective.options.discriminator_weight=-1")
    assert "objective.options.generator_num_heads" in _error("objective.options.generator_num_heads=3")
    msg = load_config(str(ROOT / "configs" / "roberta-tiny.yaml"), [])  # options on an objective without any
    assert msg.objective.options == {}
    with pytest.raises(
        (ConfigError, ValueError), match="objective.options: objective 'mlm' takes no options"
    ):
        load_config(str(ROOT / "configs" / "roberta-tiny.yaml"), ["objective.options.x=1"])


def test_defaults_follow_the_reference():
    cfg = _cfg()
    assert cfg.objective.mask_token_fraction == 0.85 and cfg.objective.random_token_fraction == 0.0
    assert cfg.objective.mlm_probability == 0.15


# ------------------------------------------------------------------------------------------- helpers
_BLOCKS: dict[int, list[dict]] = {}


def _blocks(tok, n: int) -> list[dict]:
    if n not in _BLOCKS:
        _BLOCKS[n] = _full_sentences(tok, n, SEQ, tok.cls_token_id, tok.sep_token_id)
    return _BLOCKS[n]


@pytest.fixture(scope="module")
def rtd(wordpiece):  # noqa: F811
    torch.manual_seed(0)
    cfg = _cfg()
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece)
    return cfg, model.eval()


# ------------------------------------------------------------------------------------------- collator
def test_sample_uniforms_are_a_pure_function_of_the_sample(rtd, wordpiece):  # noqa: F811
    cfg, _ = rtd
    collate = build_collator(cfg, wordpiece)
    samples = _blocks(wordpiece, 8)
    a = collate(samples)
    b = collate(samples[4:] + samples[:4])  # another batch composition
    assert a["sample_u"].dtype == torch.float32 and a["sample_u"].shape == a["input_ids"].shape
    assert float(a["sample_u"].min()) >= 0.0 and float(a["sample_u"].max()) < 1.0
    assert torch.equal(a["sample_u"][:4], b["sample_u"][4:])
    assert not torch.equal(collate([{**s, "epoch": 1} for s in samples])["sample_u"], a["sample_u"])


# ------------------------------------------------------------------------------------------- sampling
def test_inverse_cdf_sample_matches_the_softmax_and_never_draws_a_disallowed_token():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 12, generator=g) * 2
    allowed = torch.ones(12, dtype=torch.bool)
    allowed[[0, 5, 11]] = False
    n = 200_000
    u = torch.rand(n, generator=g)
    draws = sample_tokens(logits.expand(n, -1), allowed, u)
    counts = torch.bincount(draws, minlength=12).double()
    assert counts[~allowed].sum() == 0
    p = torch.softmax(logits[0].masked_fill(~allowed, float("-inf")), -1).double()
    chi2 = float((((counts - n * p) ** 2) / (n * p).clamp(min=1e-12))[allowed].sum())
    assert chi2 < 40.0, chi2  # 8 degrees of freedom: p < 1e-5 of exceeding 40 by chance


@pytest.fixture(scope="module")
def trained(wordpiece):  # noqa: F811
    """A generator trained a little (MLM, half of the selected tokens kept as they are), so that its error rate
    differs across positions: low where it can copy the kept token, high under [MASK]."""
    torch.manual_seed(0)
    cfg = _cfg("objective.mask_token_fraction=0.5")
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece).train()
    collate = build_collator(cfg, wordpiece)
    blocks = _blocks(wordpiece, 16)
    opt = torch.optim.Adam(model.generator.parameters(), lr=1e-2)
    for step in range(40):
        batch = collate([{**s, "sample_id": 1000 + step * 16 + j} for j, s in enumerate(blocks)])
        loss = model.generator(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return cfg, model.eval()


def test_replaced_fraction_matches_generator_error_rate_and_no_special_is_replaced(trained, wordpiece):  # noqa: F811
    cfg, model = trained
    collate = build_collator(cfg, wordpiece)
    specials = torch.tensor(special_token_ids(wordpiece))
    expected = variance = 0.0
    observed, n_masked = 0, 0
    for i in range(4):
        batch = collate([{**s, "sample_id": i * 16 + j} for j, s in enumerate(_blocks(wordpiece, 16))])
        with torch.no_grad():
            out = model(**batch)
            masked = batch["labels"] != -100
            original = torch.where(masked, batch["labels"], batch["input_ids"])
            hidden = model.generator.electra(batch["input_ids"], attention_mask=batch["attention_mask"])[0]
            logits = model.generator.generator_lm_head(model.generator.generator_predictions(hidden[masked]))
            p = torch.softmax(logits.float().masked_fill(~model.allowed, float("-inf")), -1)
            p_orig = p.gather(1, original[masked].unsqueeze(1)).squeeze(1).double()
        expected += float((1 - p_orig).sum())
        variance += float((p_orig * (1 - p_orig)).sum())
        observed += int(out.replaced.sum())
        n_masked += int(masked.sum())
        assert not bool((out.replaced.bool() & ~masked).any()), "a position that was not masked was replaced"
        assert not bool(out.replaced.bool()[torch.isin(original, specials)].any()), (
            "a special token was replaced"
        )
        assert not bool((out.replaced.bool() & (batch["attention_mask"] == 0)).any())
    rate = expected / n_masked
    assert 0.2 < rate < 0.9, f"the test needs an informative error rate, got {rate:.3f}"
    # A sum of independent Bernoulli(1 - p_orig): mean `expected`, variance sum p(1 - p); 4 sigma.
    assert abs(observed - expected) < 4 * math.sqrt(variance), (observed, expected, math.sqrt(variance))


def test_a_correct_sample_counts_as_original(rtd, wordpiece):  # noqa: F811
    cfg, model = rtd
    batch = build_collator(cfg, wordpiece)(_blocks(wordpiece, 4))
    masked = batch["labels"] != -100
    target = int(batch["labels"][masked][0])
    batch["labels"] = torch.where(masked, torch.full_like(batch["labels"], target), batch["labels"])
    with torch.no_grad():
        model.generator.generator_lm_head.bias.zero_()
        model.generator.generator_lm_head.bias[target] = 1e4  # the generator always proposes the original
        out = model(**batch)
    assert int(masked.sum()) > 0 and int(out.replaced.sum()) == 0


def test_sampled_tokens_never_special_and_samples_reproducible(rtd, wordpiece):  # noqa: F811
    cfg, model = rtd
    batch = build_collator(cfg, wordpiece)(_blocks(wordpiece, 8))
    with torch.no_grad():
        model.generator.generator_lm_head.bias.zero_()
        a, b = model(**batch), model(**batch)
    assert torch.equal(a.replaced, b.replaced) and torch.equal(a.loss, b.loss)


# ------------------------------------------------------------------------------------------- module
def test_embeddings_shared_and_gradients_reach_both_networks(wordpiece):  # noqa: F811
    torch.manual_seed(0)
    cfg = _cfg()
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece).train()
    g, d = model.generator, model.discriminator
    assert g.electra.embeddings is d.electra.embeddings
    assert g.generator_lm_head.weight is d.electra.embeddings.word_embeddings.weight
    assert g.config.hidden_size == 16 and d.config.hidden_size == 64  # 1/4 of the width by default
    assert g.config.num_attention_heads == 1 and g.config.intermediate_size == 64
    out = model(**build_collator(cfg, wordpiece)(_blocks(wordpiece, 4)))
    assert torch.allclose(out.loss, out.generator_loss + 50.0 * out.discriminator_loss)
    out.loss.backward()
    for name, p in (
        ("generator", g.electra.encoder.layer[0].attention.self.query.weight),
        ("discriminator", d.discriminator_predictions.dense_prediction.weight),
        ("shared embeddings", d.electra.embeddings.word_embeddings.weight),
    ):
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name
    names = [n for n, _ in model.named_parameters()]  # each shared tensor trained once
    assert not any(n.startswith("generator.electra.embeddings.") for n in names)


def test_export_writes_discriminator_and_generator_with_parity(rtd, wordpiece, tmp_path):  # noqa: F811
    cfg, model = rtd
    batch = build_collator(cfg, wordpiece)(_blocks(wordpiece, 2))
    probe = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        ref = model(**probe).logits
    reloaded = export_pair(model, tmp_path, wordpiece)
    with torch.no_grad():
        assert float((reloaded(**probe).logits - ref).abs().max()) <= 1e-5
    assert type(ElectraForPreTraining.from_pretrained(tmp_path)).__name__ == "ElectraForPreTraining"
    gen = ElectraForMaskedLM.from_pretrained(tmp_path / GENERATOR_DIR)
    assert gen.generator_lm_head.weight.data_ptr() == gen.electra.embeddings.word_embeddings.weight.data_ptr()
    assert (tmp_path / GENERATOR_DIR / "tokenizer.json").is_file() and (tmp_path / "tokenizer.json").is_file()
    clf = ElectraForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    assert clf(**probe).logits.shape == (2, 5)
    np.testing.assert_array_equal(
        clf.electra.embeddings.word_embeddings.weight.detach().numpy(),
        model.discriminator.electra.embeddings.word_embeddings.weight.detach().numpy(),
    )


def test_the_sequence_contrastive_loss_trains_an_electra_discriminator_too(wordpiece):  # noqa: F811
    """COCO-LM's loss reads the discriminator's last states through HF's `output_hidden_states`, so ELECTRA's
    own classes carry it as the ModernBERT detector does."""
    torch.manual_seed(0)
    cfg = _cfg("objective.options.contrastive_weight=1.0")
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece).train()
    out = model(**build_collator(cfg, wordpiece)(_blocks(wordpiece, 4)))
    scl = out.metrics["contrastive_loss"]
    assert 0 < float(scl) < 10
    torch.testing.assert_close(out.loss, out.generator_loss + 50.0 * out.discriminator_loss + scl)
    out.loss.backward()
    grad = model.discriminator.electra.encoder.layer[0].output.dense.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
