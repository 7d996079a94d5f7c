"""The exported model card is fit for the Hub: metadata the Hub parses (license, language, datasets,
pipeline_tag, model-index with held-out perplexity and the transfer results), a plain body, hashes in a file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from data_pipeline.tokenizers import frame_pairs, load_tokenizer, make_portable, train_tokenizer
from pretrain.export.model_card import MANIFEST_FILE, write_model_card
from pretrain.run.metrics import MetricsLogger
from pretrain.run.models import build_model
from tests.data_pipeline.tokens_fixtures import bbc_config

TRANSFER = {
    "model": "x",
    "tasks": {
        "bbc_topics": {
            "task": "bbc_topics",
            "splits": {"train": 100, "dev": 20, "test": 50},
            "labels": ["a", "b"],
            "origin": "hold-out",
            "arms": {
                "pretrained": {
                    "lr": 1e-4,
                    "test_accuracy": {"mean": 0.82, "sd": 0.01, "values": [0.81, 0.82, 0.83]},
                    "probe_accuracy": 0.7,
                },
                "random": {
                    "lr": 3e-4,
                    "test_accuracy": {"mean": 0.75, "sd": 0.02, "values": [0.73, 0.75, 0.77]},
                    "probe_accuracy": 0.5,
                },
            },
            "margin": 0.07,
            "p_value": 0.01,
        }
    },
}


def _export(tmp: Path, preset: str, overrides: list[str] = ()) -> tuple[object, Path]:
    cfg = bbc_config(tmp, preset, ["tokenizer.vocab_size=2000", *overrides], limit=200)
    tok = load_tokenizer(train_tokenizer(cfg))
    frame_pairs(tok)  # as pretrain.export.convert: a separator between a pair's texts (GPT-2)
    from data_pipeline.tokenize import run_tokenize

    run_tokenize(cfg)  # the manifest with the shard hashes
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    out = tmp / "export"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    make_portable(out)
    logger = MetricsLogger(tmp / "logs", enabled=True, tensorboard=False)
    logger.log(50, {"loss": 6.9, "tokens_per_s": 5000.0, "mfu": 0.1}, prefix="train")
    logger.log(50, {"loss": 6.9, "perplexity": 992.3}, prefix="eval")
    logger.log(100, {"loss": 6.5, "perplexity": 665.1}, prefix="eval")
    # after the exported step: not reported
    logger.log(120, {"loss": 6.0, "perplexity": 403.4}, prefix="eval")
    logger.close()
    state = {
        "checkpoint": "x/step100",
        "step": 100,
        "tokens_seen": 409600,
        "loss": 6.4,
        "n_params": 123456,
        "plan": {"peak_lr": 6e-4, "warmup_steps": 10},
        "parity_max_abs_diff": 0.0,
    }
    (out / "training_state.json").write_text(json.dumps(state))
    return cfg, out


def _front_matter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


@pytest.mark.parametrize(
    "preset,tag",
    [("roberta-tiny", "fill-mask"), ("gpt2-tiny", "text-generation"), ("t5-tiny", "text2text-generation")],
)
def test_card_metadata_and_body(tmp_path, preset, tag):
    cfg, out = _export(tmp_path, preset, ["export.repo_id=acme/tiny", "export.datasets=[acme/news]"])
    text = write_model_card(cfg, out).read_text()
    meta, body = _front_matter(text)
    assert meta["license"] == "apache-2.0" and meta["language"] == ["en"] and meta["pipeline_tag"] == tag
    assert meta["library_name"] == "transformers" and meta["datasets"] == ["acme/news"]
    (entry,) = meta["model-index"]
    (ppl,) = entry["results"]
    assert ppl["metrics"] == [
        {"type": "perplexity", "value": 665.1, "name": "Held-out perplexity (step 100)"}
    ]
    # The Hub's own parser reads the model-index.
    from huggingface_hub import ModelCard

    card = ModelCard(text)
    assert [(r.metric_type, r.metric_value) for r in card.data.eval_results] == [("perplexity", 665.1)]
    # A plain body: data, cleaning, tokens, recipe, compute, usage, supported transformers; no hashes in it.
    for needle in (
        "## Usage",
        "## Training data",
        "**bbc** (text_folder",
        "Cleaning:",
        "Tokenizer: ",
        "## Training recipe",
        "409,600 tokens seen",
        "peak LR 0.0006",
        "## Compute",
        "Throughput 5,000 tokens/s",
        "MFU not reported",
        "Loads with transformers >=4.40",
        '"acme/tiny")',
        "Held-out perplexity: **665.10**",
        # issue 66: what the folder's tokenizer(a, b) puts between a pair's texts
        "Sentence pairs: `tokenizer(a, b)` puts `"
        + {"roberta-tiny": "</s></s>", "gpt2-tiny": "<|endoftext|>", "t5-tiny": "</s>"}[preset]
        + "` between the two texts",
    ):
        assert needle in body, needle
    # no shard hashes in the card
    assert not re.search(r"[0-9a-f]{64}", text) and len(text.splitlines()) < 120
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert any("sha256_bin" in s for src in manifest["sources"].values() for s in src["shards"])
    assert (out / "resolved_config.yaml").is_file()


def test_card_carries_transfer_results_when_present(tmp_path):
    cfg, out = _export(tmp_path, "roberta-tiny")
    meta, body = _front_matter(write_model_card(cfg, out).read_text())
    assert "not run yet" in body and len(meta["model-index"][0]["results"]) == 1
    from pretrain.export.folder import weights_hash

    (out / "transfer.json").write_text(json.dumps(TRANSFER))  # no weight hash: not bound to these weights
    assert "not run yet" in _front_matter(write_model_card(cfg, out).read_text())[1]
    # `transfer` binds its results to the weights it measured
    (out / "transfer.json").write_text(json.dumps({**TRANSFER, "weights_sha256": weights_hash(out)}))
    text = write_model_card(cfg, out).read_text()  # `python -m pretrain card` after `transfer` does this
    meta, body = _front_matter(text)
    results = meta["model-index"][0]["results"]
    assert (
        results[1]["task"]["type"] == "text-classification" and results[1]["dataset"]["name"] == "bbc_topics"
    )
    # Only this model's results: the random-init arm is the baseline in the body, not an eval result.
    assert [m["value"] for m in results[1]["metrics"]] == [0.82, 0.7]
    row = "| bbc_topics | accuracy | fine-tuned | 0.820 ± 0.010 (3 seeds) | 0.700 | 0.750 ± 0.020 (3 seeds) | 0.500 |"
    assert row + " +7.0 points |" in body
    from huggingface_hub import ModelCard

    assert len(ModelCard(text).data.eval_results) == 3


def test_card_task_follows_the_family_spec():
    from pretrain.export.model_card import TASKS, card_task

    assert card_task("modernbert") == "masked_lm"
    # the discriminator's encoder, no LM pipeline
    assert TASKS[card_task("electra")][0] == "feature-extraction"


def test_electra_card_is_a_discriminator_card(tmp_path):
    """ELECTRA's export (ElectraForPreTraining) gets a card: feature-extraction, no perplexity (its eval loss is
    MLM + 50 x BCE), a usage snippet with its fine-tuning head and the generator beside it."""
    cfg, out = _export(
        tmp_path, "electra-tiny", ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64"]
    )
    (out / "generator").mkdir()  # as the electra objective's export writes it
    meta, body = _front_matter(write_model_card(cfg, out).read_text())
    assert meta["pipeline_tag"] == "feature-extraction" and "model-index" not in meta, meta
    assert "electra" in meta["tags"]
    for needle in (
        "AutoModel.from_pretrained",
        'subfolder="generator"',
        "AutoModelForSequenceClassification",
        "Held-out perplexity: none",
    ):
        assert needle in body, needle
