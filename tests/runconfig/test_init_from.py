"""`model.init_from` is checked against the run at load, before any work (issue 48 item 1): the family, the
weights, the tokenizer's vocabulary, the positions and the objective; each refusal names the key or file and both
values. The folders are made by transformers alone (tests/hf_folder.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runconfig import ConfigError, load_config
from tests.hf_folder import gpt2_folder

ROOT = Path(__file__).resolve().parents[2]
GPT2 = str(ROOT / "configs/gpt2-tiny.yaml")
ROBERTA = str(ROOT / "configs/roberta-tiny.yaml")
RUN = ["packing.seq_len=32", "model.size=tiny"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return gpt2_folder(tmp_path_factory.mktemp("hf") / "gpt2")


def test_architecture_and_tokenizer_come_from_the_folder(folder):
    cfg = load_config(GPT2, [*RUN, f"model.init_from={folder}"])
    m = cfg.model
    assert (m.hidden_size, m.num_layers, m.num_heads, m.ffn_size, m.max_position_embeddings) == (
        32,
        2,
        2,
        64,
        64,
    )
    assert m.init_from == str(folder)
    assert cfg.tokenizer.pretrained_path == str(folder)  # the run tokenizes with the folder's tokenizer
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    assert cfg.tokenizer.vocab_size == rows  # the folder's vocabulary sizes the plan's embedding


def test_another_family_is_refused(folder):
    with pytest.raises(
        ConfigError, match=r"model.init_from: .*model_type 'gpt2', but model.family is 'roberta'"
    ):
        load_config(ROBERTA, [*RUN, f"model.init_from={folder}"])


def test_a_folder_without_weights_is_refused(tmp_path):
    bare = gpt2_folder(tmp_path / "bare", weights=False)
    with pytest.raises(ConfigError, match=r"model.init_from: .*holds no weights \(none of model.safetensors"):
        load_config(GPT2, [*RUN, f"model.init_from={bare}"])
    with pytest.raises(ConfigError, match=r"model.init_from: .*config.json does not exist"):
        load_config(GPT2, [*RUN, f"model.init_from={tmp_path}"])


def test_a_tokenizer_the_vocabulary_disagrees_with_is_refused(folder, tmp_path):
    other = gpt2_folder(tmp_path / "other", vocab_size=300)  # another vocabulary, smaller than the folder's
    with pytest.raises(
        ConfigError, match=r"tokenizer.pretrained_path: .*\d+ tokens\) is not the one .*\d+ tokens"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={folder}", f"tokenizer.pretrained_path={other}"])
    no_tok = gpt2_folder(tmp_path / "no-tok", tokenizer=False)
    small = gpt2_folder(tmp_path / "small", vocab_size=300, tokenizer=False)  # fewer rows than the tokenizer
    with pytest.raises(
        ConfigError, match=r"tokenizer.pretrained_path: .*\d+ tokens, but .*vocab_size is \d+: ids past"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={small}", f"tokenizer.pretrained_path={folder}"])
    with pytest.raises(
        ConfigError, match=r"model.init_from: .*holds no tokenizer.*set tokenizer.pretrained_path"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={no_tok}"])
    ok = load_config(GPT2, [*RUN, f"model.init_from={no_tok}", f"tokenizer.pretrained_path={folder}"])
    assert ok.tokenizer.pretrained_path == str(folder)


def test_positions_and_objective_are_checked(folder, tmp_path):
    with pytest.raises(
        ConfigError, match=r"packing.seq_len: 128 exceeds the 64 positions of model.init_from"
    ):
        load_config(GPT2, ["packing.seq_len=128", f"model.init_from={folder}"])
    clf = gpt2_folder(tmp_path / "clf", head="GPT2ForSequenceClassification")
    with pytest.raises(
        ConfigError, match=r"objective.type: 'causal' trains GPT2LMHeadModel, .*GPT2ForSequence"
    ):
        load_config(GPT2, [*RUN, f"model.init_from={clf}"])
