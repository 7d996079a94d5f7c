"""Pretraining objective section."""

from typing import Annotated, Any

from pydantic import Field, model_validator

from core.registry import OBJECTIVES
from core.specs import ObjectiveSpec
from runconfig.base import Section, checks_plugin_options, registered_in


class ObjectiveConfig(Section):
    # a registered objective (`lmstack.objectives`; built-ins: pyproject.toml)
    type: Annotated[str, registered_in(OBJECTIVES)] = "mlm"
    # RoBERTa dynamic masking.
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    mask_token_fraction: float = Field(0.8, ge=0, le=1)
    random_token_fraction: float = Field(0.1, ge=0, le=1)
    whole_word_masking: bool = False
    # MLM: run the vocabulary projection only on the masked positions (ModernBERT, Cramming, MosaicBERT). The same
    # loss and gradients as the dense head at a fraction of its cost; logits without labels stay dense. Families
    # name their MLM head in their spec (`FamilySpec.mlm_head`); ModernBERT does it natively.
    sparse_prediction: bool = True
    # GPT: reset attention and positions at document boundaries inside a packed block.
    document_masking: bool = False
    # GPT: the LM head and cross-entropy a chunk of tokens at a time (pretrain/objectives/losses.py), so the [tokens, vocab]
    # logits are never held whole (nor upcast to fp32). Causal objective only, ZeRO stage 0-2.
    chunked_loss: bool = False
    # T5 span corruption.
    noise_density: float = Field(0.15, gt=0, lt=1)
    mean_noise_span_length: float = Field(3.0, gt=0)
    # Objective-specific keys, typed by the objective's spec (`ObjectiveSpec.options`), e.g. ELECTRA's generator
    # size and discriminator weight.
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def spec(self) -> ObjectiveSpec:
        """The objective's registered spec: the one place its name is looked up; the run reads it from here."""
        return OBJECTIVES.get(self.type)

    # The objective's factories read the options with their defaults.
    _objective_options = checks_plugin_options("objective.options", "objective", "type")

    @model_validator(mode="after")
    def _fractions(self) -> "ObjectiveConfig":
        if self.mask_token_fraction + self.random_token_fraction > 1:
            raise ValueError(
                f"objective.mask_token_fraction ({self.mask_token_fraction}) + objective.random_token_fraction "
                f"({self.random_token_fraction}) must not exceed 1"
            )
        return self
