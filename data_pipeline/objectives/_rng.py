"""Counter-based randomness for collators: every random number is a pure function of
(seed, epoch, sample_id, stream, position).

Why not numpy Generators: a per-sample Generator costs ~20 us to build and forces a Python loop over the
batch, while a batch-global Generator makes a sample's mask depend on its neighbours in the batch (breaking
resume / re-sharding parity). SplitMix64 (Steele, Lea & Flood 2014, the generator of
java.util.SplittableRandom) evaluated on the whole [batch, length] array at once is both fast and
batch-composition independent.
"""

from __future__ import annotations

import functools

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

# One stream per objective, so that two objectives never share random words for the same sample.
STREAM_MLM = 1
STREAM_SPAN = 11


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (array arithmetic wraps silently, as intended)."""
    z = (x ^ (x >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


_MASK = (1 << 64) - 1


def _mix_int(x: int) -> int:
    """`mix64` on one Python int (identical results), for per-batch constants without array overhead."""
    x &= _MASK
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=256)
def _epoch_base(seed: int, stream: int, epoch: int) -> int:
    return _mix_int(_mix_int(seed * 0x9E3779B97F4A7C15 + stream + 1) ^ ((epoch + 0x9E3779B97F4A7C15) & _MASK))


def sample_keys(seed: int, epoch: np.ndarray, sample_id: np.ndarray, stream: int) -> np.ndarray:
    """One 64-bit key per sample: mix64(base(seed, stream, epoch) + sample_id * golden), i.e. SplitMix64's
    sample_id-th output for a per-epoch seed. A batch from one epoch (the usual case) computes the base once."""
    epoch = np.asarray(epoch, dtype=np.int64)
    sid = np.asarray(sample_id, dtype=np.int64).view(np.uint64) * _GOLDEN
    if epoch.size and (epoch == epoch.flat[0]).all():
        base = np.uint64(_epoch_base(seed, stream, int(epoch.flat[0])))
    else:
        uniq, inv = np.unique(epoch, return_inverse=True)
        base = np.asarray([_epoch_base(seed, stream, int(e)) for e in uniq], dtype=np.uint64)[inv.ravel()]
    return mix64(sid + base)


def stream_bits(keys: np.ndarray, length: int) -> np.ndarray:
    """[batch, length] uint64 random words: element (b, i) is SplitMix64's i-th output seeded with keys[b]."""
    counters = np.arange(1, length + 1, dtype=np.uint64) * _GOLDEN
    return mix64(keys[:, None] + counters[None, :])


_G32, _L1, _L2 = np.uint32(0x9E3779B9), np.uint32(0x21F0AAAD), np.uint32(0x735A2D97)
_S16, _S15 = np.uint32(16), np.uint32(15)


def key32(keys: np.ndarray) -> np.ndarray:
    """The 32-bit seed of each 64-bit key for `stream_bits32` / `hash32`."""
    halves = np.ascontiguousarray(keys, dtype=np.uint64).view(np.uint32).reshape(-1, 2)
    # high ^ low word (either byte order), one op instead of shift+xor+cast
    return halves[:, 0] ^ halves[:, 1]


def weyl32(length: int) -> np.ndarray:
    """Counters 1..length times the 32-bit golden ratio: add a `key32` to get a row's Weyl sequence."""
    return np.arange(1, length + 1, dtype=np.uint32) * _G32


def hash32(x: np.ndarray) -> np.ndarray:
    """Wellons' `lowbias32` integer hash of a uint32 array, in place (returns x)."""
    x ^= x >> _S16
    x *= _L1
    x ^= x >> _S15
    x *= _L2
    x ^= x >> _S15
    return x


def stream_bits32(keys: np.ndarray, length: int) -> np.ndarray:
    """[batch, length] uint32 random words, half the memory traffic of `stream_bits` where 32 bits suffice:
    a Weyl sequence per key through Wellons' `lowbias32` integer hash. Element (b, i) is
    hash32(key32(keys)[b] + weyl32(length)[i])."""
    return hash32(key32(keys)[:, None] + weyl32(length)[None, :])


def row_uniform(keys: np.ndarray) -> np.ndarray:
    """One float64 in [0, 1) per key."""
    return (mix64(keys ^ _M1) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
