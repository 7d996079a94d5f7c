"""GPT causal LM: next-token labels, with optional document masking inside packed blocks.

Document masking, the transformers 5.x way: GPT2LMHeadModel accepts `position_ids`; when they restart at 0
inside a row and no 2-D `attention_mask` is given, `masking_utils.create_causal_mask` detects the packed
sequences (`find_packed_sequence_indices`) and builds a block-diagonal causal mask for every attention
backend (eager, sdpa, flex; flash-attention reads the same position_ids). A pre-built 4-D mask would also be
accepted, but its format differs per backend (additive float in the model dtype for eager, boolean for sdpa;
a boolean mask given to eager is silently added as 0/1), so position_ids is the portable form.
REQUIREMENT: transformers only runs that detection when no KV cache is built, so the training model must have
`config.use_cache = False` (or be called with use_cache=False); see pretrain/objectives/ (`causal_prepare`). Trailing padding becomes its own "document" so real tokens never see it, and its labels
are -100. The first token of each document gets label -100 too (as HF's DataCollatorWithFlattening does): with
attention reset there is no context to predict it from, exactly as when the document is trained alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from data_pipeline.objectives._batch import stack_ids, valid_mask


def trailing_padding(ids: np.ndarray, lengths: np.ndarray, pad_id: int, eos_id: int | None) -> np.ndarray:
    """[batch, length] True on padding. When pad == eos (GPT-2's usual setup) only the trailing run past the
    last EOS-terminated document counts, so real EOS tokens keep their labels."""
    pad = ~valid_mask(lengths, ids.shape[1])
    if pad_id == eos_id:
        is_pad = ids == pad_id
        # trailing run: every position from the last non-pad token + 1 onwards (keep one EOS after it)
        L = ids.shape[1]
        last_real = L - 1 - np.argmax((~is_pad)[:, ::-1], axis=1)
        last_real = np.where((~is_pad).any(axis=1), last_real, -1)
        pad |= np.arange(L)[None, :] > (last_real + 1)[:, None]
    else:
        pad |= ids == pad_id
    return pad


def document_positions(segment_ids: np.ndarray, padding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids restarting at 0 per document, is-first-token-of-document) for [batch, length] segments."""
    B, L = segment_ids.shape
    seg = np.where(padding, segment_ids.max(initial=0) + 1, segment_ids)
    first = np.ones((B, L), dtype=bool)
    first[:, 1:] = seg[:, 1:] != seg[:, :-1]
    idx = np.arange(L, dtype=np.int64)
    start = np.maximum.accumulate(np.where(first, idx[None, :], 0), axis=1)
    return idx[None, :] - start, first


class CausalCollator:
    """Collate packed samples into GPT2LMHeadModel inputs (the model shifts labels itself)."""

    def __init__(self, tokenizer: Any, *, document_masking: bool = False, packed: bool = True) -> None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("causal LM needs a tokenizer with a pad or EOS token")
        self.pad_id = int(pad)
        self.eos_id = None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)
        self.document_masking = document_masking
        self.packed = packed  # False for line_by_line: one document per sample, no segment_ids needed

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = stack_ids(samples, self.pad_id)
        padding = trailing_padding(ids, lengths, self.pad_id, self.eos_id)
        labels = np.where(padding, -100, ids)
        if not self.document_masking:
            batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
            # Full packed blocks carry no mask: an all-ones mask changes no logit, yet transformers reads it on
            # the host each forward (a device sync) and, under torch.compile, must keep it, which moves SDPA off
            # its flash kernel (H100, bench/mfu_gpu.py).
            if padding.any():
                batch["attention_mask"] = torch.from_numpy((~padding).astype(np.int64))
            return batch
        if "segment_ids" in samples[0]:
            segments, _ = stack_ids(samples, 0, key="segment_ids")
            if segments.shape != ids.shape:
                raise ValueError(f"segment_ids shape {segments.shape} does not match input_ids {ids.shape}")
        elif self.packed:
            raise KeyError(
                "objective.document_masking needs 'segment_ids' in every packed sample (contiguous packing "
                "provides them); without them documents would silently attend to each other"
            )
        else:
            # line_by_line samples hold one document each: the whole row is one segment.
            segments = np.zeros_like(ids)
        positions, first = document_positions(segments, padding)
        labels = np.where(first, -100, labels)
        # No attention_mask on purpose: a 2-D mask would switch off transformers' packed-sequence detection.
        return {
            "input_ids": torch.from_numpy(ids),
            "position_ids": torch.from_numpy(positions),
            "labels": torch.from_numpy(labels),
        }
