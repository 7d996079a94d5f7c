"""Replaced-token detection on a family that declares it besides ELECTRA (issue 46), ModernBERT first: config
checks at load naming the key, the generator (same family, narrower, sharing the discriminator's embeddings), the
loss weighting, and the export of the discriminator's body as ModernBertModel with parity (in-process, CPU).
The DeepSpeed run (train, resume, export, HF Trainer fine-tune) is in tests/pretrain/test_rtd.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, ModernBertForMaskedLM

from data_pipeline.objectives import build_collator
from pretrain.families import get_family
from pretrain.objectives import wrap_model
from pretrain.objectives.rtd import BODY_HEAD_FILE, Contrastive, rtd_family
from pretrain.run.models import build_model
from runconfig import load_config
from runconfig.load import ConfigError
from tests.data_pipeline.test_objective_mlm import ROOT, _full_sentences, wordpiece  # noqa: F401 (fixture)

TINY = str(ROOT / "configs" / "modernbert-tiny.yaml")
SEQ = 64
RTD = [
    "objective.type=electra",
    "objective.mlm_probability=0.15",
    "objective.mask_token_fraction=0.85",
    "objective.random_token_fraction=0.0",
    "tokenizer.type=wordpiece",
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.ffn_size=96",
    f"packing.seq_len={SEQ}",
]


def _cfg(*overrides: str):
    return load_config(TINY, [*RTD, *overrides])


def _error(config: str, *overrides: str) -> str:
    with pytest.raises((ConfigError, ValueError)) as e:
        load_config(config, list(overrides))
    return str(e.value)


# ------------------------------------------------------------------------------------------- config checks
def test_rtd_on_a_family_that_does_not_declare_it_names_the_key():
    msg = _error(str(ROOT / "configs" / "roberta-tiny.yaml"), "objective.type=electra")
    assert "objective.type: 'electra' cannot train model.family 'roberta'" in msg, msg
    assert "'modernbert'" in msg and "'electra'" in msg, msg  # the families that declare it are listed


def test_a_generator_larger_than_the_discriminator_names_the_key():
    msg = _error(TINY, *RTD, "objective.options.generator_hidden_fraction=1.5")
    assert "objective.options.generator_hidden_fraction" in msg and "wider than the discriminator" in msg, msg
    msg = _error(TINY, *RTD, "objective.options.generator_ffn_size=512")
    assert "objective.options.generator_ffn_size" in msg and "model.ffn_size" in msg, msg
    msg = _error(TINY, *RTD, "objective.options.generator_layers_fraction=2")
    assert "objective.options.generator_layers_fraction" in msg, msg


@pytest.mark.parametrize("t", ["0", "-1"])
def test_a_temperature_not_above_zero_names_the_key(t):
    msg = _error(TINY, *RTD, f"objective.options.temperature={t}")
    assert "objective.options.temperature" in msg and "greater than 0" in msg, msg


def test_every_family_declaring_rtd_has_an_adapter():
    from pretrain.families import family_names

    declared = [n for n in family_names() if get_family(n).rtd is not None]
    assert {"electra", "modernbert"} <= set(declared), declared
    for name in declared:
        adapter = rtd_family(get_family(name))
        assert callable(adapter.pair) and callable(adapter.export), name


# ------------------------------------------------------------------------------------------- module
def _blocks(tok, n: int) -> list[dict]:
    return _full_sentences(tok, n, SEQ, tok.cls_token_id, tok.sep_token_id)


@pytest.fixture(scope="module")
def rtd(wordpiece):  # noqa: F811
    torch.manual_seed(0)
    cfg = _cfg()
    return cfg, wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece)


def test_generator_is_a_narrower_modernbert_sharing_the_embeddings(rtd, wordpiece):  # noqa: F811
    cfg, model = rtd
    model.train()
    g, d = model.generator, model.discriminator
    assert isinstance(g, ModernBertForMaskedLM) and type(d.body).__name__ == "ModernBertModel"
    assert g.config.hidden_size == 16 and d.config.hidden_size == 64  # ELECTRA's 1/4 width by default
    assert g.config.intermediate_size == 24  # the discriminator's GLU ratio (96 / 64)
    assert g.config.num_hidden_layers == 2 and g.config.num_attention_heads == 1
    emb = d.body.embeddings
    assert g.model.embeddings.shared is emb and g.decoder.weight is emb.tok_embeddings.weight
    out = model(**build_collator(cfg, wordpiece)(_blocks(wordpiece, 4)))
    assert torch.allclose(out.loss, out.generator_loss + 50.0 * out.discriminator_loss)
    assert 0 < float(out.metrics["replaced_fraction"]) < 0.16
    out.loss.backward()
    for name, p in (
        ("generator", g.model.layers[0].attn.Wqkv.weight),
        ("discriminator head", d.head[2].weight),
        ("discriminator body", d.body.layers[1].mlp.Wo.weight),
        ("shared embeddings", emb.tok_embeddings.weight),
    ):
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name
    names = [n for n, _ in model.named_parameters()]  # each shared tensor trained once
    assert not any(n.startswith("generator.model.embeddings.shared.") for n in names)
    assert "generator.decoder.weight" not in names
    model.zero_grad()


def test_weight_and_temperature_come_from_the_options(wordpiece):  # noqa: F811
    cfg = _cfg("objective.options.discriminator_weight=10", "objective.options.temperature=2")
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece)
    assert (model.weight, model.temperature) == (10.0, 2.0)
    with torch.no_grad():
        out = model(**build_collator(cfg, wordpiece)(_blocks(wordpiece, 2)))
    assert torch.allclose(out.loss, out.generator_loss + 10.0 * out.discriminator_loss)


def test_export_is_the_modernbert_body_with_parity(rtd, wordpiece, tmp_path):  # noqa: F811
    cfg, model = rtd
    model.eval()
    batch = build_collator(cfg, wordpiece)(_blocks(wordpiece, 2))
    probe = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        ref = model(**probe).logits
        ref_hidden = model.discriminator.body(**probe).last_hidden_state
    reloaded = rtd_family(get_family("modernbert")).export(cfg, model, tmp_path, wordpiece)
    with torch.no_grad():
        assert float((reloaded(**probe).logits - ref).abs().max()) <= 1e-5
        body = AutoModel.from_pretrained(tmp_path).eval()
        assert type(body).__name__ == "ModernBertModel"
        assert float((body(**probe).last_hidden_state - ref_hidden).abs().max()) <= 1e-5
    assert (tmp_path / BODY_HEAD_FILE).is_file() and (tmp_path / "tokenizer.json").is_file()
    assert body.config.sparse_prediction is False  # the family's export config
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    assert type(clf).__name__ == "ModernBertForSequenceClassification"
    assert clf(**probe).logits.shape == (2, 5)
    torch.testing.assert_close(
        clf.model.embeddings.tok_embeddings.weight, body.embeddings.tok_embeddings.weight
    )


def test_plan_counts_the_module_rtd_trains():
    """`pretrain plan` counts the discriminator + generator, not the family's MLM model."""
    from pretrain.tools.plan import model_param_counts, param_counts

    cfg = _cfg()
    total, _ = param_counts(cfg)
    assert total == model_param_counts(cfg)[0]
    assert total != get_family("modernbert").param_count(cfg)[0]


# ------------------------------------------------------------------------------------------- sequence contrastive
SCL = ["objective.options.contrastive_weight=0.5"]


def test_the_contrastive_loss_adds_to_the_loss_and_trains_the_body(wordpiece):  # noqa: F811
    torch.manual_seed(0)
    cfg = _cfg(*SCL)
    model = wrap_model(cfg, build_model(cfg.model, wordpiece, SEQ), wordpiece)
    batch = build_collator(cfg, wordpiece)(_blocks(wordpiece, 4))
    assert batch["crop_u"].shape == (4,) and bool(((batch["crop_u"] >= 0) & (batch["crop_u"] < 1)).all())
    out = model(**batch)
    scl = out.metrics["contrastive_loss"]
    assert 0 < float(scl) < 10
    torch.testing.assert_close(out.loss, out.generator_loss + 50.0 * out.discriminator_loss + 0.5 * scl)
    # the body's gradient with the term differs from the one without (same weights, batch and samples)
    out.loss.backward()
    body = model.discriminator.body.layers[0].mlp.Wo.weight
    with_term, body.grad = body.grad.clone(), None
    model.contrastive = Contrastive()
    model(**batch).loss.backward()
    assert not torch.allclose(with_term, body.grad)


def test_crop_uniforms_are_a_pure_function_of_the_sample_and_only_drawn_when_on(wordpiece):  # noqa: F811
    on, off = _cfg(*SCL), _cfg()
    blocks = _blocks(wordpiece, 4)
    first = build_collator(on, wordpiece)(blocks)["crop_u"]
    again = build_collator(on, wordpiece)(list(reversed(blocks)))["crop_u"]
    torch.testing.assert_close(first, again.flip(0))  # each sequence's own draw, whatever the batch order
    assert len(set(first.tolist())) == 4
    assert "crop_u" not in build_collator(off, wordpiece)(blocks)


def test_the_cropped_view_is_a_contiguous_slice_that_starts_where_crop_u_says():
    from pretrain.objectives.rtd import cropped_view

    ids = torch.arange(20).reshape(2, 10)
    mask = torch.ones_like(ids, dtype=torch.bool)
    view, view_mask = cropped_view(ids, mask, torch.tensor([0.0, 0.9999]), 0.5)
    assert view.tolist() == [[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]] and bool(view_mask.all())
    view, _ = cropped_view(ids, mask, torch.tensor([0.5, 0.5]), 0.9)
    assert view.tolist() == [list(range(1, 10)), list(range(11, 20))]


@pytest.mark.parametrize(
    "override, says",
    [
        ("objective.options.contrastive_weight=-1", "greater than or equal to 0"),
        ("objective.options.contrastive_temperature=0", "greater than 0"),
        ("objective.options.contrastive_crop=0", "greater than 0"),
        ("objective.options.contrastive_crop=1.5", "less than or equal to 1"),
    ],
)
def test_bad_contrastive_options_name_the_key(override, says):
    msg = _error(TINY, *RTD, override)
    assert override.split("=")[0] in msg and says in msg, msg
