"""Key hashing: partition choice, Bloom-filter bit positions, zone-map prefixes.

One xxh3-128 digest per key, split into two 64-bit halves `lo` and `hi`:
- partition = ((hi >> 32) * P) >> 32 (multiply-shift over the top 32 bits of `hi`);
- bit positions (Kirsch-Mitzenmacher double hashing): g_j = (lo + j * (hi | 1)) mod m,
  j = 0..k-1; modulo m they depend on the low bits of `lo` and `hi` only, which are
  independent of the partition bits;
- `lo` is also the key's hash in a KV page's hash index.
Everything here is vectorised over a batch of keys (numpy).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import xxhash

U64 = npt.NDArray[np.uint64]
Ints = npt.NDArray[np.intp]

_SHIFT32 = np.uint64(32)


def digests(keys: Sequence[bytes]) -> tuple[U64, U64]:
    """(lo, hi) halves of the xxh3-128 digest of every key."""
    if not keys:
        empty = np.empty(0, np.uint64)
        return empty, empty
    raw = b"".join([xxhash.xxh3_128_digest(k) for k in keys])
    halves = np.frombuffer(raw, dtype=">u8").reshape(-1, 2).astype(np.uint64)
    return halves[:, 1].copy(), halves[:, 0].copy()


def partitions_of(hi: U64, partitions: int) -> Ints:
    return (((hi >> _SHIFT32) * np.uint64(partitions)) >> _SHIFT32).astype(np.intp)


def positions(lo: U64, hi: U64, hashes: int, bits: int) -> Ints:
    """(n, hashes) bit positions in a filter of `bits` bits, one row per key."""
    step = hi | np.uint64(1)
    j = np.arange(hashes, dtype=np.uint64)
    g = lo[:, None] + j[None, :] * step[:, None]  # wraps modulo 2**64 on purpose
    return (g % np.uint64(bits)).astype(np.intp)


def filter_words(pos: Ints, bits: int) -> U64:
    """The filter holding the keys of `pos` as bits // 64 words (bit j = word j >> 6,
    bit j & 63). Used to test filters and by compaction."""
    words = np.zeros((bits + 63) // 64, np.uint64)
    flat = np.unique(pos.ravel())
    np.bitwise_or.at(words, flat >> 6, np.uint64(1) << (flat & 63).astype(np.uint64))
    return words


def prefix8(key: bytes) -> int:
    """The first 8 bytes of `key`, zero-padded, as a big-endian integer: monotone in
    key order (k1 <= k2 implies prefix8(k1) <= prefix8(k2)), so an interval of
    prefixes bounds an interval of keys."""
    return int.from_bytes(key[:8].ljust(8, b"\0"), "big")
