"""Labelled rows -> model inputs: the token budget (the model's positions), long inputs (head+tail, truncate,
sliding windows), the special-token frame, and the collator that pads a batch."""

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
    gold: np.ndarray  # label index per example


def special_frame(tok: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer's post-processor puts before and after a text (e.g. <s> .. </s>), found
    by encoding a probe with and without them (fast tokenizers expose no build_inputs_with_special_tokens)."""
    plain = tok("hello world", add_special_tokens=False)["input_ids"]
    full = tok("hello world", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    raise ValueError(f"cannot locate the text inside the special-token frame of {type(tok).__name__}")


def encode(
    tok: PreTrainedTokenizerBase,
    rows: list[Row],
    labels: dict[str, int],
    max_length: int,
    ft: FinetuneConfig,
    text_to_text: bool,
) -> Encoded:
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
            f["labels"] = label_ids[row[2]] if text_to_text else labels[row[2]]
            feats.append(f)
            owner.append(i)
    return Encoded(feats, np.asarray(owner), np.asarray([labels[r[2]] for r in rows]))


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
            out["labels"] = torch.tensor([f["labels"] for f in feats])
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
