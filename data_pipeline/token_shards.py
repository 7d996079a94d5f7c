"""Binary token shards: one flat token array (memory-mapped) + an index of document and sentence boundaries.

Layout per cleaned shard `tokens/<source>/shard-XXXXX`:
- `.bin`: the tokens of every document back to back, no separators (packing adds them), dtype uint16 when the
  vocabulary fits (half the bytes of int32; Megatron's indexed dataset makes the same choice), else uint32.
- `.idx.npz`: `doc_offsets` int64[n_docs+1] and `sent_offsets` int64[n_sents+1] (token positions; sentences tile
  the documents, so every document boundary is also a sentence boundary) and `doc_ids` (the cleaned-row ids).
- `.json`: counts, dtype, checksums and the input it came from, written last: its presence marks the shard done.
Writes go to a temporary name, are fsynced and renamed, so a killed worker never leaves a shard that looks done.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from core.io import atomic_write, replace, sha256_file  # noqa: F401  (sha256_file: re-exported)
from core.layout import TOKEN_MANIFEST

MANIFEST = TOKEN_MANIFEST
RERUN = "rerun `python -m data_pipeline tokenize` (the tokenize stage rewrites a shard that fails this check)"


class TokenShardError(ValueError):
    """A token shard that does not match its manifest record (size, sha256) or holds an id outside the
    vocabulary: one line naming the file, the cause and the stage to rerun."""


def smallest_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    atomic_write(path, data)


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True).encode())


class TokenShardWriter:
    """Streams documents into `<stem>.bin` and, on close, writes the index and the completion record."""

    def __init__(self, stem: Path, dtype: np.dtype, vocab_size: int | None = None):
        self.stem = Path(stem)
        self.dtype = np.dtype(dtype)
        self.vocab_size = vocab_size
        self.stem.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.stem.parent.glob(f".{self.stem.name}.bin.tmp*"):  # left by a killed earlier attempt
            stale.unlink(missing_ok=True)
        self._tmp_bin = self.stem.with_name(f".{self.stem.name}.bin.tmp{os.getpid()}")
        self._fh = open(self._tmp_bin, "wb")
        self._sha = hashlib.sha256()
        self._doc_offsets = [0]
        self._sent_offsets: list[np.ndarray] = [np.zeros(1, np.int64)]
        self._ids: list[str] = []
        self._n = 0
        self._max_id = np.iinfo(self.dtype).max

    def add(self, doc_id: str, ids: np.ndarray, sent_starts: np.ndarray | None = None) -> None:
        """ids: the document's tokens; sent_starts: token positions (within the doc) where sentences 2.. begin."""
        ids = np.asarray(ids)
        if ids.size == 0:
            return
        if int(ids.max()) > self._max_id:
            raise ValueError(f"token id {int(ids.max())} does not fit {self.dtype} (shard {self.stem})")
        if self.vocab_size is not None and (int(ids.max()) >= self.vocab_size or int(ids.min()) < 0):
            at = int(np.argmax((ids >= self.vocab_size) | (ids < 0)))
            raise TokenShardError(
                f"{self.stem}.bin: token id {int(ids[at])} of document {doc_id!r} at offset {self._n + at} is "
                f"outside the tokenizer's vocabulary of {self.vocab_size}; the tokenizer and its vocabulary "
                "disagree (rerun `python -m data_pipeline train-tokenizer`, then tokenize)"
            )
        data = ids.astype(self.dtype, copy=False).tobytes()
        self._fh.write(data)
        self._sha.update(data)
        start = self._n
        self._n += ids.size
        if sent_starts is not None and len(sent_starts):
            # sorted + deduplicated (np.unique's hashing is slower)
            s = np.sort(np.asarray(sent_starts, np.int64))
            keep = (s > 0) & (s < ids.size)
            keep[1:] &= s[1:] != s[:-1]
            s = s[keep]
            self._sent_offsets.append(s + start)
        self._sent_offsets.append(np.array([self._n], np.int64))
        self._doc_offsets.append(self._n)
        self._ids.append(doc_id)

    @property
    def docs(self) -> int:
        return len(self._ids)

    def close(self, extra_meta: dict | None = None) -> dict:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        bin_path = self.stem.with_suffix(".bin")
        idx_path = self.stem.with_suffix(".idx.npz")
        replace(self._tmp_bin, bin_path)
        buf = io.BytesIO()
        sent = np.concatenate(self._sent_offsets)
        np.savez(
            buf,
            doc_offsets=np.asarray(self._doc_offsets, np.int64),
            sent_offsets=sent,
            doc_ids=np.asarray(self._ids, dtype=np.str_),
        )
        idx_bytes = buf.getvalue()
        write_bytes_atomic(idx_path, idx_bytes)
        meta = {
            "bin": bin_path.name,
            "idx": idx_path.name,
            "dtype": self.dtype.name,
            "docs": len(self._ids),
            "tokens": int(self._n),
            "sentences": int(sent.size - 1),
            "sha256_bin": self._sha.hexdigest(),
            "sha256_idx": hashlib.sha256(idx_bytes).hexdigest(),
            **(extra_meta or {}),
        }
        write_json_atomic(self.stem.with_suffix(".json"), meta)  # completion marker, last
        return meta

    def abort(self) -> None:
        self._fh.close()
        self._tmp_bin.unlink(missing_ok=True)


class TokenShard:
    """Read side: tokens memory-mapped on first use (so it pickles cheaply into DataLoader workers)."""

    def __init__(self, bin_path: str | os.PathLike[str], idx_path: str | os.PathLike[str], dtype: str):
        self.bin_path, self.idx_path, self.dtype = str(bin_path), str(idx_path), np.dtype(dtype)
        with np.load(self.idx_path) as z:
            self.doc_offsets = z["doc_offsets"]
            self.sent_offsets = z["sent_offsets"]
        self._tokens: np.memmap | None = None

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            if os.path.getsize(self.bin_path) == 0:
                self._tokens = np.zeros(0, self.dtype)  # mmap cannot map an empty file
            else:
                self._tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r")
        return self._tokens

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_tokens"] = None
        return d

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.doc_offsets[-1])

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.doc_offsets[i] : self.doc_offsets[i + 1]]

    def doc_ids(self) -> np.ndarray:
        with np.load(self.idx_path) as z:
            return z["doc_ids"]


def read_manifest(tokens_dir: str | os.PathLike[str]) -> dict:
    p = Path(tokens_dir) / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run `python -m data_pipeline tokenize` first")
    return json.loads(p.read_text())


def _localize(url: str, cache_dir: str | None) -> str:
    """A local path for a shard file; remote (fsspec) files are copied once into the cache folder."""
    if "://" not in url or url.startswith("file://"):
        return url.removeprefix("file://")
    import fsspec

    if cache_dir is None:
        raise ValueError(f"loader.cache_dir must be set to read remote token shards ({url})")
    # filecache keeps a copy keyed by URL and re-uses it on the next run (np.memmap needs a real local file).
    return fsspec.open_local(f"filecache::{url}", filecache={"cache_storage": cache_dir})


_CHECKED: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime_ns) verified in this process


def check_shard(bin_path: str, idx_path: str, m: dict, vocab_size: int | None, checksums: bool) -> None:
    """One shard against its manifest record before any read: the .bin's size (always: tokens x itemsize), its
    sha256 and the .idx's (unless `checksums` is off) and, in the same pass, every id below `vocab_size`."""
    itemsize = np.dtype(m["dtype"]).itemsize
    want = int(m["tokens"]) * itemsize
    try:
        have = os.path.getsize(bin_path)
    except OSError as e:
        raise TokenShardError(f"{bin_path}: cannot be read ({e.strerror or e}); {RERUN}") from None
    if have != want:
        cause = "truncated" if have < want else "longer than written"
        raise TokenShardError(
            f"{bin_path}: {have} bytes, the manifest records {want} bytes ({m['tokens']} tokens "
            f"of {m['dtype']}): {cause}; {RERUN}"
        )
    if not checksums and vocab_size is None:
        return
    key = (bin_path, have, os.stat(bin_path).st_mtime_ns)
    if _CHECKED.get(key) is not None and (_CHECKED[key] or not checksums):
        return
    h, pos, chunk = hashlib.sha256(), 0, 1 << 22
    with open(bin_path, "rb") as fh:
        while block := fh.read(chunk - chunk % itemsize):
            if checksums:
                h.update(block)
            if vocab_size is not None:
                ids = np.frombuffer(block, m["dtype"])
                bad = np.flatnonzero(ids >= vocab_size)
                if bad.size:
                    at = int(bad[0])
                    raise TokenShardError(
                        f"{bin_path}: token id {int(ids[at])} at offset {pos + at} is outside the vocabulary of "
                        f"{vocab_size}; {RERUN}"
                    )
                pos += ids.size
    if checksums:
        if h.hexdigest() != m["sha256_bin"]:
            raise TokenShardError(
                f"{bin_path}: sha256 differs from the manifest's (changed or replaced since "
                f"`tokenize` wrote it); {RERUN}"
            )
        if sha256_file(idx_path) != m["sha256_idx"]:
            raise TokenShardError(
                f"{idx_path}: sha256 differs from the manifest's (changed or replaced since "
                f"`tokenize` wrote it); {RERUN}"
            )
    _CHECKED[key] = checksums


def _verify(path: str, sha: str, what: str, force: bool) -> None:
    """Check a copied shard once; a marker beside the cached copy skips re-hashing on later opens."""
    mark = Path(path + ".sha256")
    if not force and mark.is_file() and mark.read_text() == sha:
        return
    if sha256_file(path) != sha:
        raise ValueError(f"checksum mismatch for {path} ({what}): corrupt or stale copy")
    try:
        mark.write_text(sha)
    except OSError:  # read-only cache: verifying every time is still correct
        pass


def open_token_shards(
    tokens_dir: str,
    cache_dir: str | None = None,
    verify: bool = False,
    check: bool = False,
    checksums: bool = True,
) -> tuple[dict, dict[str, list[TokenShard]]]:
    """Manifest + source name -> shards, from a local folder or an fsspec URL (copied into cache_dir).
    Every shard is checked against its manifest record first (`check_shard`: size always, sha256 unless
    `checksums` is off (loader.verify_checksums), ids below the manifest's vocabulary).
    `verify`: hash every file now; `check` (downloaded copies): hash each copy once against the manifest."""
    remote = "://" in tokens_dir and not tokens_dir.startswith("file://")
    if remote:
        import fsspec

        with fsspec.open(f"{tokens_dir.rstrip('/')}/{MANIFEST}", "rt") as fh:
            manifest = json.load(fh)
    else:
        manifest = read_manifest(tokens_dir.removeprefix("file://"))
    out: dict[str, list[TokenShard]] = {}
    base = tokens_dir.rstrip("/")
    vocab = (manifest.get("tokenizer") or {}).get("vocab_size")
    for name, src in manifest["sources"].items():
        shards = []
        for m in src["shards"]:
            bin_p = _localize(f"{base}/{name}/{m['bin']}", cache_dir)
            idx_p = _localize(f"{base}/{name}/{m['idx']}", cache_dir)
            if (verify or remote or check) and (checksums or verify):
                for p, key in ((bin_p, "sha256_bin"), (idx_p, "sha256_idx")):
                    _verify(p, m[key], f"{name}/{m[key[7:]]}", force=verify)
            if "tokens" in m and "sha256_bin" in m:
                check_shard(bin_p, idx_p, m, vocab, checksums and not (remote or check))
            shards.append(TokenShard(bin_p, idx_p, m["dtype"]))
        out[name] = shards
    return manifest, out
