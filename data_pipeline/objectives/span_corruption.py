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

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from data_pipeline.objectives._batch import sample_meta, stack_ids
from data_pipeline.objectives._rng import STREAM_SPAN, sample_keys, stream_bits32
from data_pipeline.objectives.t5_lengths import t5_lengths


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


def _segment_starts(bits: np.ndarray, num_noise: int, num_keep: int, num_spans: int) -> np.ndarray:
    """Cut each row's noise tokens and its non-noise tokens into `num_spans` non-empty segments each, all
    cuttings equally likely. `bits` [B, num_noise-1 + num_keep-1] are the row's random words (noise gaps
    first). Returns [2B, num_spans+1] ascending segment starts (rows :B noise, B: non-noise), each row closed by
    its item count.

    Same distribution as the reference's `_random_segmentation` (a shuffled boolean vector): the cut points
    are a uniform random (num_spans-1)-subset of the gaps, here the gaps with the smallest random keys. Both
    segmentations share one partition call (the shorter noise rows padded with never-selected keys).
    """
    B = bits.shape[0]
    out = np.empty((2 * B, num_spans + 1), dtype=np.int64)
    out[:, 0] = 0
    out[:B, -1] = num_noise
    out[B:, -1] = num_keep
    if num_spans == 1:
        return out
    g_noise, g_keep = num_noise - 1, num_keep - 1
    width = max(g_noise, g_keep)
    idx_bits = max(int(width - 1).bit_length(), 1)
    # Random high bits with the gap index in the low bits: keys are unique and carry their index, so a plain
    # partition (2-3x faster than argpartition) selects the gaps. 32-bit keys keep >= 20 random bits up to
    # 4096 gaps (a tie at the selection boundary, ~n/2^20, only prefers the lower index).
    dtype = np.uint32 if idx_bits <= 12 else np.uint64
    if dtype is np.uint64:
        bits = bits.astype(np.uint64) << np.uint64(32)
    low = dtype((1 << idx_bits) - 1)
    key = np.full((2 * B, width), np.iinfo(dtype).max, dtype=dtype)
    idx = np.arange(width, dtype=dtype)
    np.bitwise_or(bits[:, :g_noise] & ~low, idx[:g_noise], out=key[:B, :g_noise])
    np.bitwise_or(bits[:, g_noise:] & ~low, idx[:g_keep], out=key[B:, :g_keep])
    cut = np.partition(key, num_spans - 2, axis=1)[:, : num_spans - 1] & low
    cut.sort(axis=1)
    out[:, 1:-1] = cut
    out[:, 1:-1] += 1
    return out


def _scratch(work: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    arr = work.get(name)
    if arr is None or arr.shape != shape:
        arr = work[name] = np.empty(shape, dtype=np.int64)
    return arr


def span_corrupt(
    tokens: np.ndarray,
    keys: np.ndarray,
    noise_density: float,
    mean_noise_span_length: float,
    sentinels: np.ndarray,
    eos_id: int,
    work: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt a [batch, n] block of equal-length rows (one random key per row); returns (inputs
    [B, n-noise+spans+1], targets [B, noise+spans+1]), both ending with EOS.

    `work` (optional, one per thread) keeps the large scratch arrays between calls: above ~512 KB each fresh
    allocation is a new mmap whose page faults cost more than the arithmetic (3x slower at batch 128)."""
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
    w_in, w_tg = num_keep + S + 1, num_noise + S + 1
    # Reference layout: keep_0 noise_0 keep_1 noise_1 ... keep_{S-1} noise_{S-1}.
    at = _segment_starts(stream_bits32(keys, n - 2), num_noise, num_keep, S)
    noise_at, keep_at = at[:B], at[B:]  # [B, S+1]: noise / non-noise tokens before span s
    jump = np.diff(at, axis=1) - 1  # [2B, S]
    span = np.arange(S, dtype=np.int64)

    # Both outputs are built in one [B, w_in + w_tg] row: slot p copies raw token p + offset(p), the offset
    # piecewise constant, changing only at sentinel slots, so one cumsum over a delta row gives every source
    # index and one flat gather fills everything (no per-row boolean compaction).
    # inputs  keep_0 <x0> keep_1 <x1> ... <x_{S-1}> EOS: sentinel s at keep_at[s+1] + s; the offset grows by
    #         noise_len[s] - 1 there.
    # targets <x0> noise_0 <x1> noise_1 ... EOS: sentinel s at noise_at[s] + s; the offset restarts at 0 and
    #         grows by keep_len[s] - 1 there.
    # The last slot of each lands on an EOS column appended to the tokens.
    marks = np.empty((B, 2 * S), dtype=np.int64)
    np.add(keep_at[:, 1:], span, out=marks[:, :S])
    np.add(noise_at[:, :-1], span + w_in, out=marks[:, S:])
    work = {} if work is None else work
    ext = _scratch(work, "ext", (B, n + 1))
    ext[:, :n] = tokens
    ext[:, n] = eos_id
    width = w_in + w_tg
    rows = np.arange(B, dtype=np.int64)
    # One flat cumsum over all rows: each row ends on its EOS column b*(n+1) + n, so a step of 1 reaches the
    # next row's first token.
    delta = _scratch(work, "delta", (B, width))
    delta.fill(1)
    delta[0, 0] = 0
    delta[:, w_in] = -n  # back from the inputs' EOS column to raw token 0
    flat_marks = (marks + (rows * width)[:, None]).ravel()
    jumps = np.concatenate([jump[:B], jump[B:]], axis=1)  # noise_len - 1 for inputs, keep_len - 1 for targets
    delta.ravel()[flat_marks] += jumps.ravel()
    src = np.cumsum(delta.ravel(), out=_scratch(work, "src", (B * width,)))
    out = ext.ravel().take(src, out=_scratch(work, "out", (B * width,))).reshape(B, width)
    out.ravel()[flat_marks] = np.tile(sentinels[:S], 2 * B)
    return np.ascontiguousarray(out[:, :w_in]), np.ascontiguousarray(out[:, w_in:])


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
        self._local = threading.local()
        _, spans = noise_counts(self.raw_length, self.density, self.mean_span)
        if spans > self.sentinels.shape[0]:
            raise ValueError(
                f"packing.seq_len {self.inputs_length} gives {spans} noise spans but the tokenizer has only "
                f"{self.sentinels.shape[0]} sentinels"
            )

    def _work(self) -> dict[str, np.ndarray]:
        """Per-thread scratch buffers (the collator may be shared by prefetch threads)."""
        work = getattr(self._local, "work", None)
        if work is None:
            work = self._local.work = {}
        return work

    def __getstate__(self) -> dict[str, Any]:  # picklable for DataLoader worker processes
        state = dict(self.__dict__)
        state.pop("_local", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, lengths = stack_ids(samples, self.pad_id)
        epoch, sample_id = sample_meta(samples)
        keys = sample_keys(self.seed, epoch, sample_id, STREAM_SPAN)
        B = ids.shape[0]
        if ids.shape[1] == self.raw_length and (ids[:, -1] != self.pad_id).all():
            # The common case: every sample is a full block, outputs have exactly the configured lengths.
            inputs, labels = span_corrupt(ids, keys, self.density, self.mean_span, self.sentinels, self.eos_id,
                                          self._work())  # fmt: skip
            return {
                "input_ids": torch.from_numpy(inputs),
                "attention_mask": torch.from_numpy(np.ones(inputs.shape, dtype=np.int64)),
                "labels": torch.from_numpy(labels),
            }
        # A block cut short at the end of the stream may arrive right-padded: corrupt only its real tokens.
        real = ids != self.pad_id
        lengths = np.minimum(lengths, ids.shape[1] - np.argmax(real[:, ::-1], axis=1))
        lengths = np.where(real.any(axis=1), lengths, 0)
        inputs = np.full((B, self.inputs_length), self.pad_id, dtype=np.int64)
        labels = np.full((B, self.targets_length), -100, dtype=np.int64)
        attention = np.zeros((B, self.inputs_length), dtype=np.int64)
        for n in np.unique(lengths):  # one group per distinct length (normally exactly one)
            rows = np.flatnonzero(lengths == n)
            inp, tgt = span_corrupt(
                ids[rows, :n], keys[rows], self.density, self.mean_span, self.sentinels, self.eos_id
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
