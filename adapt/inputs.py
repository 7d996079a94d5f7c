"""Labelled rows -> model inputs: the token budget (the model's positions), long inputs (head+tail, truncate,
sliding windows), the special-token frame of one text or a sentence pair, and the collator that pads a batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from data_pipeline.labelled import Row
from pretrain.families import family_names, get_family
from runconfig.finetune import FinetuneConfig


def model_positions(config) -> int | None:
    """Tokens the model can attend to (None: relative positions, no table bound), from the family registry
    where the export's model type is a registered family (RoBERTa reserves padding_idx + 1 rows)."""

    n = getattr(config, "max_position_embeddings", None)
    if n is None or getattr(config, "is_encoder_decoder", False):
        return None
    if config.model_type in family_names():
        return get_family(config.model_type).position_limit(n)
    return n


def resolve_max_length(ft: FinetuneConfig, config) -> int:
    limit = model_positions(config)
    if ft.max_length == "model":
        if limit is None:
            raise ValueError(
                "finetune.max_length: 'model' needs a model with a position table; give a number"
            )
        return limit
    if limit is not None and ft.max_length > limit:
        raise ValueError(
            f"finetune.max_length ({ft.max_length}) exceeds the {limit} positions of the model; "
            f"use at most {limit} (or 'model')"
        )
    return ft.max_length


def windows(ids: list[int], budget: int, ft: FinetuneConfig) -> list[list[int]]:
    """Token ids (no special tokens) -> the pieces that fit `budget`: one (truncate, head+tail) or several
    overlapping windows (sliding_window)."""
    if len(ids) <= budget:
        return [ids]
    if ft.long_inputs == "truncate":
        return [ids[:budget]]
    if ft.long_inputs == "head_tail":
        head = round(budget * ft.head_fraction)
        return [ids[:head] + ids[len(ids) - (budget - head) :]]
    stride = max(1, round(budget * ft.window_stride))
    out = [ids[i : i + budget] for i in range(0, len(ids) - budget + stride, stride)]
    return [w for w in out if w]


@dataclass
class Encoded:
    features: list[dict[str, Any]]  # one per window
    owner: np.ndarray  # example index of each window
    gold: np.ndarray  # label index per example (regression: the float label)


def special_frame(tok: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer's post-processor puts before and after a text (e.g. <s> .. </s>), found
    by encoding a probe with and without them (fast tokenizers expose no build_inputs_with_special_tokens)."""
    plain = tok("hello world", add_special_tokens=False)["input_ids"]
    full = tok("hello world", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    raise ValueError(f"cannot locate the text inside the special-token frame of {type(tok).__name__}")


def pair_frame(tok: PreTrainedTokenizerBase) -> tuple[list[int], list[int], list[int]]:
    """The special tokens the tokenizer puts before, between and after a sentence pair (tokenizer(a, b): BERT's
    [CLS] a [SEP] b [SEP], RoBERTa's <s> a </s></s> b </s>); a tokenizer that puts nothing between the two texts
    (GPT-2's) gets its separator or end-of-text token there, so the model can tell where the first text ends."""
    a = tok("hello world", add_special_tokens=False)["input_ids"]
    b = tok("good morning", add_special_tokens=False)["input_ids"]
    full = tok("hello world", "good morning", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(a) + 1):
        if full[i : i + len(a)] != a:
            continue
        for j in range(i + len(a), len(full) - len(b) + 1):
            if full[j : j + len(b)] == b:
                prefix, mid, suffix = full[:i], full[i + len(a) : j], full[j + len(b) :]
                if not mid:
                    sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
                    mid = [] if sep is None else [sep]
                return prefix, mid, suffix
    raise ValueError(f"cannot locate a sentence pair inside the special-token frame of {type(tok).__name__}")


def pair_pieces(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Both texts cut to `budget` tokens together, a token off the longer one at a time (the tokenizer's
    'longest_first' truncation, run_glue's for pair tasks)."""
    over = len(a) + len(b) - budget
    if over <= 0:
        return a, b
    keep_a, keep_b = len(a), len(b)
    for _ in range(over):
        if keep_a >= keep_b:
            keep_a -= 1
        else:
            keep_b -= 1
    return a[:keep_a], b[:keep_b]


def encode(
    tok: PreTrainedTokenizerBase,
    rows: list[Row],
    labels: dict[str, int],
    max_length: int,
    ft: FinetuneConfig,
    text_to_text: bool,
    regression: bool = False,
) -> Encoded:
    """Rows -> one feature per window. A pair task (rows with a second text) is framed as the tokenizer frames a
    pair and cut longest-first to the budget (one window per example); a regression label is its float."""
    if rows and rows[0][3] is not None:
        return _encode_pairs(tok, rows, labels, max_length, text_to_text, regression)
    prefix, suffix = special_frame(tok)
    budget = max_length - len(prefix) - len(suffix)
    raw = tok([r[1] for r in rows], add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    label_ids = (
        {name: tok(name, add_special_tokens=True)["input_ids"] for name in labels} if text_to_text else {}
    )
    feats, owner = [], []
    for i, (ids, row) in enumerate(zip(raw, rows, strict=True)):
        for piece in windows(ids, budget, ft):
            f: dict[str, Any] = {"input_ids": prefix + piece + suffix}
            f["labels"] = label_ids[row[2]] if text_to_text else _label(row[2], labels, regression)
            feats.append(f)
            owner.append(i)
    return Encoded(feats, np.asarray(owner), _gold(rows, labels, regression))


def _label(y: str, labels: dict[str, int], regression: bool) -> int | float:
    return float(y) if regression else labels[y]


def _gold(rows: list[Row], labels: dict[str, int], regression: bool) -> np.ndarray:
    return np.asarray([_label(r[2], labels, regression) for r in rows], dtype=float if regression else int)


def _encode_pairs(
    tok: PreTrainedTokenizerBase,
    rows: list[Row],
    labels: dict[str, int],
    max_length: int,
    text_to_text: bool,
    regression: bool,
) -> Encoded:
    prefix, mid, suffix = pair_frame(tok)
    budget = max_length - len(prefix) - len(mid) - len(suffix)
    first = tok([r[1] for r in rows], add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    second = tok([r[3] or "" for r in rows], add_special_tokens=False, truncation=False, verbose=False)[
        "input_ids"
    ]
    label_ids = (
        {name: tok(name, add_special_tokens=True)["input_ids"] for name in labels} if text_to_text else {}
    )
    feats = []
    for a, b, row in zip(first, second, rows, strict=True):
        a, b = pair_pieces(a, b, budget)
        feats.append(
            {
                "input_ids": prefix + a + mid + b + suffix,
                "labels": label_ids[row[2]] if text_to_text else _label(row[2], labels, regression),
            }
        )
    return Encoded(feats, np.arange(len(rows)), _gold(rows, labels, regression))


class Collator:
    """Right-pads input ids (attention mask from lengths) and, for text-to-text, the target ids with -100."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, feats: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        n = max(len(f["input_ids"]) for f in feats)
        ids = torch.full((len(feats), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(feats), n), dtype=torch.long)
        for i, f in enumerate(feats):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[i, : len(f["input_ids"])] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if isinstance(feats[0]["labels"], list):
            m = max(len(f["labels"]) for f in feats)
            lab = torch.full((len(feats), m), -100, dtype=torch.long)
            for i, f in enumerate(feats):
                lab[i, : len(f["labels"])] = torch.tensor(f["labels"])
            out["labels"] = lab
        else:
            out["labels"] = torch.tensor([f["labels"] for f in feats])  # float labels: regression
        return out


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict[str, Any]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are: the Trainer moves a fine-tuned model to the GPU, and scoring must follow."""
    return next(model.parameters()).device


def on_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}
