"""Turning the loader's per-sample dicts into batch arrays (shared by every collator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def stack_ids(
    samples: Sequence[dict[str, Any]], pad_id: int, key: str = "input_ids"
) -> tuple[np.ndarray, np.ndarray]:
    """[batch, longest] int64 ids right-padded with `pad_id`, plus each sample's own length.

    Fixed-length packed samples stack without copying per row; `line_by_line` samples of different lengths
    are padded to the longest in the batch.
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    try:
        rows = [s[key] for s in samples]
    except KeyError as e:
        raise KeyError(f"sample is missing '{key}' (keys: {sorted(samples[0])})") from e
    try:  # fast path: packed samples of one length (contract 3), checked once on the stacked array
        ids = np.array(rows)  # 2-3x less fixed cost than np.stack; ragged rows raise ValueError
    except ValueError:
        ids = None
    if ids is not None and ids.ndim == 2:
        _check_ids(ids, key)
        return ids.astype(np.int64, copy=False), np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
    rows = [np.asarray(r) for r in rows]
    for r in rows:
        if r.ndim != 1:
            raise ValueError(f"'{key}' must be a 1-D token sequence per sample, got shape {r.shape}")
        _check_ids(r, key)
    lengths = np.fromiter((r.shape[0] for r in rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):  # one slice copy per sample, not per token
        out[i, : r.shape[0]] = r
    return out, lengths


def _check_ids(a: np.ndarray, key: str) -> None:
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"'{key}' must hold integer token ids, got dtype {a.dtype}")


def sample_meta(samples: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(epoch, sample_id) per sample: the inputs of every random decision a collator makes.

    Missing ids are an error rather than a silent fallback: without them a resumed run would not reproduce its
    masks, and a static (per-content) fallback would quietly turn dynamic masking off.
    """
    try:
        sample_id = np.array([s["sample_id"] for s in samples], dtype=np.int64)
    except KeyError as e:
        raise KeyError(
            "sample is missing 'sample_id': the collator derives its randomness from (seed, epoch, sample_id); "
            "data_pipeline.loader.PretrainLoader provides it"
        ) from e
    epoch = np.array([s.get("epoch", 0) for s in samples], dtype=np.int64)
    return epoch, sample_id


def valid_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """[batch, width] True inside each sample's own length."""
    return np.arange(width)[None, :] < lengths[:, None]
