"""RoBERTa dynamic masking (Liu et al. 2019), optionally over whole words.

Selection follows fairseq's MaskTokensDataset (RoBERTa's reference code): each sequence gets
floor(p * n + u) selected tokens (u ~ U[0,1), n = its maskable tokens), so the expected fraction is exactly p
and every sequence is masked, rather than HF's independent Bernoulli draw per token. A selected token is
replaced by `<mask>` 80% of the time, by a random non-special token of the real vocabulary 10%, and kept 10%;
the loss is computed on selected tokens only (labels -100 elsewhere).

Dynamic: the random numbers are a hash of (seed, epoch, sample_id, position) (see `_rng`), so the same
sequence served in a new epoch gets a fresh mask, while a resumed or re-sharded run sees identical batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from data_pipeline.objectives._batch import sample_meta, stack_ids
from data_pipeline.objectives._rng import STREAM_MLM, mix64, row_uniform, sample_keys, stream_bits

# Byte-level BPE writes whitespace bytes as these characters (GPT-2's bytes_to_unicode: space, newline, tab,
# carriage return); SentencePiece-style vocabularies use U+2581.
_WORD_START_MARKS = ("\u0120", "\u010a", "\u0109", "\u010d", "\u2581", " ", "\n", "\t")
_POS_BITS = 20  # positions are packed into the low bits of sort keys (sequences up to ~1M tokens)
_DEC_BITS = 24
_U64 = np.uint64
_RANDOM_TOKEN_SALT = _U64(0xD1B54A32D192ED03)


def special_token_ids(tokenizer: Any) -> list[int]:
    """Every id that must never be selected for masking nor drawn as a random replacement."""
    ids = set(int(i) for i in tokenizer.all_special_ids)
    for name in (
        "pad_token_id",
        "cls_token_id",
        "sep_token_id",
        "bos_token_id",
        "eos_token_id",
        "unk_token_id",
        "mask_token_id",
    ):
        v = getattr(tokenizer, name, None)
        if v is not None:
            ids.add(int(v))
    # Tokens added with special=True (e.g. sentinels) are special even if the tokenizer does not list them.
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(int(i) for i, tok in decoder.items() if getattr(tok, "special", False))
    return sorted(ids)


def word_start_table(tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-vocabulary lookup tables (starts_word, whitespace_only) for whole-word masking.

    WordPiece marks continuations (`##`); byte-level BPE / SentencePiece mark word starts (`Ġ`, `▁`).
    Built once per tokenizer by scanning the vocabulary, so masking itself is a table gather.
    """
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values()) + 1)
    starts = np.zeros(size, dtype=bool)
    ws_only = np.zeros(size, dtype=bool)
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    if type(model).__name__ == "WordPiece":
        prefix = getattr(model, "continuing_subword_prefix", None) or "##"
        for tok, i in vocab.items():
            starts[i] = not tok.startswith(prefix)
        return starts, ws_only
    found = False
    for tok, i in vocab.items():
        if tok.startswith(_WORD_START_MARKS):
            starts[i] = found = True
            ws_only[i] = all(c in _WORD_START_MARKS for c in tok)
    if not found:
        raise ValueError(
            "objective.whole_word_masking: this vocabulary has neither WordPiece '##' continuations nor "
            "byte-level 'Ġ' / SentencePiece '▁' word starts, so word boundaries cannot be recovered"
        )
    return starts, ws_only


class MLMCollator:
    """Collate packed samples into RobertaForMaskedLM inputs: input_ids, attention_mask, labels."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        seed: int,
        mlm_probability: float = 0.15,
        mask_token_fraction: float = 0.8,
        random_token_fraction: float = 0.1,
        whole_word_masking: bool = False,
        static_masking: bool = False,
    ) -> None:
        if tokenizer.mask_token_id is None:
            raise ValueError("masked LM needs a tokenizer with a mask token (e.g. '<mask>' or '[MASK]')")
        if tokenizer.pad_token_id is None:
            raise ValueError("masked LM needs a tokenizer with a pad token")
        if mask_token_fraction + random_token_fraction > 1:
            raise ValueError("mask_token_fraction + random_token_fraction must not exceed 1")
        self.seed = int(seed)
        self.p = float(mlm_probability)
        self.mask_frac = float(mask_token_fraction)
        self.random_frac = float(random_token_fraction)
        self.whole_word = whole_word_masking
        self.static = static_masking
        self.mask_id = int(tokenizer.mask_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        specials = special_token_ids(tokenizer)
        self.vocab_len = len(tokenizer)
        size = max(self.vocab_len, specials[-1] + 1)
        self.special_lut = np.zeros(size, dtype=bool)
        self.special_lut[specials] = True
        # Random replacements come from the real vocabulary (not the model's padded embedding rows), never specials.
        self.random_pool = np.flatnonzero(~self.special_lut[: self.vocab_len]).astype(np.int64)
        if self.random_pool.size == 0:
            raise ValueError("the tokenizer has no non-special tokens to draw random replacements from")
        if whole_word_masking:
            starts, ws_only = word_start_table(tokenizer)
            pad_to = max(size, starts.shape[0])
            self.start_lut = np.zeros(pad_to, dtype=bool)
            self.start_lut[: starts.shape[0]] = starts
            self.ws_lut = np.zeros(pad_to, dtype=bool)
            self.ws_lut[: ws_only.shape[0]] = ws_only
            self.special_lut = np.pad(self.special_lut, (0, pad_to - size))

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids, _ = stack_ids(samples, self.pad_id)
        epoch, sample_id = sample_meta(samples)
        inputs, labels = self.mask(ids, epoch, sample_id)
        return {
            "input_ids": torch.from_numpy(inputs),
            "attention_mask": torch.from_numpy((ids != self.pad_id).astype(np.int64)),
            "labels": torch.from_numpy(labels),
        }

    def mask(
        self, ids: np.ndarray, epoch: np.ndarray, sample_id: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(masked input ids, labels) for a [batch, length] int64 array; the input array is not modified."""
        B, L = ids.shape
        if L >= 1 << _POS_BITS:
            raise ValueError(f"sequence length {L} exceeds the {1 << _POS_BITS} positions masking supports")
        if ids.size and (ids.min() < 0 or ids.max() >= self.special_lut.shape[0]):
            raise ValueError(
                f"token id outside the tokenizer's vocabulary [0, {self.special_lut.shape[0]}) in the batch"
            )
        if self.static:
            epoch = np.zeros_like(epoch)
        keys = sample_keys(self.seed, epoch, sample_id, STREAM_MLM)
        bits = stream_bits(keys, L)
        row_u = row_uniform(keys)
        special = self.special_lut[ids]
        eligible = ~special
        pos = np.arange(L, dtype=_U64)
        if self.whole_word:
            selected, decision_pos = self._select_words(ids, special, eligible, bits, row_u, pos)
        else:
            selected = self._select_tokens(eligible, bits, row_u, pos)
            decision_pos = None

        dec = (bits & _U64((1 << _DEC_BITS) - 1)).astype(np.float64) * (1.0 / (1 << _DEC_BITS))
        if decision_pos is not None:  # whole words share one 80/10/10 decision (as fairseq does)
            dec = np.take_along_axis(dec, decision_pos, axis=1)
        to_mask = selected & (dec < self.mask_frac)
        to_random = selected & (dec >= self.mask_frac) & (dec < self.mask_frac + self.random_frac)

        inputs = ids.copy()
        inputs[to_mask] = self.mask_id
        if to_random.any():
            # a fresh word per position: a bijective re-hash of the position's own random word
            rb = mix64(bits[to_random] ^ _RANDOM_TOKEN_SALT)
            pick = ((rb >> _U64(32)) * _U64(self.random_pool.size)) >> _U64(32)
            inputs[to_random] = self.random_pool[pick.astype(np.int64)]
        labels = np.where(selected, ids, -100)
        return inputs, labels

    def _select_tokens(
        self, eligible: np.ndarray, bits: np.ndarray, row_u: np.ndarray, pos: np.ndarray
    ) -> np.ndarray:
        """Exactly floor(p*n + u) eligible tokens per row: the ones with the smallest random keys."""
        B = eligible.shape[0]
        n = eligible.sum(axis=1)
        k = np.minimum(np.floor(self.p * n + row_u).astype(np.int64), n)
        # Unique per-row keys: 40 random bits above the position, ineligible tokens sorted last.
        key = ((bits >> _U64(24)) << _U64(_POS_BITS)) | pos[None, :]
        key = np.where(eligible, key, _U64(np.iinfo(np.uint64).max))
        kth = np.sort(key, axis=1)[np.arange(B), np.maximum(k - 1, 0)]
        return eligible & (key <= kth[:, None]) & (k > 0)[:, None]

    def _select_words(
        self,
        ids: np.ndarray,
        special: np.ndarray,
        eligible: np.ndarray,
        bits: np.ndarray,
        row_u: np.ndarray,
        pos: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Whole words in random order until p*n tokens are covered (the word crossing the budget is kept with
        the probability that makes the expected count exactly p*n). Returns (selected, word start per token)."""
        B, L = ids.shape
        prev_special = np.ones_like(special)
        prev_special[:, 1:] = special[:, :-1] | self.ws_lut[ids[:, :-1]]
        is_start = self.start_lut[ids] | special | prev_special
        idx = np.arange(L, dtype=np.int64)
        start_pos = np.maximum.accumulate(np.where(is_start, idx[None, :], 0), axis=1)
        word_idx = np.cumsum(is_start, axis=1) - 1
        flat = word_idx + (np.arange(B, dtype=np.int64) * L)[:, None]
        word_len = np.bincount(flat.ravel(), minlength=B * L)[flat]

        # Tokens of one word share the word's random bits, so sorting groups each word contiguously.
        wbits = np.take_along_axis(bits >> _U64(24), start_pos, axis=1)
        key = (wbits << _U64(_POS_BITS)) | pos[None, :]
        key = np.where(eligible, key, _U64(np.iinfo(np.uint64).max))
        order = np.argsort(key, axis=1)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(idx, (B, L)), axis=1)
        before = np.take_along_axis(rank, start_pos, axis=1)  # eligible tokens of earlier-ranked words
        budget = (self.p * eligible.sum(axis=1))[:, None]
        full = before + word_len <= budget
        crossing = (before < budget) & ~full & (row_u[:, None] * word_len < budget - before)
        return eligible & (full | crossing), start_pos
