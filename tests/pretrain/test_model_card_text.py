"""Issue 66, the card's body: the "Cleaning:" line names PII redaction and decontamination where they ran, and the
held-out perplexity's dataset names only the sources the eval row measured (a source with no held-out samples has
no `perplexity/<source>` and is not in it)."""

from __future__ import annotations

import json

from huggingface_hub import ModelCard

from core.run_layout import RunLayout
from pretrain.export.model_card import write_model_card
from pretrain.run.metrics import MetricsLogger
from tests.adapt.test_transfer_publish import _run_export


def _body(text: str) -> str:
    return text.split("\n---\n", 1)[1]


def test_cleaning_line_names_pii_and_decontamination(tmp_path):
    cfg, export = _run_export(tmp_path, config="demo.yaml")
    layout = RunLayout(cfg)
    layout.clean.mkdir(parents=True, exist_ok=True)
    stats = {
        "per_source": {},
        "decontamination": {"enabled": True, "n": 13, "eval_sets": {"bbc": 120}, "ngrams": 9},
    }
    (layout.clean / "stats.json").write_text(json.dumps(stats))
    (line,) = [
        x for x in _body(write_model_card(cfg, export).read_text()).splitlines() if x.startswith("Cleaning:")
    ]
    assert "PII redaction" in line and "13-gram decontamination against bbc" in line, line
    # no evaluation text indexed: no decontamination claimed
    (layout.clean / "stats.json").write_text(json.dumps({**stats, "decontamination": {"enabled": False}}))
    (line,) = [
        x for x in _body(write_model_card(cfg, export).read_text()).splitlines() if x.startswith("Cleaning:")
    ]
    assert "decontamination" not in line and "PII redaction" in line, line
    (line,) = [
        x
        for x in _body(
            write_model_card(load(cfg, ["data.clean.pii.enabled=false"]), export).read_text()
        ).splitlines()
        if x.startswith("Cleaning:")
    ]
    assert "PII" not in line, line


def load(cfg, overrides):
    from runconfig import load_config

    return load_config("configs/demo.yaml", [f"run.output_dir={cfg.run.output_dir}", *overrides])


def test_perplexity_dataset_names_only_the_sources_with_eval_rows(tmp_path):
    cfg, export = _run_export(tmp_path, config="demo.yaml")
    assert {s.name for s in cfg.data.sources} == {"crawl", "bbc"}
    logger = MetricsLogger(RunLayout(cfg).logs, enabled=True, tensorboard=False)
    logger.log(
        100, {"loss": 6.5, "perplexity": 665.1, "perplexity/bbc": 665.1, "loss/bbc": 6.5}, prefix="eval"
    )
    logger.close()
    state = json.loads((export / "training_state.json").read_text())
    (export / "training_state.json").write_text(json.dumps({**state, "step": 100}))
    results = ModelCard(write_model_card(cfg, export).read_text()).data.eval_results
    (ppl,) = [r for r in results if r.metric_type == "perplexity"]
    assert "bbc" in ppl.dataset_name and "crawl" not in ppl.dataset_name, ppl.dataset_name
