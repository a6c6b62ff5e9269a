"""KV pages: one flushed write buffer, immutable, with a checksum.

Page layout (little-endian), at any byte offset of its partition's `.pages` file;
the manifest records each page's offset and length:

    off   size      field
    0     4         magic b"BSPG"
    4     2         format version (1)
    6     2         partition
    8     4         n, entries
    12    4         K, key heap bytes
    16    8         V, value heap bytes
    24    8         xxh3-64 of bytes [0, 24) followed by [32, end)
    32    8n        hash index: the `lo` key hashes (bloomstore.filter), ascending
    ..    8(n+1)    value offsets into the value heap (u64)
    ..    4n        hash index order: entry number of each hash slot (u32)
    ..    4(n+1)    key offsets into the key heap (u32)
    ..    n         flags: bit 0 = tombstone (the value is empty)
    ..    0..7      zero padding to a multiple of 8
    ..    K         key heap: the keys in ascending byte order, no duplicates
    ..    V         value heap, in entry order

Invariants: a page never changes once written; a page that fails its magic, version,
length or checksum test is never served (CorruptionError). Point lookups binary-search
the hash index; range scans binary-search the sorted keys.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

from bloomstore.errors import CorruptionError
from bloomstore.filter import U64, prefix8

MAGIC = b"BSPG"
VERSION = 1
HEADER = struct.Struct("<4sHHIIQQ")
assert HEADER.size == 32
TOMBSTONE = 1
MAX_ZONES = 8


@dataclass(frozen=True, slots=True)
class PageSpec:
    """What a page's manifest edit records about it."""

    offset: int
    length: int
    count: int
    zones: tuple[tuple[int, int], ...]  # (low, high) prefix8 bounds, one per key run


def _sections(n: int, key_bytes: int) -> tuple[int, int, int, int, int, int]:
    """Offsets of: value offsets, order, key offsets, flags, key heap, value heap."""
    voff = HEADER.size + 8 * n
    order = voff + 8 * (n + 1)
    koff = order + 4 * n
    flags = koff + 4 * (n + 1)
    keys = (flags + n + 7) // 8 * 8
    return voff, order, koff, flags, keys, keys + key_bytes


def encode(partition: int, keys: Sequence[bytes], values: Sequence[bytes | None],
           lo: U64) -> bytes:
    """One page of the sorted, distinct `keys` (None values are tombstones); `lo`
    holds the keys' hashes, in key order."""
    n = len(keys)
    kofs = np.zeros(n + 1, np.int64)
    kofs[1:] = np.cumsum([len(k) for k in keys])
    heap_values = [b"" if v is None else v for v in values]
    vofs = np.zeros(n + 1, np.int64)
    vofs[1:] = np.cumsum([len(v) for v in heap_values])
    flags = np.array([v is None for v in values], np.uint8)
    order = np.argsort(lo, kind="stable").astype("<u4")
    key_heap = b"".join(keys)
    _, _, _, flag_off, key_off, _ = _sections(n, len(key_heap))
    pad = key_off - flag_off - n
    body = b"".join([
        lo[order].astype("<u8").tobytes(), vofs.astype("<u8").tobytes(), order.tobytes(),
        kofs.astype("<u4").tobytes(), flags.tobytes(), b"\0" * pad, key_heap,
        *heap_values,
    ])
    head = HEADER.pack(MAGIC, VERSION, partition, n, len(key_heap), int(vofs[-1]), 0)[:24]
    digest = xxhash.xxh3_64(head)
    digest.update(body)
    return head + digest.intdigest().to_bytes(8, "little") + body


def zones(keys: Sequence[bytes]) -> tuple[tuple[int, int], ...]:
    """Prefix8 bounds of the runs of sorted `keys` that share a first byte (at most
    MAX_ZONES: neighbouring runs are merged past that)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i][:1] != keys[start][:1]:
            runs.append((start, i - 1))
            start = i
    if len(runs) > MAX_ZONES:
        per = -(-len(runs) // MAX_ZONES)
        runs = [(runs[i][0], runs[min(i + per, len(runs)) - 1][1])
                for i in range(0, len(runs), per)]
    return tuple((prefix8(keys[a]), prefix8(keys[b])) for a, b in runs)


class Page:
    """A verified page, read-only views over its bytes."""

    __slots__ = ("_flags", "_hashes", "_kofs", "_order", "_vofs", "data", "key_base", "n",
                 "value_base")

    def __init__(self, data: bytes, where: str, partition: int | None = None) -> None:
        if len(data) < HEADER.size:
            raise CorruptionError(f"{where}: {len(data)} bytes, shorter than a page header")
        magic, version, part, n, kbytes, vbytes, checksum = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise CorruptionError(f"{where}: bad magic {magic!r} or version {version}")
        if partition is not None and part != partition:
            raise CorruptionError(f"{where}: a page of partition {part}, not {partition}")
        voff, order, koff, flags, keys, values = _sections(n, kbytes)
        if values + vbytes != len(data):
            raise CorruptionError(
                f"{where}: {len(data)} bytes, layout of {n} entries needs {values + vbytes}")
        digest = xxhash.xxh3_64(memoryview(data)[:24])
        digest.update(memoryview(data)[HEADER.size :])
        if digest.intdigest() != checksum:
            raise CorruptionError(f"{where}: checksum mismatch")
        self.data = data
        self.n = n
        self._hashes: npt.NDArray[np.uint64] = np.frombuffer(data, "<u8", n, HEADER.size)
        self._vofs: npt.NDArray[np.uint64] = np.frombuffer(data, "<u8", n + 1, voff)
        self._order: npt.NDArray[np.uint32] = np.frombuffer(data, "<u4", n, order)
        self._kofs = np.frombuffer(data, "<u4", n + 1, koff).tolist()
        self._flags: npt.NDArray[np.uint8] = np.frombuffer(data, np.uint8, n, flags)
        self.key_base = keys
        self.value_base = values
        if self._kofs[-1] != kbytes or int(self._vofs[-1]) != vbytes:
            raise CorruptionError(f"{where}: heap offsets disagree with the header")

    def key(self, e: int) -> bytes:
        base = self.key_base
        return self.data[base + self._kofs[e] : base + self._kofs[e + 1]]

    def is_tombstone(self, e: int) -> bool:
        return bool(self._flags[e] & TOMBSTONE)

    def value_span(self, e: int) -> tuple[int, int]:
        """(offset in the page, length) of entry e's value."""
        a, b = int(self._vofs[e]), int(self._vofs[e + 1])
        return self.value_base + a, b - a

    def value(self, e: int) -> bytes:
        start, size = self.value_span(e)
        return self.data[start : start + size]

    def find_many(self, keys: Sequence[bytes], lo: U64) -> list[int]:
        """Entry number of each key, -1 where the page does not hold it."""
        slots = np.searchsorted(self._hashes, lo).tolist()
        hashes, order, n = self._hashes, self._order, self.n
        out: list[int] = []
        for key, h, slot in zip(keys, lo.tolist(), slots, strict=True):
            found = -1
            while slot < n and int(hashes[slot]) == h:
                e = int(order[slot])
                if self.key(e) == key:
                    found = e
                    break
                slot += 1
            out.append(found)
        return out

    def key_range(self, start: bytes, end: bytes) -> range:
        """Entries with start <= key < end (the keys are sorted)."""
        a = bisect_left(range(self.n), start, key=self.key)
        b = bisect_left(range(self.n), end, lo=a, key=self.key)
        return range(a, b)

    def keys(self) -> list[bytes]:
        return [self.key(e) for e in range(self.n)]


class PageCache:
    """LRU of verified pages, bounded by bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._pages: OrderedDict[tuple[int, int, int], Page] = OrderedDict()

    def get(self, key: tuple[int, int, int]) -> Page | None:
        page = self._pages.get(key)
        if page is not None:
            self._pages.move_to_end(key)
        return page

    def put(self, key: tuple[int, int, int], page: Page) -> None:
        size = len(page.data)
        if size > self.capacity // 4 or key in self._pages:
            return
        self._pages[key] = page
        self.used += size
        while self.used > self.capacity:
            _, old = self._pages.popitem(last=False)
            self.used -= len(old.data)

    def drop_partition(self, partition: int) -> None:
        for key in [k for k in self._pages if k[0] == partition]:
            self.used -= len(self._pages.pop(key).data)

    def clear(self) -> None:
        self._pages.clear()
        self.used = 0


def chunk_bounds(key_lens: Sequence[int], value_lens: Sequence[int], max_keys: int,
                 max_bytes: int) -> list[tuple[int, int]]:
    """Cut entries into pages of at most `max_keys` entries and, unless one entry alone
    is larger, at most `max_bytes` bytes of keys and values."""
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, (k, v) in enumerate(zip(key_lens, value_lens, strict=True)):
        if i > start and (i - start >= max_keys or size + k + v > max_bytes):
            out.append((start, i))
            start, size = i, 0
        size += k + v
    if start < len(key_lens):
        out.append((start, len(key_lens)))
    return out
