"""The two arms of every comparison, built from one export folder: its weights (pretrained) or its config from
random initialisation (random); an adaptation method may wrap the built model (its spec's `wrap_model`, LoRA's
peft adapters)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from core.registry import ADAPT_METHODS
from runconfig.finetune import FinetuneConfig, primary_method


class Arms:
    """Builds each arm's model from one export folder: the export's weights, or its config from random init."""

    def __init__(self, model_dir: Path, labels: list[str], pad_id: int | None, regression: bool = False):
        self.model_dir = model_dir
        self.labels = labels
        self.regression = regression  # one output, MSE (AutoModelForSequenceClassification's problem_type)
        self.pad_id = pad_id  # decoders without a pad token classify from the last non-pad token
        base = AutoConfig.from_pretrained(str(model_dir))
        self.text_to_text = bool(getattr(base, "is_encoder_decoder", False))
        if regression and self.text_to_text:
            raise ValueError(
                f"finetune.tasks.problem: regression needs a classification head, and {base.model_type} is "
                "fine-tuned text-to-text (its labels are strings): use classification, or an encoder or decoder"
            )
        kwargs: dict = (
            {}
            if self.text_to_text
            else {"num_labels": 1, "problem_type": "regression"}
            if regression
            else {
                "num_labels": len(labels),
                "id2label": dict(enumerate(labels)),
                "label2id": {n: i for i, n in enumerate(labels)},
            }
        )
        self.config = AutoConfig.from_pretrained(str(model_dir), **kwargs)
        self.cls = AutoModelForSeq2SeqLM if self.text_to_text else AutoModelForSequenceClassification

    def build(self, arm: str, method: str | None = None, ft: FinetuneConfig | None = None) -> torch.nn.Module:
        """Called by the Trainer after it seeds torch: the head (and the random arm's body) depend on the seed.
        A method with `wrap_model` (LoRA) wraps it with its settings (`finetune.<method>`)."""
        if arm == "pretrained":
            model = self.cls.from_pretrained(str(self.model_dir), config=self.config)
        elif arm == "random":
            model = self.cls.from_config(self.config)
        else:
            raise ValueError(f"finetune.arms: unknown arm {arm!r} (pretrained, random)")
        if model.config.pad_token_id is None and self.pad_id is not None:
            model.config.pad_token_id = self.pad_id
        method = method or primary_method()
        spec = ADAPT_METHODS.get(method)
        if spec.wrap_model is not None:
            model = spec.wrap_model(model, (ft or FinetuneConfig()).settings_of(method), self.text_to_text)
        return model

    def encoder(self, arm: str) -> torch.nn.Module:
        """The body without a head, for the frozen-feature probe (the encoder of an encoder-decoder)."""
        config = AutoConfig.from_pretrained(str(self.model_dir))
        model = (
            AutoModel.from_pretrained(str(self.model_dir))
            if arm == "pretrained"
            else AutoModel.from_config(config)
        )
        return model.get_encoder() if self.text_to_text else model
