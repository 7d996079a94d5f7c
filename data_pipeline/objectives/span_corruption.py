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
from data_pipeline.objectives._rng import STREAM_SPAN, hash32, key32, sample_keys, weyl32
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
        raise ValueError(
            "span corruption needs a tokenizer with T5 sentinels '<extra_id_0>', '<extra_id_1>', ..."
        )
    return np.asarray(ids, dtype=np.int64)


class _Plan:
    """Everything `span_corrupt` needs that depends only on (batch, length, settings): built once per shape and
    kept in the caller's `work` dict. At the T5 presets' micro-batches (8-16 rows) the arithmetic is a few
    microseconds per array, so the fixed per-call cost (array set-up, index tables) is what the collator's time
    is made of; caching it cuts a call from ~110 to ~50 us at batch 8."""

    def __init__(
        self,
        B: int,
        n: int,
        noise_density: float,
        mean_noise_span_length: float,
        sentinels: np.ndarray,
        eos_id: int,
    ) -> None:
        num_noise, S = noise_counts(n, noise_density, mean_noise_span_length)
        if S > sentinels.shape[0]:
            raise ValueError(
                f"{S} noise spans per sequence but the tokenizer has only {sentinels.shape[0]} sentinels: "
                "shorten packing.seq_len or raise objective.mean_noise_span_length"
            )
        num_keep = n - num_noise
        self.S, self.g_noise = S, num_noise - 1
        self.w_in, self.w_tg = num_keep + S + 1, num_noise + S + 1
        # Segment starts [B, 2, S+1]: [:, 0] noise, [:, 1] non-noise; first column 0, last the item count.
        self.at = np.zeros((B, 2, S + 1), dtype=np.int64)
        self.at[:, 0, -1] = num_noise
        self.at[:, 1, -1] = num_keep
        g_noise, g_keep = num_noise - 1, num_keep - 1
        self.g_noise = g_noise
        idx_bits = max(int(max(g_noise, g_keep) - 1).bit_length(), 1)
        # Sort keys [B, g_noise + g_keep] (the row's random words: noise gaps first, then non-noise gaps) with the
        # gap index in the low bits, so keys are unique and carry their index and a plain partition (2-3x faster
        # than argpartition) selects the gaps; each segmentation partitions its own columns. 32-bit keys keep
        # >= 20 random bits up to 4096 gaps (a tie at the selection boundary, ~n/2^20, only prefers the lower
        # index).
        self.dtype = np.uint32 if idx_bits <= 12 else np.uint64
        self.low = self.dtype((1 << idx_bits) - 1)
        self.high = ~self.low
        self.weyl = weyl32(n - 2)[None, :]
        self.idx = np.concatenate([np.arange(g_noise), np.arange(g_keep)]).astype(self.dtype)[None, :]
        # Output layout, flat: all B input rows, then all B target rows (both come out contiguous). Slot p copies
        # ext[src[p]], src = cumsum(delta): +1 per slot, changed only at sentinel slots (see span_corrupt).
        rows, span = np.arange(B, dtype=np.int64)[:, None], np.arange(S, dtype=np.int64)
        self.off_in = rows * self.w_in + span  # flat slot of input sentinel s = keep_at[s+1] + off_in[s]
        self.off_tg = B * self.w_in + rows * self.w_tg + span  # target sentinel s = noise_at[s] + off_tg[s]
        self.delta = np.ones(B * (self.w_in + self.w_tg), dtype=np.int64)
        self.delta[0] = 0
        # from the last input row's EOS back to row 0's token 0: the first target slot's step minus this
        self.first_target, self.back = B * self.w_in, B * (n + 1)
        self.work_delta = np.empty_like(self.delta)
        self.src = np.empty_like(self.delta)
        self.marks = np.empty((B, 2 * S), dtype=np.int64)
        self.sent = np.tile(sentinels[:S], 2 * B)  # in `marks` order: inputs' S sentinels, then targets'
        self.ext = np.empty((B, n + 1), dtype=np.int64)  # tokens + an EOS column that the last slots copy
        self.ext[:, n] = eos_id

    def segment_starts(self, keys: np.ndarray) -> np.ndarray:
        """Cut each row's noise tokens and its non-noise tokens into S non-empty segments each, all cuttings
        equally likely, from the rows' random keys. Returns `at` [B, 2, S+1] (a buffer of this plan, valid
        until the next call).

        Same distribution as the reference's `_random_segmentation` (a shuffled boolean vector): the cut points
        are a uniform random (S-1)-subset of the gaps, here the gaps with the smallest random keys."""
        S = self.S
        if S == 1:
            return self.at
        key = hash32(key32(keys)[:, None] + self.weyl)
        if self.dtype is np.uint64:
            key = key.astype(np.uint64) << np.uint64(32)
        key &= self.high
        key |= self.idx
        g = self.g_noise
        for half, cols in ((0, key[:, :g]), (1, key[:, g:])):
            cut = np.partition(cols, S - 2, axis=-1)[:, : S - 1]
            cut &= self.low
            cut.sort(axis=-1)
            np.add(cut, 1, out=self.at[:, half, 1:-1], casting="unsafe")
        return self.at


def _plan(
    work: dict | None, B: int, n: int, density: float, mean_span: float, sentinels: np.ndarray, eos_id: int
) -> _Plan:
    if work is None:
        return _Plan(B, n, density, mean_span, sentinels, eos_id)
    key = (B, n, density, mean_span, eos_id, id(sentinels))
    plan = work.get(key)
    if plan is None or plan.sentinels_ref is not sentinels:
        plan = work[key] = _Plan(B, n, density, mean_span, sentinels, eos_id)
        plan.sentinels_ref = sentinels  # the id in the key is only unique while this reference keeps it alive
    return plan


def span_corrupt(
    tokens: np.ndarray,
    keys: np.ndarray,
    noise_density: float,
    mean_noise_span_length: float,
    sentinels: np.ndarray,
    eos_id: int,
    work: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt a [batch, n] block of equal-length rows (one random key per row); returns (inputs
    [B, n-noise+spans+1], targets [B, noise+spans+1]), both ending with EOS.

    `work` (optional, one per thread) keeps the per-shape plan (index tables, scratch buffers) between calls."""
    B, n = tokens.shape
    if n < 2:  # the reference pads the length to 2 and truncates: no noise, targets = <extra_id_0>
        inputs = np.concatenate([tokens, np.full((B, 1), eos_id)], axis=1)
        return inputs, np.tile(np.asarray([sentinels[0], eos_id], dtype=np.int64), (B, 1))
    p = _plan(work, B, n, noise_density, mean_noise_span_length, sentinels, eos_id)
    S = p.S
    # Reference layout: keep_0 noise_0 keep_1 noise_1 ... keep_{S-1} noise_{S-1}.
    at = p.segment_starts(keys)  # [B, 2, S+1]: noise / non-noise tokens before span s
    # Every output slot copies raw token p + offset(p), the offset piecewise constant, changing only at sentinel
    # slots, so one cumsum over a delta vector gives every source index and one gather fills everything (no
    # per-row boolean compaction).
    # inputs  keep_0 <x0> keep_1 <x1> ... <x_{S-1}> EOS: sentinel s at keep_at[s+1] + s; the offset grows by
    #         noise_len[s] - 1 there.
    # targets <x0> noise_0 <x1> noise_1 ... EOS: sentinel s at noise_at[s] + s; the offset restarts at the row's
    #         token 0 and grows by keep_len[s] - 1 there.
    # Each row ends on its EOS column b*(n+1) + n, so a step of 1 reaches the next row's token 0.
    lens = at[:, :, 1:] - at[:, :, :-1]  # [B, 2, S] = [noise_len | keep_len] per row, as `marks` below
    marks = p.marks
    np.add(at[:, 1, 1:], p.off_in, out=marks[:, :S])
    np.add(at[:, 0, :-1], p.off_tg, out=marks[:, S:])
    flat = marks.ravel()
    delta = p.work_delta
    np.copyto(delta, p.delta)
    # A sentinel slot's step is 1 + (span length - 1); marks never hit slot 0 (keep_at[1] >= 1) and always hit the
    # first target slot (noise_at[0] = 0), whose step also jumps back from the last input row's EOS.
    delta[flat] = lens.ravel()
    delta[p.first_target] -= p.back
    p.ext[:, :n] = tokens
    out = p.ext.ravel().take(np.cumsum(delta, out=p.src))
    out[flat] = p.sent
    cut = B * p.w_in
    return out[:cut].reshape(B, p.w_in), out[cut:].reshape(B, p.w_tg)


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
            inputs, labels = span_corrupt(
                ids, keys, self.density, self.mean_span, self.sentinels, self.eos_id, self._work()
            )
            return {
                "input_ids": torch.from_numpy(inputs),
                # cheaper than torch.ones
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
