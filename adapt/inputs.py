"""Labelled rows -> model inputs: the token budget (the model's positions), long inputs (head+tail, truncate,
sliding windows), the special-token frame of one text, a sentence pair as the tokenizer itself encodes it, the
tokenizer a fine-tuned folder saves, and the collator that pads a batch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from core.errors import ConfigError
from data_pipeline.labelled import Row
from data_pipeline.tokenizers import frame_pairs, make_portable
from runconfig.finetune import FinetuneConfig
from runconfig.init_from import find_family


def model_positions(config) -> int | None:
    """Tokens the model can attend to (None: relative positions, no table bound), from the family registry
    where the export is a registered family's, by init_from's rule (RoBERTa reserves padding_idx + 1 rows)."""

    n = getattr(config, "max_position_embeddings", None)
    if n is None or getattr(config, "is_encoder_decoder", False):
        return None
    spec = find_family(config.model_type, getattr(config, "architectures", None))
    return n if spec is None else spec.position_limit(n)


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


def frame_pair_task(tok: PreTrainedTokenizerBase, model_dir: Path) -> None:
    """Before a pair task is encoded: the tokenizer frames `tok(a, b)` with something between the texts (a
    separator added to GPT-2's and Llama's pair template, data_pipeline.tokenizers.frame_pairs), so training and
    the tokenizer the fine-tuned folder saves encode a pair alike; a tokenizer with no separator is refused."""
    if not frame_pairs(tok):
        raise ConfigError(
            f"finetune.tasks.text_pair_column: the tokenizer of {model_dir} puts nothing between a pair's two texts "
            "and has no sep or eos token to put there; a pair task needs a tokenizer that separates them"
        )


def uses_segments(config) -> bool:
    """Whether the model reads segment ids (a token-type table of two or more rows: BERT's, ELECTRA's); the pair's
    `token_type_ids` are then fed as `tok(a, b)` gives them, else dropped (RoBERTa's one row, ModernBERT's none)."""
    return int(getattr(config, "type_vocab_size", 0) or 0) > 1


def encode(
    tok: PreTrainedTokenizerBase,
    rows: list[Row],
    labels: dict[str, int],
    max_length: int,
    ft: FinetuneConfig,
    text_to_text: bool,
    regression: bool = False,
    segments: bool = False,
) -> Encoded:
    """Rows -> one feature per window. A pair task (rows with a second text) is `tok(a, b)` itself, cut
    longest-first to `max_length` by the tokenizer (one window per example; its segment ids kept where the model
    reads them, `segments`), so the saved tokenizer reproduces every input; a regression label is its float."""
    if rows and rows[0][3] is not None:
        return _encode_pairs(tok, rows, labels, max_length, text_to_text, regression, segments)
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
    segments: bool,
) -> Encoded:
    enc = tok(
        [r[1] for r in rows],
        [r[3] or "" for r in rows],
        truncation="longest_first",  # run_glue's truncation for pair tasks
        max_length=max_length,
        verbose=False,
    )
    label_ids = (
        {name: tok(name, add_special_tokens=True)["input_ids"] for name in labels} if text_to_text else {}
    )
    keep_types = segments and "token_type_ids" in enc
    feats = []
    for i, row in enumerate(rows):
        f: dict[str, Any] = {"input_ids": enc["input_ids"][i]}
        if keep_types:
            f["token_type_ids"] = enc["token_type_ids"][i]
        f["labels"] = label_ids[row[2]] if text_to_text else _label(row[2], labels, regression)
        feats.append(f)
    return Encoded(feats, np.arange(len(rows)), _gold(rows, labels, regression))


def save_finetuned_tokenizer(tok: PreTrainedTokenizerBase, out_dir: Path, model_dir: Path) -> None:
    """The tokenizer a fine-tuned folder holds, loadable in transformers 4.40+ and 5.x as the export's is: 5.x
    writes `tokenizer_class: TokenizersBackend` for ModernBERT and T5 (unknown to 4.x), so the export's own class is
    kept (make_portable then fixes what 4.x cannot read); the input names are those the model takes (no
    `token_type_ids` where it has no segment table), so `model(**tok(a, b))` runs as training did."""
    tok.save_pretrained(str(out_dir))
    source = Path(model_dir) / "tokenizer_config.json"
    cls = json.loads(source.read_text()).get("tokenizer_class") if source.is_file() else None
    extra: dict[str, Any] = {"model_input_names": list(tok.model_input_names)}
    if cls not in (None, "TokenizersBackend"):
        extra["tokenizer_class"] = cls
    make_portable(Path(out_dir), **extra)


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
        if "token_type_ids" in feats[0]:  # segment ids (pairs for BERT-style models), padded with 0
            types = torch.zeros((len(feats), n), dtype=torch.long)
            for i, f in enumerate(feats):
                types[i, : len(f["token_type_ids"])] = torch.tensor(f["token_type_ids"])
            out["token_type_ids"] = types
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
