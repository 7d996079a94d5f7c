"""Packing token shards into fixed-length training samples, with a precomputed index (sample i is O(1)).

A source's shards are seen as one *stream*: documents back to back, optionally followed by a separator token.
Every mode is then a list of stream slices [start, end) plus framing:
- full_sentences (RoBERTa): `<s> slice </s>`, separator `</s>` after each document (so a document boundary
  inside a block reads `</s>`, as fairseq's FULL-SENTENCES). sentence_break="fill" cuts the stream every
  seq_len-2 tokens (only the sentence crossing a block edge is split; padding only in the very last block);
  "complete" ends blocks on sentence boundaries (the paper's wording) and pads, a sentence longer than a block
  being split over blocks, never dropped.
- contiguous (GPT): EOS after each document, blocks of exactly seq_len, `segment_ids` = document index inside
  the block (the EOS goes with its document). The tail shorter than a block is not used (no padding anywhere).
- t5_spans: blocks of raw_len tokens (T5's random_spans_helper) so corrupted inputs are exactly seq_len.
- line_by_line (baseline): one sample per document, wrapped like the objective wants, long documents split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from data_pipeline.objectives.t5_lengths import t5_lengths
from data_pipeline.token_shards import TokenShard


class TokenStream:
    """Several shards as one stream of documents, each followed by `sep` when given."""

    def __init__(self, shards: list[TokenShard], sep: int | None):
        self.shards = shards
        self.sep = sep
        lens, shard_of, start_in = [], [], []
        for k, sh in enumerate(shards):
            off = sh.doc_offsets
            lens.append(np.diff(off))
            shard_of.append(np.full(sh.num_docs, k, np.int32))
            start_in.append(off[:-1])
        self.doc_lens = np.concatenate(lens) if lens else np.zeros(0, np.int64)
        self.doc_shard = np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32)
        self.doc_start_in_shard = np.concatenate(start_in) if start_in else np.zeros(0, np.int64)
        step = self.doc_lens + (0 if sep is None else 1)
        self.doc_start = np.concatenate([[0], np.cumsum(step)]).astype(np.int64)
        self.total = int(self.doc_start[-1])
        self.num_tokens = int(self.doc_lens.sum())

    @property
    def num_docs(self) -> int:
        return len(self.doc_lens)

    def sentence_starts(self) -> np.ndarray:
        """Stream positions where a sentence (or a document) begins, plus the stream end."""
        out, base = [], 0
        for sh in self.shards:
            so = sh.sent_offsets[:-1]
            d = np.searchsorted(sh.doc_offsets, so, side="right") - 1
            out.append(so - sh.doc_offsets[d] + self.doc_start[base + d])
            base += sh.num_docs
        out.append(np.array([self.total], np.int64))
        return np.unique(np.concatenate(out))

    def read(self, a: int, b: int, with_segments: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Stream slice [a, b) as int64 tokens (and the document index of each token within the slice)."""
        d = int(np.searchsorted(self.doc_start, a, side="right")) - 1
        parts: list[np.ndarray] = []
        segs: list[np.ndarray] = []
        pos, seg = a, 0
        while pos < b:
            s0, n = int(self.doc_start[d]), int(self.doc_lens[d])
            lo, hi = pos - s0, min(b - s0, n)
            count = 0
            if lo < hi:
                sh = self.shards[self.doc_shard[d]]
                base = int(self.doc_start_in_shard[d])
                parts.append(sh.tokens[base + lo : base + hi].astype(np.int64))
                count += hi - lo
            if self.sep is not None and lo <= n < b - s0:  # the separator sits at stream position s0 + n
                parts.append(np.array([self.sep], np.int64))
                count += 1
            if with_segments and count:
                segs.append(np.full(count, seg, np.int64))
                seg += 1
            pos = int(self.doc_start[d + 1])
            d += 1
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return ids, (np.concatenate(segs) if with_segments and segs else None)


@dataclass
class Framing:
    bos: int | None
    eos: int | None
    pad: int

    @property
    def extra(self) -> int:
        return int(self.bos is not None) + int(self.eos is not None)


class PackedSource:
    """One source's packed samples: `len()`, `[i]` -> dict of numpy arrays, `stats()`."""

    def __init__(self, shards: list[TokenShard], special: dict[str, int | None], mode: str, seq_len: int,
                 objective: str, sentence_break: str = "fill", noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0):  # fmt: skip
        self.mode, self.seq_len = mode, seq_len
        pad = special["pad"] if special.get("pad") is not None else 0
        eos = special.get("eos")
        if mode == "full_sentences":
            self.framing = Framing(special["bos"], eos, pad)
            self.stream = TokenStream(shards, eos)
            cap = seq_len - self.framing.extra
            if sentence_break == "fill":
                n = -(-self.stream.total // cap)
                self.starts = np.arange(n, dtype=np.int64) * cap
                self.ends = np.minimum(self.starts + cap, self.stream.total)
            else:
                self.starts, self.ends = _complete_blocks(self.stream.sentence_starts(), self.stream.total, cap)
            self.block_len = seq_len
        elif mode in ("contiguous", "t5_spans"):
            self.framing = Framing(None, None, pad)
            self.stream = TokenStream(shards, eos if mode == "contiguous" else None)
            self.block_len = seq_len if mode == "contiguous" else t5_lengths(
                seq_len, noise_density, mean_noise_span_length)[0]  # fmt: skip
            n = self.stream.total // self.block_len
            self.starts = np.arange(n, dtype=np.int64) * self.block_len
            self.ends = self.starts + self.block_len
        elif mode == "line_by_line":
            self.framing = Framing(special["bos"], eos, pad) if objective == "mlm" else Framing(None, eos, pad)
            self.stream = TokenStream(shards, None)
            cap = seq_len - self.framing.extra
            pieces = -(-self.stream.doc_lens // cap)
            doc = np.repeat(np.arange(self.stream.num_docs), pieces)
            k = np.arange(len(doc)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
            self.starts = self.stream.doc_start[doc] + k * cap
            self.ends = np.minimum(self.starts + cap, self.stream.doc_start[doc] + self.stream.doc_lens[doc])
            self.block_len = seq_len
        else:
            raise ValueError(f"packing.mode: unknown mode '{mode}'")

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def tokens_per_sample(self) -> int:
        return self.block_len

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        a, b = int(self.starts[i]), int(self.ends[i])
        segments = self.mode == "contiguous"
        ids, seg = self.stream.read(a, b, with_segments=segments)
        f = self.framing
        if f.bos is not None or f.eos is not None:
            ids = np.concatenate([[f.bos] if f.bos is not None else [], ids, [f.eos] if f.eos is not None else []]
                                 ).astype(np.int64)  # fmt: skip
        if self.mode == "full_sentences" and len(ids) < self.seq_len:
            ids = np.concatenate([ids, np.full(self.seq_len - len(ids), f.pad, np.int64)])
        out = {"input_ids": ids}
        if segments:
            out["segment_ids"] = seg
        return out

    def stats(self) -> dict[str, Any]:
        """Padding and unused tokens, from the index alone (no token reads)."""
        n = len(self)
        real = int((self.ends - self.starts).sum()) + n * self.framing.extra
        if self.mode == "line_by_line":
            slots = real  # padded later, per batch; see the loader/bench for batch padding
        else:
            slots = n * self.block_len
        used_stream = int((self.ends - self.starts).sum())
        return {
            "mode": self.mode,
            "samples": n,
            "tokens_per_sample": self.block_len,
            "documents": self.stream.num_docs,
            "text_tokens": self.stream.num_tokens,
            "pad_tokens": slots - real,
            "padding_fraction": (slots - real) / slots if slots else 0.0,
            "unused_tail_tokens": self.stream.total - used_stream,
        }


def _complete_blocks(bounds: np.ndarray, total: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy: each block takes as many whole sentences as fit; an over-long sentence is cut at `cap`.

    One searchsorted per block (not per token or sentence); blocks are ~tokens/seq_len.
    """
    starts, ends = [], []
    a = 0
    while a < total:
        j = int(np.searchsorted(bounds, a + cap, side="right")) - 1
        e = int(bounds[j])
        if e <= a:  # the sentence at `a` does not fit a block: split it
            e = min(a + cap, total)
        starts.append(a)
        ends.append(e)
        a = e
    return np.asarray(starts, np.int64), np.asarray(ends, np.int64)


def build_packed_sources(cfg, manifest: dict, shards: dict[str, list[TokenShard]]) -> dict[str, PackedSource]:
    """Packed view of every configured source present in the token manifest, in config order."""
    out = {}
    for src in cfg.data.sources:
        if src.name not in shards:
            continue
        out[src.name] = PackedSource(
            shards[src.name], manifest["special_ids"], cfg.packing.mode, cfg.packing.seq_len, cfg.objective.type,
            cfg.packing.sentence_break, cfg.objective.noise_density, cfg.objective.mean_noise_span_length,
        )  # fmt: skip
    if not out:
        raise ValueError(f"none of data.sources {[s.name for s in cfg.data.sources]} has token shards")
    return out
