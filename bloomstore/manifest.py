"""The manifest: which pages every partition holds, without reading any page.

File `MANIFEST` (little-endian): a sequence of records, each

    header (16 B): body bytes u32, type u32, xxh3-64 of (header [0, 8) + body)
    body

type 1, SNAPSHOT (always the first record, and only the first):
    magic b"BSMF", version u16 (1), reserved u16, partitions u32, keys_per_page u32,
    bits_per_key u32, hashes u32, wal generation u64, next lsn u64; then per
    partition: generation, flushed lsn, entries, dead (estimated), tombstones (u64
    each), pages u32, zones u32, followed by the arrays page offset u64[pages], page
    length u64[pages], page entries u32[pages], zone page u32[zones], zone low
    u64[zones], zone high u64[zones], chain slab checksum u64[ceil(pages / 64)]
type 2, FLUSH (one new page of one partition):
    partition u32, file generation u32, page number u32, entries u32, offset u64,
    length u64, flushed lsn u64, dead delta u64, tombstones u64, checksum u64 of the
    chain slab holding the page's filter (chain.py), zones u32; then zones x (low u64,
    high u64)

Invariants: a snapshot is written whole to MANIFEST.tmp, fsync'd and renamed over
MANIFEST (atomic) at creation, at every checkpoint (log rotation) and after every
compaction; FLUSH records are appended after the page and its filter are written
(and fsync'd). A checkpoint writes a snapshot, so every FLUSH record after the
snapshot describes a page whose entries are also in the current write-ahead log:
losing any suffix of FLUSH records (torn tail, no fsync) loses no data, the log
replays them into the buffers again. Loading stops at the first torn or failing
record and cuts the file there. A partition's "flushed lsn" is the last log record
whose entries for that partition are on pages; replay skips them.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from bloomstore.chain import SLAB_FILTERS
from bloomstore.config import Geometry
from bloomstore.errors import CorruptionError, FormatError, version_message
from bloomstore.files import DataFile, write_atomic
from bloomstore.pages import PageSpec

NAME = "MANIFEST"
MAGIC = b"BSMF"
VERSION = 1
FRAME = struct.Struct("<IIQ")
SNAPSHOT, FLUSH = 1, 2
SNAP_HEAD = struct.Struct("<4sHHIIIIQQ")
PART_HEAD = struct.Struct("<QQQQQII")
FLUSH_HEAD = struct.Struct("<IIIIQQQQQQI")
ZONE = struct.Struct("<QQ")


class Grow:
    """A growable 1-d numpy array (amortised doubling)."""

    __slots__ = ("data", "n")

    def __init__(self, dtype: type[np.generic], values: npt.ArrayLike = ()) -> None:
        init = np.asarray(values, dtype=dtype)
        self.data: npt.NDArray[Any] = np.empty(max(16, 2 * len(init)), dtype)
        self.data[: len(init)] = init
        self.n = len(init)

    def append(self, value: int) -> None:
        if self.n == len(self.data):
            self.data = np.concatenate([self.data, np.empty_like(self.data)])
        self.data[self.n] = value
        self.n += 1

    @property
    def view(self) -> npt.NDArray[Any]:
        return self.data[: self.n]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


class PageTable:
    """Per page: offset, length, entries; per zone: page, low and high prefix8."""

    __slots__ = ("counts", "lengths", "offsets", "slab_sums", "zone_high", "zone_low",
                 "zone_page")

    def __init__(self) -> None:
        self.offsets, self.lengths, self.counts = Grow(np.uint64), Grow(np.uint64), Grow(
            np.uint32)
        self.zone_page, self.zone_low, self.zone_high = Grow(np.uint32), Grow(
            np.uint64), Grow(np.uint64)
        self.slab_sums = Grow(np.uint64)

    def __len__(self) -> int:
        return self.offsets.n

    def append(self, spec: PageSpec) -> None:
        page = len(self)
        self.offsets.append(spec.offset)
        self.lengths.append(spec.length)
        self.counts.append(spec.count)
        for low, high in spec.zones:
            self.zone_page.append(page)
            self.zone_low.append(low)
            self.zone_high.append(high)

    def set_slab_sum(self, page: int, checksum: int) -> None:
        """The chain slab holding page `page`'s filter now has `checksum`."""
        slab = page // SLAB_FILTERS
        if slab == self.slab_sums.n:
            self.slab_sums.append(checksum)
        else:
            self.slab_sums.data[slab] = checksum

    def slab_sum(self, slab: int) -> int:
        return int(self.slab_sums.data[slab])

    def location(self, page: int) -> tuple[int, int]:
        return int(self.offsets.data[page]), int(self.lengths.data[page])

    def end(self) -> int:
        """Where the next page goes in the partition's file."""
        if not len(self):
            return 0
        offset, length = self.location(len(self) - 1)
        return offset + length

    def pages_overlapping(self, low: int, high: int) -> list[int]:
        """Pages with a zone that meets [low, high] (prefix8 bounds), newest first."""
        mask = (self.zone_high.view >= low) & (self.zone_low.view <= high)
        pages: list[int] = np.unique(self.zone_page.view[mask]).tolist()
        return pages[::-1]

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in (self.offsets, self.lengths, self.counts,
                                      self.zone_page, self.zone_low, self.zone_high,
                                      self.slab_sums))


@dataclass(slots=True)
class PartitionState:
    gen: int = 0
    flushed_lsn: int = 0
    entries: int = 0
    dead: int = 0
    tombstones: int = 0
    table: PageTable = field(default_factory=PageTable)


@dataclass(frozen=True, slots=True)
class FlushEdit:
    partition: int
    gen: int
    page: int
    spec: PageSpec
    flushed_lsn: int
    dead: int
    tombstones: int
    slab_sum: int


@dataclass(slots=True)
class StoreState:
    geometry: Geometry
    wal_gen: int
    next_lsn: int
    parts: list[PartitionState]


def _frame(kind: int, body: bytes) -> bytes:
    head = struct.pack("<II", len(body), kind)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head + body)) + body


def encode_snapshot(state: StoreState) -> bytes:
    g = state.geometry
    parts = [SNAP_HEAD.pack(MAGIC, VERSION, 0, g.partitions, g.keys_per_page,
                            g.bits_per_key, g.hashes, state.wal_gen, state.next_lsn)]
    for p in state.parts:
        t = p.table
        parts.append(PART_HEAD.pack(p.gen, p.flushed_lsn, p.entries, p.dead, p.tombstones,
                                    len(t), t.zone_page.n))
        for arr, dtype in ((t.offsets, "<u8"), (t.lengths, "<u8"), (t.counts, "<u4"),
                           (t.zone_page, "<u4"), (t.zone_low, "<u8"), (t.zone_high, "<u8"),
                           (t.slab_sums, "<u8")):
            parts.append(arr.view.astype(dtype).tobytes())
    return _frame(SNAPSHOT, b"".join(parts))


def encode_flush(edit: FlushEdit) -> bytes:
    s = edit.spec
    body = FLUSH_HEAD.pack(edit.partition, edit.gen, edit.page, s.count, s.offset, s.length,
                           edit.flushed_lsn, edit.dead, edit.tombstones, edit.slab_sum,
                           len(s.zones))
    body += b"".join(ZONE.pack(low, high) for low, high in s.zones)
    return _frame(FLUSH, body)


class _Reader:
    def __init__(self, body: memoryview, where: str) -> None:
        self.body, self.pos, self.where = body, 0, where

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        if self.pos + st.size > len(self.body):
            raise CorruptionError(f"{self.where}: snapshot record ends early")
        out = st.unpack_from(self.body, self.pos)
        self.pos += st.size
        return out

    def array(self, dtype: str, n: int) -> npt.NDArray[np.generic]:
        size = np.dtype(dtype).itemsize * n
        if self.pos + size > len(self.body):
            raise CorruptionError(f"{self.where}: snapshot record ends early")
        out = np.frombuffer(self.body, dtype, n, self.pos)
        self.pos += size
        return out


def decode_snapshot(body: memoryview, where: str) -> StoreState:
    r = _Reader(body, where)
    magic, version, _, nparts, kpp, bpk, hashes, wal_gen, next_lsn = r.unpack(SNAP_HEAD)
    if magic != MAGIC:
        raise CorruptionError(f"{where}: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FormatError(version_message(where, "manifest", version, VERSION))
    geometry = Geometry(nparts, kpp, bpk, hashes)
    parts = []
    for _ in range(nparts):
        gen, flushed, entries, dead, tombs, npages, nzones = r.unpack(PART_HEAD)
        p = PartitionState(gen, flushed, entries, dead, tombs)
        t = p.table
        t.offsets, t.lengths = Grow(np.uint64, r.array("<u8", npages)), Grow(
            np.uint64, r.array("<u8", npages))
        t.counts = Grow(np.uint32, r.array("<u4", npages))
        t.zone_page = Grow(np.uint32, r.array("<u4", nzones))
        t.zone_low, t.zone_high = Grow(np.uint64, r.array("<u8", nzones)), Grow(
            np.uint64, r.array("<u8", nzones))
        t.slab_sums = Grow(np.uint64, r.array("<u8", -(-npages // SLAB_FILTERS)))
        parts.append(p)
    if r.pos != len(body):
        raise CorruptionError(f"{where}: {len(body) - r.pos} stray bytes in the snapshot")
    return StoreState(geometry, wal_gen, next_lsn, parts)


def decode_flush(body: memoryview, where: str) -> FlushEdit:
    r = _Reader(body, where)
    (part, gen, page, count, offset, length, flushed, dead, tombs, slab_sum,
     nzones) = r.unpack(FLUSH_HEAD)
    zones = tuple((int(a), int(b)) for a, b in (r.unpack(ZONE) for _ in range(nzones)))
    return FlushEdit(part, gen, page, PageSpec(offset, length, count, zones), flushed, dead,
                     tombs, slab_sum)


def apply_flush(p: PartitionState, edit: FlushEdit) -> None:
    """Add the page of `edit` to partition state `p` (ValueError if it does not follow)."""
    if edit.page != len(p.table) or (edit.gen != p.gen and (len(p.table) or edit.gen < 1)):
        raise ValueError(f"partition {edit.partition} page {edit.page} generation {edit.gen} "
                         f"does not follow page count {len(p.table)} generation {p.gen}")
    if edit.spec.offset != p.table.end():
        raise ValueError(f"page offset {edit.spec.offset} is not the file end {p.table.end()}")
    p.gen = edit.gen
    p.table.append(edit.spec)
    p.table.set_slab_sum(edit.page, edit.slab_sum)
    p.flushed_lsn = edit.flushed_lsn
    p.entries += edit.spec.count
    p.dead += edit.dead
    p.tombstones += edit.tombstones


class Manifest:
    """The open MANIFEST: appends FLUSH records at the tracked end, replaces itself by
    a snapshot."""

    def __init__(self, dirpath: Path) -> None:
        self.path = dirpath / NAME
        self.file: DataFile | None = None
        self.end = 0
        self.dirty = False
        self.edits = 0
        self.bytes_dropped = 0

    def create(self, state: StoreState, fsync: bool) -> None:
        self.write_snapshot(state, fsync)

    def load(self) -> StoreState:
        self.file = DataFile(self.path, create=False)
        size = self.file.size()
        data = memoryview(self.file.read(size, 0))
        state: StoreState | None = None
        pos = 0
        while pos + FRAME.size <= len(data):
            blen, kind, checksum = FRAME.unpack_from(data, pos)
            body = data[pos + FRAME.size : pos + FRAME.size + blen]
            if len(body) != blen:
                break
            digest = xxhash.xxh3_64(data[pos : pos + 8])
            digest.update(body)
            if digest.intdigest() != checksum:
                break
            where = f"{self.path} record at {pos}"
            if state is None:
                if kind != SNAPSHOT:
                    raise CorruptionError(f"{where}: type {kind}, the first must be a snapshot")
                state = decode_snapshot(body, where)
            elif kind == FLUSH:
                edit = decode_flush(body, where)
                try:
                    if edit.partition >= len(state.parts):
                        raise ValueError(f"partition {edit.partition} >= {len(state.parts)}")
                    apply_flush(state.parts[edit.partition], edit)
                except ValueError as exc:
                    raise CorruptionError(f"{where}: {exc}") from exc
                self.edits += 1
            else:
                raise CorruptionError(f"{where}: unexpected record type {kind}")
            pos += FRAME.size + blen
        if state is None:
            raise CorruptionError(f"{self.path}: no valid snapshot record ({size} bytes)")
        self.end = pos
        self.bytes_dropped = len(data) - pos
        if self.bytes_dropped:
            os.ftruncate(self.file.fd, pos)
        return state

    def append(self, edits: list[FlushEdit]) -> None:
        assert self.file is not None
        data = b"".join(encode_flush(e) for e in edits)
        try:
            self.file.write(data, self.end)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self.file.fd, self.end)
            raise
        self.end += len(data)
        self.edits += len(edits)
        self.dirty = True

    def write_snapshot(self, state: StoreState, fsync: bool) -> None:
        data = encode_snapshot(state)
        write_atomic(self.path, data, fsync)
        if self.file is not None:
            self.file.close()
        self.file = DataFile(self.path, create=False)
        self.end = len(data)
        self.edits = 0
        self.dirty = False

    def sync(self) -> None:
        if self.dirty and self.file is not None:
            self.file.sync()
            self.dirty = False

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
