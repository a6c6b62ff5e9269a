"""Segments and the other backend records: keys, binary layouts, codecs.

Key spaces (one leading byte each; integers in keys are big-endian so that key
order is numeric order):

    b"S" + u64 seg_id      -> segment value (below)
    b"L" + u64 version     -> u64 seg_id: change log, one record per segment created
                              or extended; "every segment changed after a snapshot"
                              is the range scan L[watermark+1 ...]
    b"B" + 16-byte id      -> block locator: u64 head key (routing key of the block
                              at the start of its window) + u32 block position (LE)
    b"C" + u64 ns tag (LE) -> u64 LE: blocks indexed in the namespace with that tag
                              (sarpd.core.ids.ns_tag; what quotas count; the tag is
                              little-endian: the order of these keys means nothing)
    b"M"                   -> manifest (format version, geometry, hash scheme;
                              sarpd/core/manifest.py)
    b"N"                   -> counters: next seg id, next version, present blocks,
                              segments (u64 LE each)

Segment value, format 1 (little-endian):

    off  size  field
    0    4     magic b"SRPS"
    4    1     format version (1)
    5    1     nblocks, 1..segment_blocks
    6    2     reserved (0)
    8    8     seg id
    16   8     window: the segment holds block positions
               [window * segment_blocks, window * segment_blocks + nblocks)
    24   8     presence mask: bit i set <=> block i is indexed
    32   8     namespace tag (sarpd.core.ids.ns_tag)
    40   4     CRC-32 of bytes [0, 40) followed by [44, end)
    44   4     reserved (0)
    48   16n   block ids (16 bytes LE each)
    48+16n 8n  block metadata (uint64 LE each)

Invariants: a segment's key never changes (it is the segment's identity; an
extension rewrites the value in place and appends a change-log record); every
block of a segment shares the prefix of the block at its window start; absent
blocks (presence bit 0) keep their ids, so a later insert can refill them.
A value that fails any check is CorruptData and is never served.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from sarpd.errors import CorruptData, FormatVersionError
from sarpd.model import IdArray, U64Array

SEGMENT_FORMAT = 1
MAGIC = b"SRPS"
HEADER = struct.Struct("<4sBBHQQQQII")  # 48 bytes
assert HEADER.size == 48

SEG_PREFIX = b"S"
LOG_PREFIX = b"L"
BLOCK_PREFIX = b"B"
MANIFEST_KEY = b"M"
COUNTERS_KEY = b"N"
NS_COUNT_PREFIX = b"C"  # C + namespace tag (8 bytes LE) -> indexed blocks (u64 LE)
COUNTERS = struct.Struct("<QQQQ")
LOCATOR = struct.Struct("<QI")
LOCATOR_DTYPE = np.dtype([("head", "<u8"), ("pos", "<u4")])
assert LOCATOR_DTYPE.itemsize == LOCATOR.size
# THE block locator key layout: BLOCK_PREFIX, then the id as two little-endian u64
# (its 16 bytes as `sarpd.core.ids.id_bytes` writes them); `block_key` and
# `block_keys` are its scalar and vectorised forms
BLOCK_KEY_ID_AT = len(BLOCK_PREFIX)  # where the id starts in a key
BLOCK_KEY = np.dtype([("prefix", f"S{BLOCK_KEY_ID_AT}"), ("id", "<u8", (2,))])
_BLOCK_KEY_RAW = np.dtype(f"V{BLOCK_KEY.itemsize}")


def ns_count_key(tag: int) -> bytes:
    return NS_COUNT_PREFIX + tag.to_bytes(8, "little")


def seg_key(seg_id: int) -> bytes:
    return SEG_PREFIX + seg_id.to_bytes(8, "big")


def seg_id_of_key(key: bytes) -> int:
    return int.from_bytes(key[1:9], "big")


def log_key(version: int) -> bytes:
    return LOG_PREFIX + version.to_bytes(8, "big")


def block_key(id16: bytes) -> bytes:
    """The locator key of one block, from its id's 16 bytes (BLOCK_KEY's layout)."""
    return BLOCK_PREFIX + id16


def block_keys(ids: IdArray) -> list[bytes]:
    """The locator keys of blocks `ids` ((n, 2) uint64), built as packed BLOCK_KEY
    records in one pass: no per-block Python work."""
    keys = np.empty(len(ids), dtype=BLOCK_KEY)
    keys["prefix"] = BLOCK_PREFIX
    keys["id"] = ids
    out: list[bytes] = keys.view(_BLOCK_KEY_RAW).tolist()
    return out


@dataclass(slots=True)
class Segment:
    """A decoded segment. Mutable working copy: the write path edits and re-encodes it."""

    seg_id: int
    window: int
    presence: int
    ns_tag: int
    ids: IdArray  # (n, 2) uint64
    meta: U64Array  # (n,) uint64

    @property
    def nblocks(self) -> int:
        return int(self.ids.shape[0])

    def present_run(self, start: int = 0) -> int:
        """Length of the run of present blocks from `start`."""
        absent = ~(self.presence >> start) & ((1 << (self.nblocks - start)) - 1)
        if not absent:
            return self.nblocks - start
        return int((absent & -absent).bit_length() - 1)

    def is_present(self, i: int) -> bool:
        return bool((self.presence >> i) & 1)

    def writable(self) -> Segment:
        """A copy whose arrays may be modified."""
        return Segment(
            self.seg_id, self.window, self.presence, self.ns_tag,
            self.ids.copy(), self.meta.copy(),
        )


# segment ids -> their decoded segments (None: missing or corrupt); the mapping returned
# may hold more than was asked for (a batch's whole cache)
Loader = Callable[[Iterable[int]], Mapping[int, "Segment | None"]]


def encode_segment(seg: Segment) -> bytes:
    n = seg.nblocks
    if not 1 <= n <= 64:
        raise CorruptData(f"segment {seg.seg_id}: nblocks {n} not in 1..64")
    body = (
        np.ascontiguousarray(seg.ids, dtype="<u8").tobytes()
        + np.ascontiguousarray(seg.meta, dtype="<u8").tobytes()
    )
    head = HEADER.pack(
        MAGIC, SEGMENT_FORMAT, n, 0, seg.seg_id, seg.window,
        seg.presence & ((1 << n) - 1), seg.ns_tag, 0, 0,
    )
    crc = zlib.crc32(body, zlib.crc32(head[44:], zlib.crc32(head[:40])))
    return head[:40] + crc.to_bytes(4, "little") + head[44:] + body


def decode_segment(value: bytes, expect_id: int | None = None) -> Segment:
    """Parse and check a segment value. Arrays are read-only views of `value`."""
    if len(value) < HEADER.size:
        raise CorruptData(f"segment value of {len(value)} bytes is shorter than its header (48)")
    magic, fmt, n, _r, seg_id, window, presence, tag, crc, _r2 = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise CorruptData(f"segment magic {magic!r} is not {MAGIC!r}")
    if fmt != SEGMENT_FORMAT:
        raise FormatVersionError(
            f"segment {seg_id} has format {fmt}; this build reads format {SEGMENT_FORMAT}"
        )
    if not 1 <= n <= 64 or len(value) != HEADER.size + 24 * n:
        raise CorruptData(f"segment {seg_id}: nblocks {n} does not fit a value of {len(value)} B")
    mv = memoryview(value)
    if zlib.crc32(mv[44:], zlib.crc32(mv[:40])) != crc:
        raise CorruptData(f"segment {seg_id}: checksum mismatch")
    if expect_id is not None and seg_id != expect_id:
        raise CorruptData(f"segment under key {expect_id} says it is {seg_id}")
    ids = np.frombuffer(value, dtype="<u8", count=2 * n, offset=HEADER.size).reshape(n, 2)
    meta = np.frombuffer(value, dtype="<u8", count=n, offset=HEADER.size + 16 * n)
    return Segment(seg_id, window, presence, tag, ids, meta)


@dataclass(frozen=True, slots=True)
class Counters:
    next_seg: int = 1
    next_version: int = 1
    blocks: int = 0  # present blocks
    segments: int = 0

    def encode(self) -> bytes:
        return COUNTERS.pack(self.next_seg, self.next_version, self.blocks, self.segments)

    @staticmethod
    def decode(value: bytes | None) -> Counters:
        if value is None:
            return Counters()
        if len(value) != COUNTERS.size:
            raise CorruptData(f"counters record of {len(value)} B, expected {COUNTERS.size}")
        return Counters(*COUNTERS.unpack(value))
