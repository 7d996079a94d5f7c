"""T5 span corruption (Raffel et al. 2020), batched and vectorised.

Semantics are those of the reference code in t5/data/preprocessors.py:
- `random_spans_noise_mask`: num_noise = round(n * density) clamped to [1, n-1], num_spans =
  max(round(num_noise / mean_span), 1); noise and non-noise tokens are each cut into num_spans non-empty
  segments uniformly at random (`_random_segmentation`), interleaved non-noise first.
- `noise_span_to_unique_sentinel`: each noise span in the input becomes one sentinel, descending from
  `<extra_id_0>` (the highest id); `nonnoise_span_to_unique_sentinel`: targets are sentinel + dropped span ...;
  both end with EOS.

Formulation: instead of materialising a [batch, n] noise mask and boolean-compacting it (the reference and HF's
numpy collator do that one example at a time), each segmentation is "choose num_spans-1 cut points among
n-1 slots" = the smallest random keys (one np.partition over the whole batch), and every output position is
computed arithmetically from per-span offsets, then filled with one gather/scatter. Randomness comes from
(seed, epoch, sample_id) (see `_rng`), so results do not depend on batch composition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from data_pipeline.objectives._batch import sample_meta, stack_ids
from data_pipeline.objectives._rng import STREAM_SPAN_NOISE, STREAM_SPAN_NONNOISE, sample_keys, stream_bits
from data_pipeline.objectives.t5_lengths import t5_lengths

_U64 = np.uint64
_POS_BITS = 20


def noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(num_noise_tokens, num_noise_spans) for a sequence of `length` tokens, as the T5 reference computes them."""
    num_noise = int(round(length * noise_density))  # Python round (half-to-even), as t5_lengths uses
    num_noise = min(max(num_noise, 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    # Guard for extreme settings (density > 0.5 or mean span < 1) where the reference would need more
    # non-noise (or noise) segments than tokens.
    return num_noise, min(num_spans, num_noise, length - num_noise)


def sentinel_table(tokenizer: Any) -> np.ndarray:
    """Ids of `<extra_id_0>`, `<extra_id_1>`, ... in order (T5 puts them at the top of the vocab, descending)."""
    vocab = tokenizer.get_vocab()
    ids = []
    while f"<extra_id_{len(ids)}>" in vocab:
        ids.append(vocab[f"<extra_id_{len(ids)}>"])
    if not ids:
        raise ValueError("span corruption needs a tokenizer with T5 sentinels '<extra_id_0>', '<extra_id_1>', ...")
    return np.asarray(ids, dtype=np.int64)


def _random_segmentation(keys: np.ndarray, num_items: int, num_segments: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut each row's `num_items` items into `num_segments` non-empty segments, all cuttings equally likely.

    Returns (segment index of every item [B, num_items], first item of every segment [B, num_segments]).
    Same distribution as the reference's shuffled boolean vector: the cut points are a uniform random
    (num_segments-1)-subset of the num_items-1 gaps.
    """
    B = keys.shape[0]
    first = np.zeros((B, num_items), dtype=bool)
    if num_segments > 1:
        gaps = num_items - 1
        key = ((stream_bits(keys, gaps) >> _U64(_POS_BITS)) << _U64(_POS_BITS)) | np.arange(gaps, dtype=_U64)
        kth = np.partition(key, num_segments - 2, axis=1)[:, num_segments - 2]
        first[:, 1:] = key <= kth[:, None]
    first[:, 0] = True
    seg = np.cumsum(first, axis=1) - 1
    starts = np.nonzero(first)[1].reshape(B, num_segments)
    return seg, starts


def span_corrupt(
    tokens: np.ndarray,
    noise_keys: np.ndarray,
    nonnoise_keys: np.ndarray,
    noise_density: float,
    mean_noise_span_length: float,
    sentinels: np.ndarray,
    eos_id: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt a [batch, n] block of equal-length rows; returns (inputs [B, n-noise+spans+1], targets
    [B, noise+spans+1]), both ending with EOS."""
    B, n = tokens.shape
    if n < 2:  # the reference pads the length to 2 and truncates: no noise, targets = <extra_id_0>
        inputs = np.concatenate([tokens, np.full((B, 1), eos_id)], axis=1)
        return inputs, np.tile(np.asarray([sentinels[0], eos_id], dtype=np.int64), (B, 1))
    num_noise, S = noise_counts(n, noise_density, mean_noise_span_length)
    if S > sentinels.shape[0]:
        raise ValueError(
            f"{S} noise spans per sequence but the tokenizer has only {sentinels.shape[0]} sentinels: "
            "shorten packing.seq_len or raise objective.mean_noise_span_length"
        )
    num_keep = n - num_noise
    seg_n, starts_n = _random_segmentation(noise_keys, num_noise, S)
    seg_k, starts_k = _random_segmentation(nonnoise_keys, num_keep, S)
    ends_k = np.empty_like(starts_k)  # non-noise tokens up to the end of each non-noise span
    ends_k[:, :-1] = starts_k[:, 1:]
    ends_k[:, -1] = num_keep
    span = np.arange(S, dtype=np.int64)[None, :]

    # Layout (reference order): keep_0 noise_0 keep_1 noise_1 ... keep_{S-1} noise_{S-1}.
    i = np.arange(num_keep, dtype=np.int64)[None, :]
    j = np.arange(num_noise, dtype=np.int64)[None, :]
    raw_keep = i + np.take_along_axis(starts_n, seg_k, axis=1)  # + noise tokens in earlier spans
    raw_noise = j + np.take_along_axis(ends_k, seg_n, axis=1)  # + non-noise tokens up to this span

    inputs = np.empty((B, num_keep + S + 1), dtype=np.int64)
    np.put_along_axis(inputs, i + seg_k, np.take_along_axis(tokens, raw_keep, axis=1), axis=1)
    np.put_along_axis(inputs, ends_k + span, np.broadcast_to(sentinels[:S], (B, S)), axis=1)
    inputs[:, -1] = eos_id

    targets = np.empty((B, num_noise + S + 1), dtype=np.int64)
    np.put_along_axis(targets, j + seg_n + 1, np.take_along_axis(tokens, raw_noise, axis=1), axis=1)
    np.put_along_axis(targets, starts_n + span, np.broadcast_to(sentinels[:S], (B, S)), axis=1)
    targets[:, -1] = eos_id
    return inputs, targets


class SpanCorruptionCollator:
    """Collate raw t5_spans blocks into T5ForConditionalGeneration inputs: input_ids (exactly `inputs_length`),
    attention_mask, labels (exactly the targets length from `t5_lengths`; the model derives decoder inputs)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        seed: int,
        inputs_length: int,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0,
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("span corruption needs a tokenizer with pad and EOS tokens")
        self.seed = int(seed)
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.density = float(noise_density)
        self.mean_span = float(mean_noise_span_length)
        self.inputs_length = int(inputs_length)
        self.raw_length, self.targets_length = t5_lengths(self.inputs_length, self.density, self.mean_span)
        self.sentinels = sentinel_table(tokenizer)
        _, spans = noise_counts(self.raw_length, self.density, self.mean_span)
        if spans > self.sentinels.shape[0]:
            raise ValueError(
                f"packing.seq_len {self.inputs_length} gives {spans} noise spans but the tokenizer has only "
                f"{self.sentinels.shape[0]} sentinels"
            )

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = stack_ids(samples, self.pad_id)
        # A block cut short at the end of the stream may arrive right-padded: corrupt only its real tokens.
        real = ids != self.pad_id
        lengths = np.minimum(lengths, ids.shape[1] - np.argmax(real[:, ::-1], axis=1))
        lengths = np.where(real.any(axis=1), lengths, 0)
        epoch, sample_id = sample_meta(samples)
        noise_keys = sample_keys(self.seed, epoch, sample_id, STREAM_SPAN_NOISE)
        keep_keys = sample_keys(self.seed, epoch, sample_id, STREAM_SPAN_NONNOISE)

        B = ids.shape[0]
        inputs = np.full((B, self.inputs_length), self.pad_id, dtype=np.int64)
        labels = np.full((B, self.targets_length), -100, dtype=np.int64)
        attention = np.zeros((B, self.inputs_length), dtype=np.int64)
        for n in np.unique(lengths):  # one group per distinct length (normally exactly one)
            rows = np.flatnonzero(lengths == n)
            inp, tgt = span_corrupt(
                ids[rows, :n], noise_keys[rows], keep_keys[rows], self.density, self.mean_span,
                self.sentinels, self.eos_id,
            )
            if inp.shape[1] > self.inputs_length or tgt.shape[1] > self.targets_length:
                raise ValueError(
                    f"a t5_spans sample of {n} tokens corrupts to {inp.shape[1]} inputs / {tgt.shape[1]} targets, "
                    f"over packing.seq_len {self.inputs_length} / {self.targets_length}: blocks must hold at most "
                    f"{self.raw_length} tokens (t5_lengths)"
                )
            inputs[rows, : inp.shape[1]] = inp
            attention[rows, : inp.shape[1]] = 1
            labels[rows, : tgt.shape[1]] = tgt
        return {
            "input_ids": torch.from_numpy(inputs),
            "attention_mask": torch.from_numpy(attention),
            "labels": torch.from_numpy(labels),
        }
