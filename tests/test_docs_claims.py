"""Claims the guides make about the code, checked against it (issue 43 friction 6): a guide that names the
registered families, the transformers versions the exports load with, or the API a reader uses must say what the
code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pretrain.families import family_names, get_family
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[1]
TRAINING = (ROOT / "docs" / "training.md").read_text()
EXTENDING = (ROOT / "docs" / "extending.md").read_text()

pytestmark = pytest.mark.timeout(60)


def test_extending_sample_error_is_the_real_one():
    shown = re.search(
        r"`(model\.family: unknown family 'bert' \(registered: \[[^\]]*\]\))`", " ".join(EXTENDING.split())
    )
    assert shown, "docs/extending.md lost its sample error"
    with pytest.raises(Exception) as err:
        load_config(ROOT / "configs" / "roberta-tiny.yaml", ["model.family=bert"])
    assert shown.group(1) in " ".join(str(err.value).split()), (shown.group(1), str(err.value))


def test_extending_reader_checklist_names_the_reader_api():
    section = EXTENDING.split("## A reader", 1)[1].split("\n## ", 1)[0]
    for api in (
        "SourceFile",
        "file.path",
        "file.rel",
        "Document(",
        "stable_id(",
        "errors.add(",
        "core/document.py",
    ):
        assert api in section, api


def test_training_guide_states_each_familys_oldest_transformers():
    oldest = {get_family(f).min_transformers for f in family_names()}
    for version in oldest:
        assert f"transformers >= {version}" in TRAINING, version
    for family in family_names():
        spec = get_family(family)
        if spec.min_transformers != min(oldest):
            assert re.search(
                rf"{spec.min_transformers}[^.]*{family}|{family}[^.]*{spec.min_transformers}", TRAINING, re.I
            ), family


def test_training_guide_does_not_put_the_random_init_arm_in_model_index():
    sentence = next(s for s in " ".join(TRAINING.split()).split(". ") if "`model-index`" in s)
    assert "random-init" not in sentence and "random init" not in sentence, sentence


def test_training_guide_states_llamas_tokenizer_convention():
    conventions = TRAINING.split("**Tokenizer conventions.**", 1)[1].split("\n- **", 1)[0]
    assert "Llama" in conventions and "no BOS" in conventions, conventions
