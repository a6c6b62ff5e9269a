"""Tunables of a BloomStore.

`Geometry` is fixed when a store is created and kept in its manifest (every filter of
a chain must have the same size, and keys must keep hashing to the same partition);
`Tuning` may change at every open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bloomstore.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB

MAX_PARTITIONS = 4096
MAX_KEYS_PER_PAGE = 1 << 16
MAX_FILTER_BITS = 1 << 24
MAX_HASHES = 32
MAX_KEY_BYTES = 1 << 16
MAX_VALUE_BYTES = 1 << 30


def _check(name: str, value: int | float, low: int | float, high: int | float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"bloomstore: {name} {value!r} is outside [{low}, {high}]")


def optimal_hashes(bits_per_key: int) -> int:
    """k = round(m/n * ln 2), the count of hash functions that minimises the FP rate."""
    return max(1, round(bits_per_key * math.log(2)))


def filter_fp_rate(bits_per_key: float, hashes: int) -> float:
    """The false-positive rate of one Bloom filter holding m/bits_per_key keys."""
    if bits_per_key <= 0:
        return 1.0
    return float((1.0 - math.exp(-hashes / bits_per_key)) ** hashes)


@dataclass(frozen=True, slots=True)
class Geometry:
    """partitions: key-hash partitions ("instances" in the paper), each with its write
    buffer, KV page file and Bloom-filter chain. keys_per_page: the capacity of one
    page's filter (a buffer holding that many keys is flushed). bits_per_key, hashes:
    the filter, m = keys_per_page * bits_per_key bits, k = hashes."""

    partitions: int = 16
    keys_per_page: int = 256
    bits_per_key: int = 16
    hashes: int = 11

    def __post_init__(self) -> None:
        _check("partitions", self.partitions, 1, MAX_PARTITIONS)
        _check("keys_per_page", self.keys_per_page, 1, MAX_KEYS_PER_PAGE)
        _check("bits_per_key", self.bits_per_key, 1, 64)
        _check("hashes", self.hashes, 1, MAX_HASHES)
        _check("filter bits (keys_per_page * bits_per_key)", self.filter_bits, 64,
               MAX_FILTER_BITS)

    @property
    def filter_bits(self) -> int:
        return self.keys_per_page * self.bits_per_key

    @property
    def target_fp_rate(self) -> float:
        """FP rate of one full page's filter (a partly filled page's is lower)."""
        return filter_fp_rate(self.bits_per_key, self.hashes)


@dataclass(frozen=True, slots=True)
class Tuning:
    """page_bytes: a buffer whose keys and values reach this many bytes is flushed (as
    are buffers of `keys_per_page` keys). wal_bytes: past this size the log is
    checkpointed (every buffer flushed, a new log started). cache_bytes: verified pages
    kept in RAM. dead_ratio, compact_min_pages: a partition is compacted after a flush
    when its estimated dead entries reach `dead_ratio` of its entries and it has at
    least `compact_min_pages` pages (0 disables). max_buffered_bytes: while flushes
    fail, writes are refused past this many buffered bytes. fsync: fsync pages and
    chains before the manifest names them, and manifest snapshots (the log follows
    each write's own `sync`). direct_io: reads of pages bypass the OS page cache
    (posix_fadvise DONTNEED after each read and after each fsync of a page file;
    the bit-sliced filter chains stay memory-mapped)."""

    page_bytes: int = 64 * KiB
    wal_bytes: int = 8 * MiB
    cache_bytes: int = 8 * MiB
    dead_ratio: float = 0.5
    compact_min_pages: int = 8
    max_buffered_bytes: int = 256 * MiB
    fsync: bool = True
    direct_io: bool = False

    def __post_init__(self) -> None:
        _check("page_bytes", self.page_bytes, 256, 1 << 30)
        _check("wal_bytes", self.wal_bytes, 4 * KiB, 1 << 40)
        _check("cache_bytes", self.cache_bytes, 0, 1 << 50)
        _check("dead_ratio", self.dead_ratio, 0.01, 1.0)
        _check("compact_min_pages", self.compact_min_pages, 0, 1 << 30)
        _check("max_buffered_bytes", self.max_buffered_bytes, 1 * MiB, 1 << 50)
