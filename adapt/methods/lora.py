"""LoRA through peft: low-rank adapters on the family's target modules (`lora_target_modules` in its spec where
peft knows none for the model type, as for ModernBERT; peft's own default otherwise), the classification head
trained and saved whole beside them (`lora_modules_to_save`). A saved folder loads with peft alone:
`AutoPeftModelForSequenceClassification.from_pretrained(folder, num_labels=N)` (the base is the export the adapter
config names); its README is a model card naming the labels and how to load them. The family is found by the one
rule init_from uses (runconfig/init_from.py `find_family`): model_type, then the model class, so an outside family
such as the guide's `tinybert` (model_type `bert`) gets its adapters too.

Torch and peft are imported inside the functions: the config reads `SPEC` (the `finetune.lora` settings) without
them."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from core.errors import ConfigError
from core.specs import FamilySpec, MethodSpec, Options

if TYPE_CHECKING:
    import torch


class LoraSettings(Options):
    """`finetune.lora`: peft's LoraConfig, rank, scaling and dropout of the adapters (LoRA paper defaults for small
    models)."""

    r: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    # The LR grid of LoRA runs is finetune.lr_grid times this: adapters train at ~10x full fine-tuning's LR.
    lr_scale: float = Field(10.0, gt=0)


def family_of(model: torch.nn.Module) -> FamilySpec:
    """The model's registered family, by init_from's rule (model_type, then the model class it was saved as)."""
    from runconfig.init_from import find_family

    config = model.config
    spec = find_family(config.model_type, getattr(config, "architectures", None))
    if spec is None:
        raise ConfigError(
            f"finetune.methods: lora needs a registered family; the model is {config.model_type!r} "
            f"(saved as {getattr(config, 'architectures', None)}), which no registered family's model_type or "
            "model class matches"
        )
    return spec


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
    import torch

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


def wrap(model: torch.nn.Module, lora: LoraSettings, text_to_text: bool) -> torch.nn.Module:
    """The model with LoRA adapters on its family's target modules; only adapters and the head train."""
    from peft import LoraConfig, TaskType, get_peft_model

    spec = family_of(model)
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
    wrapped = get_peft_model(model, config)
    dedupe_modules_to_save(wrapped)
    return wrapped


def dedupe_modules_to_save(model: torch.nn.Module) -> None:
    """peft's SEQ_CLS task adds `classifier` and `score` to the family's `lora_modules_to_save`, so a GPT-2 folder
    listed `score` twice in adapter_config.json: each module once, in order."""
    for config in getattr(model, "peft_config", {}).values():
        if config.modules_to_save:
            config.modules_to_save = list(dict.fromkeys(config.modules_to_save))


CARD = """---
{{ card_data }}
---

# LoRA adapters for sequence {{ kind }}

LoRA adapters (rank {{ r }}, on `{{ targets }}`) and the trained head `{{ heads }}` of a model fine-tuned with
lmstack (`finetune.methods: [lora]`) from the export `{{ base_name }}` (`{{ base_rel }}` from this folder).
{{ scores }}

## Labels

{{ labels }}

## Base model

`adapter_config.json` names the base model as the local folder this run fine-tuned
(`base_model_name_or_path`), which is not a Hub id; this card's metadata therefore names no `base_model`. Load the
adapters onto your copy of that export (the same weights), or set `base_model` once it is published.

## How to load

```python
from peft import PeftConfig, PeftModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

folder = "path/to/this/folder"
base = PeftConfig.from_pretrained(folder).base_model_name_or_path  # or your copy of the export
model = AutoModelForSequenceClassification.from_pretrained(base, {{ head_kwargs }})
model = PeftModel.from_pretrained(model, folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)  # a sentence pair: tokenizer(text, text_pair)
```

The adapter folder holds no `config.json` (transformers would then take the folder for a whole model), so the label
names are given to `from_pretrained` as above, the same with `AutoPeftModelForSequenceClassification`.
"""


def head_kwargs(labels: list[str], regression: bool) -> str:
    """The `from_pretrained` keyword arguments that give the base model this head: its size and label names."""
    if regression:
        return 'num_labels=1, problem_type="regression"'
    id2label = {i: n for i, n in enumerate(labels)}
    label2id = {n: i for i, n in enumerate(labels)}
    return f"num_labels={len(labels)}, id2label={id2label!r}, label2id={label2id!r}"


def write_card(
    out_dir: Path, model: Any, model_dir: Path, labels: list[str], regression: bool, scores: dict[str, float]
) -> None:
    """README.md of a LoRA folder as a model card (huggingface_hub), in place of peft's empty template whose
    `base_model` was this machine's absolute path of the export: what the adapters are, their labels, scores and
    how to load them with named labels."""
    from huggingface_hub import ModelCard, ModelCardData

    config = next(iter(model.peft_config.values()))
    metric = "Pearson's r" if regression else "accuracy"
    leaves = {
        name.rsplit(".", 1)[-1] for name, _ in model.named_modules()
    }  # peft lists heads the model lacks
    data = ModelCardData(
        library_name="peft",
        pipeline_tag="text-classification",
        tags=["lora", "peft", "lmstack", "text-classification"],
    )
    card = ModelCard.from_template(
        data,
        template_str=CARD,
        kind="regression" if regression else "classification",
        r=config.r,
        targets="`, `".join(sorted(config.target_modules)),
        heads="`, `".join(m for m in config.modules_to_save or [] if m in leaves),
        base_name=Path(model_dir).name,
        base_rel=os.path.relpath(Path(model_dir).resolve(), Path(out_dir).resolve()),
        scores=f"Its {metric} on the run's splits: "
        + ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
        + "."
        if scores
        else "",
        labels="One output, the predicted value (regression)."
        if regression
        else "\n".join(f"- {i}: `{n}`" for i, n in enumerate(labels)),
        head_kwargs=head_kwargs(labels, regression),
    )
    card.save(Path(out_dir) / "README.md")


def lr_grid(grid: list[float], lora: LoraSettings) -> list[float]:
    """Adapters train at a higher LR than full fine-tuning: finetune.lr_grid times `lr_scale`."""
    return [lr * lora.lr_scale for lr in grid]


SPEC = MethodSpec(
    name="lora",
    description="LoRA adapters",
    settings=LoraSettings,
    lr_grid_text="finetune.lr_grid x finetune.lora.lr_scale",
    lr_grid=lr_grid,
    wrap_model=wrap,
    save=write_card,
)
