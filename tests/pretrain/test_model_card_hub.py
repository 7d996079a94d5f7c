"""Every registered family's card, built from synthetic run results (no training): huggingface_hub parses it,
model-index holds only this model's results (the random-init arm is a baseline in the text), the seed count
is stated and an sd only with >= 2 seeds, warmup reads as the schedule ran it, MFU carries its peak or is left
out, the pipeline tag exists in the transformers versions the card claims, and the minimum version is the
family's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from pretrain.export.model_card import render_model_card
from pretrain.families import family_names, get_family
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]

ARMS = {
    "pretrained": {
        "lr": 1e-4,
        "test_accuracy": {"mean": 0.82, "sd": 0.01, "values": [0.81, 0.82, 0.83]},
        "probe_accuracy": 0.71,
    },
    "random": {
        "lr": 3e-4,
        "test_accuracy": {"mean": 0.44, "sd": 0.02, "values": [0.42, 0.44, 0.46]},
        "probe_accuracy": 0.37,
    },
}


def transfer(arms=ARMS) -> dict:
    return {
        "model": "x",
        "tasks": {
            "bbc_topics": {
                "task": "bbc_topics",
                "splits": {"train": 100, "dev": 20, "test": 50},
                "arms": arms,
                "margin": 0.38,
                "p_value": 0.01,
            }
        },
    }


def card(tmp_path, family: str, overrides=(), state_extra=None, tr=None, speed=None, ppl=(665.1, 100)) -> str:
    cfg = load_config(
        ROOT / "configs" / f"{family}-tiny.yaml", [f"run.output_dir={tmp_path}/run", *overrides]
    )
    spec = get_family(family)
    arch = spec.model_class if isinstance(spec.model_class, str) else spec.model_class.__name__
    state = {
        "step": 100,
        "tokens_seen": 409600,
        "n_params": 123456,
        "plan": {
            "peak_lr": 6e-4,
            "warmup_steps": 10,
            "total_steps": 100,
            "budget_s": None,
            "warmup_fraction": 0.0,
        },
        **(state_extra or {}),
    }
    return render_model_card(
        cfg,
        tmp_path / "export",
        state,
        {"architectures": [arch], "model_type": family},
        None,
        None,
        ppl,
        tr if tr is not None else transfer(),
        "<mask>",
        speed,
    )


# Hub pipeline tags a card may carry. transformers 5.x removed text2text-generation, translation and
# summarization: no pipeline of 5.x runs a seq2seq model (the card's usage calls generate()), while 4.x's
# text2text-generation does; text-generation never ran one (its model class is AutoModelForCausalLM).
TAGS_IN_4_AND_5 = {"fill-mask", "text-generation", "feature-extraction", "text-classification"}
SEQ2SEQ_TAG = "text2text-generation"


@pytest.mark.parametrize("family", family_names())
def test_every_family_card_parses_and_publishes_only_its_own_results(tmp_path, family):
    text = card(tmp_path, family)
    parsed = ModelCard(text)
    data = parsed.data
    task = get_family(family).task
    if task == "seq2seq":
        assert data.pipeline_tag == SEQ2SEQ_TAG, (family, data.pipeline_tag)
    else:
        assert data.pipeline_tag in TAGS_IN_4_AND_5, (family, data.pipeline_tag)
    if data.pipeline_tag == "text-generation":  # the pipeline loads AutoModelForCausalLM: only a causal LM
        assert task == "causal_lm", (family, task)
    values = [(r.metric_type, r.metric_value, r.metric_name) for r in data.eval_results or []]
    assert values, family
    assert all("random" not in (name or "").lower() for _, _, name in values), values
    assert {v for _, v, _ in values}.isdisjoint({0.44, 0.37}), values  # the random-init arm is no eval result
    assert ("accuracy", 0.82) in [(t, v) for t, v, _ in values]
    assert "0.440" in parsed.text and "random init" in parsed.text  # the baseline, in the body
    assert "3 seeds" in parsed.text
    minimum = get_family(family).min_transformers
    assert f"transformers >={minimum}" in parsed.text
    if family == "modernbert":
        assert minimum == "4.48"


def test_one_seed_has_no_sd(tmp_path):
    one = {
        arm: {
            **e,
            "test_accuracy": {
                "mean": e["test_accuracy"]["mean"],
                "sd": 0.0,
                "values": e["test_accuracy"]["values"][:1],
            },
        }
        for arm, e in ARMS.items()
    }
    text = card(tmp_path, "roberta", tr=transfer(one))
    (row,) = [x for x in text.splitlines() if x.startswith("| bbc_topics |")]
    assert "±" not in row and "| 0.820 (1 seed) |" in row and "| 0.440 (1 seed) |" in row
    assert "mean of 1 seed)" in text  # the model-index metric name says so too


def test_warmup_of_a_time_budget_run_reads_as_run(tmp_path):
    text = card(
        tmp_path,
        "roberta",
        [
            "schedule.budget_minutes=16",
            "schedule.total_steps=null",
            "schedule.warmup_steps=null",
            "schedule.warmup_fraction=0.05",
        ],
        {
            "plan": {
                "peak_lr": 6e-4,
                "warmup_steps": 0,
                "total_steps": None,
                "budget_s": 960.0,
                "warmup_fraction": 0.05,
            }
        },
    )
    assert "0 warmup steps" not in text
    assert "warmup over the first 5% of a 16-minute budget (48 s)" in text


def test_mfu_is_labelled_with_its_peak_or_left_out(tmp_path):
    cpu = card(tmp_path, "roberta", speed=(5000.0, 0.34))
    assert "MFU" not in cpu.split("## Compute")[1].split("##")[0].replace("MFU not reported", "")
    assert "MFU not reported" in cpu and "5,000 tokens/s" in cpu
    gpu = card(tmp_path, "roberta", ["logging.peak_flops=989e12"], speed=(5000.0, 0.34))
    assert "MFU 34.0% of a stated peak of 989 TFLOP/s per rank (logging.peak_flops)" in gpu


@pytest.mark.parametrize("family", family_names())
def test_lora_target_modules_are_named_where_peft_knows_none(tmp_path, family):
    """Issue 43 friction 6: peft has no default LoRA target modules for ModernBERT (`Please specify
    target_modules`); the card names them, and they are modules the family's model has."""
    peft = pytest.importorskip("peft")
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as KNOWN

    text = card(tmp_path, family)
    named = get_family(family).lora_target_modules
    if family in KNOWN:
        assert not named and "target_modules" not in text
        return
    assert named and f"target_modules={list(named)}" in text, text
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(family, **small))
    with pytest.raises(ValueError, match="target_modules"):
        peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS"))
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", target_modules=list(named)))
    assert sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n) > 0
    assert torch.is_tensor(next(lora.parameters()))
