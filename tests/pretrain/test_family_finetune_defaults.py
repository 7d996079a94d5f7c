"""Each family's fine-tune recipe (LR grid, warmup, weight decay) lives in its family spec (issue 27, item 3):
applied where the config does not set it, and a bad default is refused when the spec is made, naming the
family and the key."""

from __future__ import annotations

import math

import pytest

from pretrain.families import family_names, get_family
from pretrain.families.registry import FamilySpec
from runconfig import load_config

PRESETS = {
    "roberta": "roberta-budget",
    "gpt2": "gpt2-budget",
    "t5": "t5-budget",
    "modernbert": "modernbert-budget",
    "electra": "electra-budget",
}


@pytest.mark.parametrize("family", family_names())
def test_every_family_brings_a_valid_fine_tune_recipe(family):
    d = get_family(family).finetune_defaults
    assert {"lr_grid", "warmup_ratio", "weight_decay"} <= set(d), family
    assert d["lr_grid"] and all(math.isfinite(x) and x > 0 for x in d["lr_grid"])


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_the_family_recipe_applies_unless_the_config_sets_the_key(family):
    d = get_family(family).finetune_defaults
    cfg = load_config(f"configs/{PRESETS[family]}.yaml")
    assert cfg.finetune.lr_grid == d["lr_grid"] and cfg.finetune.weight_decay == d["weight_decay"]
    assert cfg.finetune.warmup_ratio == d["warmup_ratio"]
    own = load_config(
        f"configs/{PRESETS[family]}.yaml", ["finetune.lr_grid=[5.0e-5]", "finetune.weight_decay=0.3"]
    )
    assert own.finetune.lr_grid == [5.0e-5] and own.finetune.weight_decay == 0.3
    assert own.finetune.warmup_ratio == d["warmup_ratio"]


def test_electra_fine_tunes_in_its_papers_range_and_t5_with_its_papers_optimizer():
    """ELECTRA-Small fine-tunes at 3e-4 (Clark et al. 2020, Table 7); the shared [3e-4, 1e-3] grid put it above
    that. T5 fine-tunes with the paper's Adafactor, its grid holding the paper's constant 1e-3; every other family
    keeps the Trainer's AdamW."""
    assert max(get_family("electra").finetune_defaults["lr_grid"]) <= 3.0e-4
    t5 = get_family("t5").finetune_defaults
    assert t5["optim"] == "adafactor" and 1.0e-3 in t5["lr_grid"]
    assert load_config("configs/t5-budget.yaml").finetune.optim == "adafactor"
    for family in set(family_names()) - {"t5"}:
        assert get_family(family).finetune_defaults.get("optim", "adamw") == "adamw", family


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"lr_grid": [1e-4, 0.0]}, r"'broken': finetune_defaults.*learning rates must be > 0"),
        ({"lr_grid": [-1e-4]}, r"'broken': finetune_defaults.*learning rates must be > 0"),
        ({"lr_grid": [float("nan")]}, r"'broken': finetune_defaults.lr_grid.0: .*finite"),
        ({"lr_grid": [float("inf")]}, r"'broken': finetune_defaults.lr_grid.0: .*finite"),
        ({"lr_grid": []}, r"'broken': finetune_defaults.*lr_grid is empty"),
        ({"warmup_ratio": 1.5}, r"'broken': finetune_defaults.warmup_ratio"),
        ({"optim": "sgd"}, r"'broken': finetune_defaults.optim"),
        ({"lr_grd": [1e-4]}, r"'broken': finetune_defaults has unknown finetune keys \['lr_grd'\]"),
    ],
)
def test_a_bad_family_fine_tune_default_is_refused_naming_the_key(bad, match):
    base = get_family("roberta")
    with pytest.raises(ValueError, match=match):
        FamilySpec(
            name="broken",
            build_config=base.build_config,
            model_class=base.model_class,
            task=base.task,
            objectives=base.objectives,
            tokenizer_types=base.tokenizer_types,
            finetune_defaults=bad,
        )
