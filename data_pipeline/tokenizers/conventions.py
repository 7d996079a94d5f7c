"""The tokenizer conventions: each one's special tokens, post-processing and HF class (see the package docstring);
built-ins registered here, outside ones through the `lmstack.tokenizer_conventions` entry point group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import (
    AddedToken,
)

from core.registry import FAMILIES, TOKENIZER_CONVENTIONS
from runconfig import RunConfig

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]
NUM_SENTINELS = 100
EOT = "<|endoftext|>"
# Oldest transformers the exported tokenizer and model folders are tested with (tests/pretrain/test_export_compat.py).
SUPPORTED_TRANSFORMERS = ">=4.40"


@dataclass(frozen=True)
class Convention:
    """How one kind of tokenizer is saved: the special tokens trained in (ids 0..n-1; T5's sentinels go last),
    the HF special-token kwargs, and a `tokenizer_class` that transformers 4.40+ and 5.x both resolve."""

    specials: list[str]
    hf_tokens: dict[str, Any]
    tokenizer_class: str
    padding_side: str = "right"
    # Byte-level BPE: the tokens added after training (a str is added as a special AddedToken), and whether
    # encoding wraps a sequence as `cls A sep` (`cls A sep sep B sep`, RoBERTa) or adds nothing (GPT-2).
    added_tokens: tuple[str | AddedToken, ...] = ()
    wraps: bool = False
    model_input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    # the saved config carries `do_lower_case` (BERT's classes re-lowercase without it)
    lowercase_flag: bool = False


# name -> Convention (core.registry; outside packages: an entry point group)
CONVENTIONS = TOKENIZER_CONVENTIONS


def register_convention(name: str, conv: Convention) -> None:
    TOKENIZER_CONVENTIONS.register(name, conv)


_MASK = AddedToken("<mask>", lstrip=True, special=True)
ROBERTA = Convention(  # the `roberta` entry point (pyproject.toml)
    BPE_SPECIALS,
    dict(
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token=_MASK,
    ),
    "RobertaTokenizer",
    added_tokens=(_MASK,),
    wraps=True,
)
# GPT-2 has one special token; pad = EOS with left padding is what batched `generate` expects.
GPT2 = Convention(  # the `gpt2` entry point (pyproject.toml)
    [EOT],
    dict(bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT),
    "GPT2Tokenizer",
    padding_side="left",
    added_tokens=(EOT,),
)
BERT = Convention(  # the `bert` entry point (pyproject.toml)
    WORDPIECE_SPECIALS,
    dict(cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]"),
    "BertTokenizer",
    model_input_names=("input_ids", "token_type_ids", "attention_mask"),
    lowercase_flag=True,
)
T5 = Convention(  # the `t5` entry point (pyproject.toml)
    T5_SPECIALS,
    dict(
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=[f"<extra_id_{i}>" for i in range(NUM_SENTINELS)],
    ),
    # transformers 5 rebuilds a T5Tokenizer's pipeline without byte fallback; the generic class loads tokenizer.json
    # as written in both 4.x and 5.x.
    "PreTrainedTokenizerFast",
)


def describe(cfg: RunConfig) -> str:
    """What `train_tokenizer` will train, in words (stage banners)."""
    tc = cfg.tokenizer
    if tc.pretrained_path:
        return f"(copy the pretrained tokenizer {tc.pretrained_path})"
    kind = {
        "bpe": "byte-level BPE",
        "wordpiece": "WordPiece",
        "unigram": "SentencePiece Unigram" + (" with byte fallback" if tc.byte_fallback else ""),
    }[tc.type]
    return f"{kind}, vocabulary {tc.vocab_size:,}, {convention_name(tc.type, cfg.model.family, tc.convention)} special tokens"


def convention_name(tokenizer_type: str, family: str, chosen: str | None = None) -> str:
    """`tokenizer.convention` when set; else wordpiece -> bert, unigram -> t5, and byte-level BPE follows the
    family's spec: RoBERTa's conventions where the family wraps sequences in `<s> ... </s>`, GPT-2's
    (`<|endoftext|>` only) where it does not."""
    if chosen is not None:
        return chosen
    if tokenizer_type == "bpe":
        return "roberta" if FAMILIES.get(family).wraps_sequences else "gpt2"
    return {"wordpiece": "bert", "unigram": "t5"}[tokenizer_type]
