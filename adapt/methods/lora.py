"""LoRA through peft: low-rank adapters on the family's target modules (`lora_target_modules` in its spec where
peft knows none for the model type, as for ModernBERT; peft's own default otherwise), the classification head trained and saved whole beside them (`lora_modules_to_save`). A saved folder loads
with peft alone: `AutoPeftModelForSequenceClassification.from_pretrained(folder, num_labels=N)` (the base is the
export the adapter config names)."""

from __future__ import annotations

import re

import torch

from core.errors import ConfigError
from runconfig.finetune import LoraSection


def _family(model: torch.nn.Module):
    from pretrain.families import family_names, get_family

    model_type = model.config.model_type
    if model_type not in family_names():
        raise ConfigError(f"finetune.methods: lora needs a registered family; the model is {model_type!r}")
    return get_family(model_type)


def targets_of(spec, model_type: str) -> tuple[str, ...]:
    """The family's declared target modules, else peft's default for the model type."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    targets = tuple(spec.lora_target_modules) or tuple(PEFT_DEFAULTS.get(model_type) or ())
    if not targets:
        raise ConfigError(
            f"finetune.methods: lora: family {spec.name!r} declares no lora_target_modules in its spec and peft "
            f"has no default for model type {model_type!r}"
        )
    return targets


def check_targets(model: torch.nn.Module, targets: tuple[str, ...], family: str) -> None:
    """Every target module name exists in the model: peft would otherwise adapt nothing or fail late."""
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [
        t
        for t in targets
        if t not in leaves and not any(re.fullmatch(t, n) for n, _ in model.named_modules())
    ]
    if missing:
        raise ConfigError(
            f"lora_target_modules of family {family!r}: {missing} not in the model "
            f"({type(model).__name__}); its linear layers: "
            f"{sorted({n.rsplit('.', 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})}"
        )


def wrap(model: torch.nn.Module, lora: LoraSection, text_to_text: bool) -> torch.nn.Module:
    """The model with LoRA adapters on its family's target modules; only adapters and the head train."""
    from peft import LoraConfig, TaskType, get_peft_model

    spec = _family(model)
    targets = targets_of(spec, model.config.model_type)
    check_targets(model, targets, spec.name)
    config = LoraConfig(
        task_type=TaskType.SEQ_2_SEQ_LM if text_to_text else TaskType.SEQ_CLS,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(targets),
        modules_to_save=list(spec.lora_modules_to_save) or None,
    )
    return get_peft_model(model, config)
