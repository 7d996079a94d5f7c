"""MinHash signatures and LSH banding for near-duplicate detection.

Shingles are word n-grams (`ngram`) of the normalised text. Each of `bands * rows` hash functions is a
multiply-shift hash of the 32-bit shingle hash ((a*x + b) mod 2^64) >> 32, a universal family that numpy
evaluates without overflow tricks. Two documents become candidates when all `rows` values of at least one
band agree; for Jaccard similarity s of their shingle sets that happens with probability

    P(s) = 1 - (1 - s^rows)^bands

With the defaults bands=14, rows=8 (112 hashes), the S-curve's threshold is (1/b)^(1/r) ~= 0.72 and

    s:     0.50   0.60   0.70   0.75   0.80   0.85   0.90   0.95
    P(s):  0.053  0.211  0.565  0.772  0.924  0.988  0.9996 1.000

i.e. expected recall ~92% for pairs at 0.8 similarity and >99.9% at 0.9, while pairs at 0.5 collide ~5% of
the time (the precision cost; datatrove's FineWeb setting, 14x8 on 5-grams, is the same). More rows sharpen
the curve and raise the threshold; more bands raise recall at a given similarity and cost signature space.
`expected_collision_probability` computes P(s) for any setting.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import xxhash

_WORD = re.compile(r"\w+")
_MASK32 = np.uint64(0xFFFFFFFF)


def expected_collision_probability(s: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - s**rows) ** bands


def shingle_hashes(text: str, ngram: int) -> np.ndarray:
    """Unique 32-bit hashes of the word n-grams of the normalised text (one shingle if shorter than n)."""
    words = _WORD.findall(unicodedata.normalize("NFKC", text).lower())
    if not words:
        return np.zeros(0, dtype=np.uint64)
    vocab: dict[str, int] = {}
    ids = np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), dtype=np.int64, count=len(words))
    word_h = np.fromiter(
        (xxhash.xxh64_intdigest(w.encode()) for w in vocab), dtype=np.uint64, count=len(vocab)
    )[ids]
    n = min(ngram, len(words))
    # Polynomial combination of the n word hashes, in wrapping uint64 arithmetic (vectorised over positions).
    h = np.zeros(len(words) - n + 1, dtype=np.uint64)
    mult = np.uint64(0x100000001B3)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * mult + word_h[k : len(words) - n + 1 + k]
    return np.unique(h >> np.uint64(32))


class MinHasher:
    def __init__(self, ngram: int = 5, bands: int = 14, rows: int = 8, seed: int = 1):
        self.ngram, self.bands, self.rows = ngram, bands, rows
        rng = np.random.default_rng(seed)
        n = bands * rows
        self.a = rng.integers(1, 2**63, size=n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
        self.b = rng.integers(0, 2**63, size=n, dtype=np.uint64)

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def signature(self, text: str) -> np.ndarray:
        """uint32[bands*rows]; an empty text gets all-max (it only collides with other empty texts)."""
        sh = shingle_hashes(text, self.ngram)
        if sh.size == 0:
            return np.full(self.num_perm, 0xFFFFFFFF, dtype=np.uint32)
        sig = np.full(self.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for lo in range(0, sh.size, 4096):  # bound the [shingles x perms] block to a few MB
                blk = sh[lo : lo + 4096, None] * self.a[None, :] + self.b[None, :]
                sig = np.minimum(sig, (blk >> np.uint64(32)).min(axis=0))
        return sig.astype(np.uint32)

    def band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """[docs, bands] uint64 keys: one hash of each band's `rows` signature values."""
        sigs = sigs.astype(np.uint64).reshape(len(sigs), self.bands, self.rows)
        keys = np.zeros((len(sigs), self.bands), dtype=np.uint64)
        mult = np.uint64(0x9E3779B97F4A7C15)
        with np.errstate(over="ignore"):
            for r in range(self.rows):
                keys = (keys ^ sigs[:, :, r]) * mult
        return keys


class UnionFind:
    def __init__(self, n: int):
        self.parent = np.arange(n)

    def find(self, x: int) -> int:
        p = self.parent
        root = x
        while p[root] != root:
            root = p[root]
        while p[x] != root:
            p[x], x = root, p[x]
        return root

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:  # the smaller index (earlier document) stays the root: it is the one kept
            self.parent[max(rx, ry)] = min(rx, ry)


def lsh_pairs(keys: np.ndarray) -> np.ndarray:
    """Candidate pairs [(i, j)] from shared band keys, each bucket chained (i0-i1, i1-i2, ...)."""
    out = []
    for band in range(keys.shape[1]):
        col = keys[:, band]
        order = np.argsort(col, kind="stable")
        s = col[order]
        same = np.nonzero(s[1:] == s[:-1])[0]
        if same.size:
            out.append(np.stack([order[same], order[same + 1]], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2), dtype=np.int64)
