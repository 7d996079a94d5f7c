"""Cleaned shards -> binary token shards (+ sentence index) and a manifest; one process per shard.

Each document is encoded once, whole (so tokens are exactly what the tokenizer gives the document), and the
sentence splitter's character spans are mapped onto token boundaries through the encoder's offsets. Splitting
sentences separately and encoding them one by one would change tokens at the seams (byte-level BPE folds the
leading space into the next word) and cost one encode call per sentence.

Restartable: a shard whose completion record matches its input (size, mtime, tokenizer hash) is skipped; a
killed worker leaves only temporary files. `shard_index` processes one shard (a Slurm array task).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from core.io import sha256_file
from data_pipeline.interrupt import process_pool
from data_pipeline.shards import remove_stale_temps
from data_pipeline.token_shards import (
    MANIFEST,
    TokenShardError,
    TokenShardWriter,
    check_shard,
    smallest_dtype,
    write_json_atomic,
)
from data_pipeline.tokenizers.corpus import corpus_shards, read_shard, verify_corpus
from data_pipeline.tokenizers.fast_bpe import TiktokenBPE
from runconfig import RunConfig

logger = logging.getLogger(__name__)

_LINE = re.compile(r"[^\n]+")
# Documents per encode_batch call inside a shard worker: bounds its memory and keeps the Rust encoder busy. An
# internal default since issue 65 (it was `shards.encode_batch_docs`, a tuning knob no user needed).
ENCODE_BATCH_DOCS = 256
_ENGINES: dict[
    str, tuple[Any, TiktokenBPE | None]
] = {}  # tokenizer.json sha256 -> (Tokenizer, checked engine)


def special_ids(tok) -> dict[str, int | None]:
    """bos/eos/sep/pad/unk/mask ids of a `tokenizers.Tokenizer` saved by our trainer (any family)."""
    v = tok.get_vocab()

    def first(*names: str) -> int | None:
        return next((v[n] for n in names if n in v), None)

    return {
        "bos": first("<s>", "[CLS]", "<|endoftext|>"),
        "eos": first("</s>", "[SEP]", "<|endoftext|>"),
        "sep": first("</s>", "[SEP]"),
        "pad": first("<pad>", "[PAD]", "<|endoftext|>"),  # GPT-2: pad = EOS
        "unk": first("<unk>", "[UNK]"),
        "mask": first("<mask>", "[MASK]"),
    }


class SentenceSplitter:
    """Character start offsets of sentences 2.. in a text. Newlines always end a sentence (titles, paragraphs)."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "pysbd":
            import pysbd

            self._seg = pysbd.Segmenter(language="en", clean=False)
        elif kind == "blingfire":
            from blingfire import blingfire as bf_lib  # the loaded C library (ctypes)

            self._bf = bf_lib.TextToSentencesWithOffsets
            self._cap = 0

    def starts(self, text: str) -> np.ndarray:
        if self.kind == "none":
            return np.zeros(0, np.int64)
        lines = [m.start() for m in _LINE.finditer(text)]
        if self.kind == "blingfire":
            inner = self._blingfire_starts(text)
        else:
            inner = []
            for m in _LINE.finditer(text):
                pos = m.start()
                for seg in self._seg.segment(m.group())[:-1]:
                    pos += len(seg)
                    inner.append(pos)
        # sorted union (np.union1d's hash-based unique cost more than the splitter on short documents)
        out = np.concatenate([np.asarray(lines, np.int64), np.asarray(inner, np.int64)])
        out.sort()
        keep = out > 0
        keep[1:] &= out[1:] != out[:-1]
        return out[keep]

    def _blingfire_starts(self, text: str) -> np.ndarray:
        # blingfire's own Python wrapper maps byte offsets to characters with a per-byte Python loop that costs
        # more than tokenizing; we call the C function directly and map with numpy.
        b = text.encode("utf-8")
        n = len(b)
        size = 2 * n + 1
        if size > self._cap:  # buffers reused across documents (allocation was a third of the cost)
            self._cap = max(size, 2 * self._cap)
            self._out = ctypes.create_string_buffer(self._cap)
            self._starts = (ctypes.c_int32 * self._cap)()
            self._ends = (ctypes.c_int32 * self._cap)()
        k = self._bf(
            ctypes.c_char_p(b),
            ctypes.c_int(n),
            ctypes.byref(self._out),
            ctypes.byref(self._starts),
            ctypes.byref(self._ends),
            ctypes.c_int(size),
        )
        if k <= 0 or k > size:
            return np.zeros(0, np.int64)
        num = ctypes.string_at(self._out, k).count(b"\n") + 1
        byte_starts = np.frombuffer(self._starts, np.int32, num).astype(np.int64)
        byte_starts = byte_starts[(byte_starts > 0) & (byte_starts < n)]
        if len(b) == len(text):  # ASCII: bytes are characters
            return byte_starts
        lead = (np.frombuffer(b, np.uint8) & 0xC0) != 0x80
        return (np.cumsum(lead) - 1)[byte_starts]


def _fingerprint(in_path: Path, tokenizer_sha: str, splitter: str, root: Path) -> dict[str, Any]:
    """The input by its path inside the run folder (the same on every node staging a remote run; a downloaded
    file carries the remote object's mtime), size and mtime; the tokenizer; the sentence splitter."""
    st = in_path.stat()
    rel = in_path.relative_to(root).as_posix() if in_path.is_relative_to(root) else str(in_path)
    return {
        "input": rel,
        "input_size": st.st_size,
        "input_mtime_ns": st.st_mtime_ns,
        "tokenizer_sha256": tokenizer_sha,
        "sentence_splitter": splitter,
    }


def _is_done(stem: Path, fp: dict[str, Any]) -> dict | None:
    rec = stem.with_suffix(".json")
    if not rec.is_file():
        return None
    try:
        meta = json.loads(rec.read_text())
    except ValueError:
        return None
    ok = all(meta.get(k) == v for k, v in fp.items())
    ok = ok and stem.with_suffix(".bin").is_file() and stem.with_suffix(".idx.npz").is_file()
    if ok:  # a done shard damaged since (bytes changed, cut, copied over) is written again
        try:
            check_shard(str(stem.with_suffix(".bin")), str(stem.with_suffix(".idx.npz")), meta, None, True)
        except TokenShardError as e:
            logger.warning("rewriting %s: %s", stem.name, str(e).split("; rerun")[0])
            return None
    return meta if ok else None


def _encode_shard(task: dict[str, Any]) -> dict[str, Any]:
    """Worker: one cleaned shard -> one token shard. Runs in a child process (or inline for one shard)."""
    if not task["parallel_encode"]:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per shard worker
    from tokenizers import Tokenizer

    # the tokenizer and the tiktoken engine `_tasks` loaded and checked, inherited through fork when there is one
    tok, fast = _ENGINES.get(task["tokenizer_sha"], (None, None))
    tok = tok or Tokenizer.from_file(task["tokenizer_json"])
    if task["engine"] != "tiktoken":
        fast = None
    elif fast is None:
        fast = TiktokenBPE.load(task["tokenizer_json"], check=False)
    engine = task["engine"]
    splitter = SentenceSplitter(task["splitter"])
    want_sents = task["splitter"] != "none"
    stem = Path(task["stem"])
    writer = TokenShardWriter(stem, np.dtype(task["dtype"]), vocab_size=task.get("vocab_size"))
    t0 = time.perf_counter()
    skipped = {"empty_text": 0, "no_tokens": 0, "bad_row": 0}
    try:
        batch: list[tuple[str, str]] = []

        def hf_encode(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
            if want_sents:
                encs = tok.encode_batch(texts, add_special_tokens=False)
                return [
                    (
                        np.asarray(e.ids, np.int64),
                        np.fromiter((b for _, b in e.offsets), np.int64, len(e.ids)),
                    )
                    for e in encs
                ]
            return [
                (np.asarray(e.ids, np.int64), None)
                for e in tok.encode_batch_fast(texts, add_special_tokens=False)
            ]

        def fast_encode(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
            out: list = [None] * len(texts)
            slow = [i for i, t in enumerate(texts) if fast.needs_fallback(t)]
            slow_set = set(slow)
            quick = [i for i in range(len(texts)) if i not in slow_set]
            for i, ids in zip(quick, fast.encode_batch([texts[i] for i in quick]), strict=True):
                arr = np.asarray(ids, np.int64)
                out[i] = (arr, fast.char_ends(arr) if want_sents else None)
            for i, r in zip(slow, hf_encode([texts[i] for i in slow]), strict=True):
                out[i] = r
            return out

        def flush() -> None:
            nonlocal engine, fast
            texts = [t for _, t in batch]
            if fast is not None and writer.docs == 0:
                # first batch of the shard: the two engines must agree, or this shard uses `tokenizers` alone
                probe = texts[:16]
                ref = hf_encode(probe)
                if any(not np.array_equal(a[0], b[0]) for a, b in zip(fast_encode(probe), ref, strict=True)):
                    fast, engine = None, "tokenizers (tiktoken disagreed on this shard)"
            encoded = fast_encode(texts) if fast is not None else hf_encode(texts)
            for (doc_id, text), (ids, ends) in zip(batch, encoded, strict=True):
                if ids.size == 0:
                    skipped["no_tokens"] += 1
                    continue
                sent = None
                if ends is not None:
                    char_starts = splitter.starts(text)
                    if char_starts.size:
                        # a token belongs to the sentence where it ends: leading spaces go with the next word
                        sent = np.searchsorted(ends, char_starts, side="right")
                writer.add(doc_id, ids, sent)
            batch.clear()

        for row in read_shard(task["in_path"]):
            text = row.get("text") if isinstance(row, dict) else None
            if not isinstance(text, str):
                skipped["bad_row"] += 1
                continue
            if not text.strip():
                skipped["empty_text"] += 1
                continue
            batch.append((str(row.get("id", "")), text))
            if len(batch) >= task["batch_docs"]:
                flush()
        if batch:
            flush()
    except Exception as e:
        writer.abort()
        raise RuntimeError(f"tokenizing {task['in_path']} failed: {type(e).__name__}: {e}") from e
    except BaseException:
        writer.abort()
        raise
    meta = writer.close(
        {
            **task["fingerprint"],
            "skipped": skipped,
            "engine": engine,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    # a remote run: the shard's files, then its record (the marker)
    task["store"].push([stem.with_suffix(".bin"), stem.with_suffix(".idx.npz"), stem.with_suffix(".json")])
    return {"source": task["source"], "stem": str(stem), "meta": meta, "reused": False}


def _tasks(cfg: RunConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from tokenizers import Tokenizer

    from core.run_layout import RunLayout
    from data_pipeline.shards import pull_corpus

    layout = RunLayout(cfg)
    layout.store.pull([layout.tokenizer])  # a remote run: the tokenizer and corpus, wherever they were made
    pull_corpus(cfg)
    tok_json = layout.tokenizer / "tokenizer.json"
    if not tok_json.is_file():
        raise FileNotFoundError(f"{tok_json} not found: run `python -m data_pipeline train-tokenizer` first")
    tok = Tokenizer.from_file(str(tok_json))
    tok_sha = sha256_file(tok_json)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = smallest_dtype(vocab)
    splitter = cfg.shards.sentence_splitter
    if splitter == "auto":
        splitter = "blingfire" if cfg.packing.mode == "full_sentences" else "none"
    fast = TiktokenBPE.load(tok_json)
    engine = "tiktoken" if fast is not None else "tokenizers"
    # forked shard workers reuse both (loading costs ~0.3 s per worker and shard)
    _ENGINES[tok_sha] = (tok, fast)
    info = {
        "tokenizer": {
            "path": str(layout.tokenizer),
            "sha256": tok_sha,
            "vocab_size": vocab,
            "type": cfg.tokenizer.type,
        },
        "special_ids": special_ids(tok),
        "dtype": dtype.name,
        "sentence_splitter": splitter,
        "engine": engine,
    }
    tasks = []
    for source, paths in sorted(corpus_shards(cfg).items()):
        for p in paths:
            name = Path(p).name
            stem_name = name.split(".")[0]
            tasks.append(
                {
                    "source": source,
                    "in_path": str(p),
                    "stem": str(layout.tokens / source / stem_name),
                    "tokenizer_json": str(tok_json),
                    "tokenizer_sha": tok_sha,
                    "splitter": splitter,
                    "dtype": dtype.name,
                    "engine": engine,
                    "vocab_size": vocab,
                    "batch_docs": ENCODE_BATCH_DOCS,
                    "store": layout.store,
                    "fingerprint": _fingerprint(Path(p), tok_sha, splitter, layout.root),
                }
            )
    return tasks, info


def write_manifest(cfg: RunConfig, tasks: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """Manifest over the shards that are complete now (all of them after a full run)."""
    from core.run_layout import RunLayout

    sources: dict[str, Any] = {}
    missing = 0
    for t in tasks:
        meta = _is_done(Path(t["stem"]), t["fingerprint"])
        if meta is None:
            missing += 1
            continue
        s = sources.setdefault(t["source"], {"shards": [], "docs": 0, "tokens": 0, "sentences": 0})
        s["shards"].append(meta)
        for k in ("docs", "tokens", "sentences"):
            s[k] += meta[k]
    manifest = {
        "version": 1,
        **info,
        "sources": sources,
        "complete": missing == 0,
        "missing_shards": missing,
        "totals": {k: sum(s[k] for s in sources.values()) for k in ("docs", "tokens", "sentences")},
    }
    write_json_atomic(RunLayout(cfg).tokens / MANIFEST, manifest)
    return manifest


def run_tokenize(cfg: RunConfig, shard_index: int | None = None) -> dict[str, Any]:
    """Tokenize every cleaned shard (or one, by index) into token shards; returns a summary."""
    from core.run_layout import RunLayout

    t0 = time.perf_counter()
    tasks, info = _tasks(cfg)
    store = RunLayout(cfg).store
    if shard_index is not None:
        if not 0 <= shard_index < len(tasks):
            raise IndexError(f"--shard-index {shard_index} out of range: {len(tasks)} cleaned shards")
        todo_all = [tasks[shard_index]]
        stem = Path(todo_all[0]["stem"])  # a remote run: done only when its record exists remotely
        store.confirm(stem.with_suffix(".json"), [stem.with_suffix(".bin"), stem.with_suffix(".idx.npz")])
    else:
        todo_all = tasks
        store.pull([RunLayout(cfg).tokens], prune_markers=True)
        remove_stale_temps(RunLayout(cfg).tokens)  # a whole-stage run owns tokens/
    # the cleaned (or deduplicated) shards against their stage's markers, before any work
    verify_corpus(cfg, "tokenize", [Path(t["in_path"]) for t in todo_all])
    results, todo = [], []
    for t in todo_all:
        meta = _is_done(Path(t["stem"]), t["fingerprint"])
        if meta is not None:
            results.append({"source": t["source"], "stem": t["stem"], "meta": meta, "reused": True})
        else:
            todo.append(t)
    workers = min(cfg.shards.workers, len(todo))
    for t in todo:
        t["parallel_encode"] = workers <= 1
    if workers <= 1:
        results += [_encode_shard(t) for t in todo]
    else:
        # fork: workers start in milliseconds and callers need no __main__ guard; children only use their own
        # freshly loaded tokenizer (tokenizers itself turns its thread pool off in a forked child)
        with process_pool(workers, get_context("fork")) as ex:
            results += list(ex.map(_encode_shard, todo))
    manifest = write_manifest(cfg, tasks, info)
    packing = {}
    if manifest["complete"] and manifest["sources"]:
        # build (and cache) the sentence-aligned packing index now, once, rather than on every rank at start-up
        from data_pipeline.packing import build_packed_sources
        from data_pipeline.token_shards import open_token_shards

        _, shards = open_token_shards(str(RunLayout(cfg).tokens))
        built = build_packed_sources(cfg, manifest, shards, cache_dir=RunLayout(cfg).tokens / "pack-index")
        packing = {name: p.stats() for name, p in built.items()}
    if shard_index is None:  # the packing index, then the manifest last (what training trusts)
        store.push([RunLayout(cfg).tokens / "pack-index", RunLayout(cfg).tokens / MANIFEST])
    secs = time.perf_counter() - t0
    new_tokens = sum(r["meta"]["tokens"] for r in results if not r["reused"])
    return {
        "manifest": str(RunLayout(cfg).tokens / MANIFEST),
        "shards_written": sum(not r["reused"] for r in results),
        "shards_reused": sum(r["reused"] for r in results),
        "complete": manifest["complete"],
        "totals": manifest["totals"],
        "dtype": info["dtype"],
        "packing": packing,
        "seconds": round(secs, 3),
        "tokens_per_s": round(new_tokens / secs, 1) if secs > 0 else None,
    }
