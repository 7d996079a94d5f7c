"""Special-token ids are read from the run's tokenizer by one rule (`special_token_ids`), and every family's config
takes its ids from it: an encoder gets [CLS]/[SEP] where the tokenizer has them, else its <s>/</s>."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from pretrain.families import family_names, get_family
from pretrain.families.registry import special_token_ids
from runconfig.model import ModelConfig

pytestmark = pytest.mark.timeout(60)


def _tokenizer(vocab: list[str], **special: str) -> PreTrainedTokenizerFast:
    model = models.WordLevel(vocab={w: i for i, w in enumerate(vocab)}, unk_token=vocab[0])
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(model), **special)


WORDPIECE = _tokenizer(
    ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "a"],
    unk_token="[UNK]",
    pad_token="[PAD]",
    cls_token="[CLS]",
    sep_token="[SEP]",
    mask_token="[MASK]",
)
BPE = _tokenizer(
    ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "a"],
    bos_token="<s>",
    pad_token="<pad>",
    eos_token="</s>",
    unk_token="<unk>",
    mask_token="<mask>",
)


def test_one_rule_for_both_tokenizer_styles():
    assert special_token_ids(WORDPIECE) == {
        "pad_token_id": 1,
        "bos_token_id": None,
        "eos_token_id": None,
        "cls_token_id": 2,
        "sep_token_id": 3,
    }
    assert special_token_ids(BPE) == {
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "cls_token_id": 0,
        "sep_token_id": 2,
    }


@pytest.mark.parametrize("family", family_names())
@pytest.mark.parametrize("tok", [WORDPIECE, BPE], ids=["wordpiece", "bpe"])
def test_every_family_config_takes_the_rules_ids(family, tok):
    m = ModelConfig(family=family, hidden_size=32, num_layers=2, num_heads=2, ffn_size=64)
    config = get_family(family).build_config(m, tok, 64)
    ids = special_token_ids(tok)
    assert config.pad_token_id == ids["pad_token_id"]
    for key, want in ids.items():
        if key in ("cls_token_id", "sep_token_id") and getattr(config, key, None) is not None:
            assert getattr(config, key) == want, key
    if family == "modernbert":  # an encoder's bos/eos are the [CLS]/[SEP] its inputs carry
        assert (config.bos_token_id, config.eos_token_id) == (ids["cls_token_id"], ids["sep_token_id"])
    elif family in ("gpt2", "llama", "roberta"):
        assert (config.bos_token_id, config.eos_token_id) == (ids["bos_token_id"], ids["eos_token_id"])
    elif family == "t5":
        assert config.eos_token_id == ids["eos_token_id"]
        assert config.decoder_start_token_id == ids["pad_token_id"]
