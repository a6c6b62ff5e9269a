"""Segments and the other backend records: keys, binary layouts, codecs.

Key spaces (one leading byte each; integers in keys are big-endian so that key
order is numeric order):

    b"S" + u64 seg_id      -> segment value (below)
    b"L" + u64 version     -> u64 seg_id, ...: change log, one record per write batch
                              naming every segment it created, extended or refilled
                              (u64 BE each; data before issue 24 has one a record);
                              "every segment changed after a snapshot" is the range
                              scan L[watermark+1 ...]
    b"B" + 16-byte id      -> block locator: u64 head key (routing key of the block
                              at the start of its window) + u32 block position (LE)
    b"C" + u64 ns tag (LE) -> u64 LE: blocks indexed in the namespace with that tag
                              (sarpd.core.ids.ns_tag; what quotas count; the tag is
                              little-endian: the order of these keys means nothing)
    b"M"                   -> manifest (format version, geometry, hash scheme;
                              sarpd/core/manifest.py)
    b"N"                   -> counters: next seg id, next version, present blocks,
                              segments, holdings (block-holder pairs) (u64 LE each;
                              a record of the first four only is read as one holder
                              a block)
    b"A"                   -> u64 LE: the last log sequence applied (a replica of a
                              shard, issue 15: written in the batch of the write it
                              applied, so data and sequence are durable together;
                              absent: 0, nothing applied)
    b"P" + 16-byte parent id + 16-byte child id -> empty: a branch link, written
                              only with `[index] branch_links` (a cluster replica,
                              issue 27) for a block at the start of a window (a
                              multiple of segment_blocks) and the block before it:
                              the one parent-child pair no segment holds. An insert
                              writes one for each window start among its new blocks;
                              nothing deletes them (a link to a block since removed
                              names a branch that was there: harmless to its reader,
                              `SarpIndex.children`)

Segment value, format 1 (little-endian; format 2 adds the holder table):

    off  size  field
    0    4     magic b"SRPS"
    4    1     format version: 1, or 2 when the holder table is not empty
    5    1     nblocks, 1..segment_blocks
    6    2     reserved (0)
    8    8     seg id
    16   8     window: the segment holds block positions
               [window * segment_blocks, window * segment_blocks + nblocks)
    24   8     presence mask: bit i set <=> block i is indexed
    32   8     namespace tag (sarpd.core.ids.ns_tag)
    40   4     CRC-32 of bytes [0, 40) followed by [44, end)
    44   4     h: entries of the holder table (format 2; 0 and absent in format 1)
    48   16n   block ids (16 bytes LE each)
    48+16n 8n  block metadata: each block's first holder (uint64 LE each)
    48+24n 8h  format 2: the other holders' metadata words, ascending, distinct
    48+24n+8h 8h  format 2: their masks: bit i set <=> that holder holds block i

Holders (protocol 2): block i's holders are meta[i] and every table entry whose mask
has bit i; an entry never repeats meta[i] of a block it holds, holds only present
blocks, and has a non-zero mask. A segment whose blocks each have one holder has an
empty table and is written in format 1, byte for byte what it was before holders.

Invariants: a segment's key never changes (it is the segment's identity; an
extension rewrites the value in place and appends a change-log record); every
block of a segment shares the prefix of the block at its window start; absent
blocks (presence bit 0) keep their ids, so a later insert can refill them.
A value that fails any check is CorruptData and is never served.

The codecs (`encode_segment`, `decode_segment`'s checks, `block_keys`) have a C twin,
sarpd/core/_cwrite.c (native path "write"): each takes the kernels that run it
(`sarpd.core.native.Kernels`: an index's own; None: the process default); the
functions here are its reference, and a value the C refuses is decoded by the
reference, which raises its own error.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sarpd.core import native
from sarpd.core.native import Kernels
from sarpd.errors import CorruptData, FormatVersionError
from sarpd.model import IdArray, U64Array

SEGMENT_FORMAT = 2  # the newest value format; values of format 1 are read as well
SEGMENT_FORMATS = (1, 2)
MAGIC = b"SRPS"
HEADER = struct.Struct("<4sBBHQQQQII")  # 48 bytes
assert HEADER.size == 48

SEG_PREFIX = b"S"
LOG_PREFIX = b"L"
BLOCK_PREFIX = b"B"
MANIFEST_KEY = b"M"
COUNTERS_KEY = b"N"
APPLIED_KEY = b"A"  # -> u64 LE: the last log sequence applied (replicas)
NS_COUNT_PREFIX = b"C"  # C + namespace tag (8 bytes LE) -> indexed blocks (u64 LE)
LINK_PREFIX = b"P"  # P + parent id (16 B) + child id (16 B) -> b"" (branch_links)
COUNTERS = struct.Struct("<QQQQQ")
COUNTERS_V1 = struct.Struct("<QQQQ")  # before holders (no holdings field)
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


def link_key(parent16: bytes, child16: bytes) -> bytes:
    """The branch link of a window-start block `child16` after `parent16`."""
    return LINK_PREFIX + parent16 + child16


def block_key(id16: bytes) -> bytes:
    """The locator key of one block, from its id's 16 bytes (BLOCK_KEY's layout)."""
    return BLOCK_PREFIX + id16


_LOCATOR_RAW = np.dtype(f"V{LOCATOR_DTYPE.itemsize}")


def locator_records(ids: IdArray, heads: U64Array, pos: npt.NDArray[Any],
                    k: Kernels | None = None) -> dict[bytes, bytes]:
    """Locator records (key -> value) of blocks `ids` at (head key, position), built as
    packed numpy records: no per-block Python work but the dict (a later record for
    the same block wins)."""
    vals = np.empty(len(ids), dtype=LOCATOR_DTYPE)
    vals["head"], vals["pos"] = heads, pos
    return dict(zip(block_keys(ids, k), vals.view(_LOCATOR_RAW).tolist(), strict=True))


def as_u64(a: U64Array) -> U64Array:
    """`a` as a C-contiguous uint64 array (itself when it already is): what the C
    codecs take."""
    if a.dtype == np.uint64 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.uint64)


def block_keys(ids: IdArray, k: Kernels | None = None) -> list[bytes]:
    """The locator keys of blocks `ids` ((n, 2) uint64), built as packed BLOCK_KEY
    records in one pass: no per-block Python work."""
    c = (k or native.pick()).write
    if c is not None:
        out: list[bytes] = c.block_keys(as_u64(ids))
        return out
    return _block_keys(ids)


def _block_keys(ids: IdArray) -> list[bytes]:
    keys = np.empty(len(ids), dtype=BLOCK_KEY)
    keys["prefix"] = BLOCK_PREFIX
    keys["id"] = ids
    raw: list[bytes] = keys.view(_BLOCK_KEY_RAW).tolist()
    return raw


NO_HOLDERS = np.empty(0, dtype=np.uint64)


@dataclass(slots=True)
class Segment:
    """A decoded segment. Mutable working copy: the write path edits and re-encodes it.
    `xmeta`/`xmask`: the holder table (module docstring), empty for one holder a block."""

    seg_id: int
    window: int
    presence: int
    ns_tag: int
    ids: IdArray  # (n, 2) uint64
    meta: U64Array  # (n,) uint64: each block's first holder
    xmeta: U64Array = field(default_factory=lambda: NO_HOLDERS)  # (h,) ascending
    xmask: U64Array = field(default_factory=lambda: NO_HOLDERS)  # (h,)
    # what the match kernel read of it (sarpd/core/_cmatch.c CView), kept from its first
    # read: a segment the store hands out is never changed (the writer edits copies)
    _cview: object = field(default=None, repr=False, compare=False)

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

    def has_at(self, i: int, want: list[int]) -> bool:
        """Whether block i exists and has id `want` ([low, high], as `tolist` gives it)."""
        return i < self.ids.shape[0] and bool(self.ids[i].tolist() == want)

    def writable(self) -> Segment:
        """A copy whose arrays may be modified."""
        return Segment(
            self.seg_id, self.window, self.presence, self.ns_tag,
            self.ids.copy(), self.meta.copy(), self.xmeta.copy(), self.xmask.copy(),
        )

    # -- holders (sarpd/core/holders.py reads them for matches) --------------------
    def holders_of(self, i: int) -> list[int]:
        """The holders of block i (first holder first); [] when it is absent."""
        if not self.is_present(i):
            return []
        if not len(self.xmeta):  # one holder a block: no table to look in
            return [int(self.meta[i])]
        bit = np.uint64(1 << i)
        return [int(self.meta[i]), *self.xmeta[(self.xmask & bit) != 0].tolist()]

    def holds(self, i: int, holder: int) -> bool:
        return holder in self.holders_of(i)

    def add_holder(self, i: int, holder: int) -> bool:
        """Make `holder` a holder of present block i; False when it already was."""
        if not self.is_present(i) or self.holds(i, holder):
            return False
        at = int(np.searchsorted(self.xmeta, np.uint64(holder)))
        if at < len(self.xmeta) and int(self.xmeta[at]) == holder:
            self.xmask[at] |= np.uint64(1 << i)
        else:
            self.xmeta = np.insert(self.xmeta, at, np.uint64(holder))
            self.xmask = np.insert(self.xmask, at, np.uint64(1 << i))
        return True

    def drop_holder(self, i: int, holder: int | None) -> bool:
        """Take `holder` (None: every holder) off block i. The block becomes absent
        when no holder is left; returns True when it did."""
        if not self.is_present(i):
            return False
        if not len(self.xmeta):  # one holder a block: no table to edit
            if holder is not None and int(self.meta[i]) != holder:
                return False
            self.presence &= ~(1 << i)
            return True
        bit = np.uint64(1 << i)
        held = (self.xmask & bit) != 0
        if holder is None or (int(self.meta[i]) == holder and not held.any()):
            self.xmask[held] &= ~bit
            self.presence &= ~(1 << i)
        elif int(self.meta[i]) == holder:  # the smallest other holder becomes the first
            j = int(np.flatnonzero(held)[0])
            self.meta[i] = self.xmeta[j]
            self.xmask[j] &= ~bit
        else:
            self.xmask[held & (self.xmeta == np.uint64(holder))] &= ~bit
        self._compact()
        return not self.is_present(i)

    def keep_head(self, run: int) -> tuple[U64Array, U64Array]:
        """The holder table restricted to blocks [0, run) (a branch's copy of a head)."""
        m = self.xmask & np.uint64((1 << run) - 1)
        keep = m != 0
        return self.xmeta[keep].copy(), m[keep]

    def holdings(self) -> int:
        """Block-holder pairs of the present blocks."""
        extra = sum(int(x).bit_count() for x in self.xmask.tolist())
        return self.presence.bit_count() + extra

    def _compact(self) -> None:
        keep = self.xmask != 0
        if not keep.all():
            self.xmeta, self.xmask = self.xmeta[keep], self.xmask[keep]


# segment ids -> their decoded segments (None: missing or corrupt); the mapping returned
# may hold more than was asked for (a batch's whole cache)
Loader = Callable[[Iterable[int]], Mapping[int, "Segment | None"]]


def encode_segment(seg: Segment, k: Kernels | None = None) -> bytes:
    n = seg.nblocks
    if not 1 <= n <= 64:
        raise CorruptData(f"segment {seg.seg_id}: nblocks {n} not in 1..64")
    c = (k or native.pick()).write
    if c is None:
        return _encode_segment(seg)
    out: bytes = c.encode_segment(
        seg.seg_id, seg.window, seg.presence & ((1 << n) - 1), seg.ns_tag,
        as_u64(seg.ids), as_u64(seg.meta), as_u64(seg.xmeta), as_u64(seg.xmask))
    return out


def _encode_segment(seg: Segment) -> bytes:
    """The reference of `encode_segment` (nblocks already checked)."""
    n, h = seg.nblocks, len(seg.xmeta)
    parts = [seg.ids, seg.meta, seg.xmeta, seg.xmask] if h else [seg.ids, seg.meta]
    body = b"".join(np.ascontiguousarray(a, dtype="<u8").tobytes() for a in parts)
    head = HEADER.pack(
        MAGIC, 2 if h else 1, n, 0, seg.seg_id, seg.window,
        seg.presence & ((1 << n) - 1), seg.ns_tag, 0, h,
    )
    crc = zlib.crc32(body, zlib.crc32(head[44:], zlib.crc32(head[:40])))
    return head[:40] + crc.to_bytes(4, "little") + head[44:] + body


def decode_segment(value: bytes, expect_id: int | None = None,
                   k: Kernels | None = None) -> Segment:
    """Parse and check a segment value. Arrays are read-only views of `value`."""
    c = (k or native.pick()).write
    if c is None:
        return _decode_segment(value, expect_id)
    got = c.parse_segment(value)
    if isinstance(got, int):  # a check failed: the reference raises its own error
        _decode_segment(value, expect_id)
        raise CorruptData(f"segment value of {len(value)} B fails check {got}")
    _fmt, n, seg_id, window, presence, tag, h = got
    _check_id(seg_id, expect_id)
    return _segment_of(value, n, seg_id, window, presence, tag, h)


def _check_id(seg_id: int, expect_id: int | None) -> None:
    if expect_id is not None and seg_id != expect_id:
        raise CorruptData(f"segment under key {expect_id} says it is {seg_id}")


_LE_U64 = np.dtype("<u8")


def _segment_of(value: bytes, n: int, seg_id: int, window: int, presence: int, tag: int,
                h: int) -> Segment:
    """The Segment of a checked value: read-only views of its arrays (one view of the
    body, sliced: each numpy call costs more than the slicing)."""
    body = np.frombuffer(value, dtype=_LE_U64, offset=HEADER.size)
    ids = body[: 2 * n].reshape(n, 2)
    meta = body[2 * n : 3 * n]
    if not h:
        return Segment(seg_id, window, presence, tag, ids, meta)
    return Segment(seg_id, window, presence, tag, ids, meta, body[3 * n : 3 * n + h],
                   body[3 * n + h : 3 * n + 2 * h])


def _decode_segment(value: bytes, expect_id: int | None = None) -> Segment:
    """The reference of `decode_segment`: every check, in order."""
    if len(value) < HEADER.size:
        raise CorruptData(f"segment value of {len(value)} bytes is shorter than its header (48)")
    magic, fmt, n, _r, seg_id, window, presence, tag, crc, h = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise CorruptData(f"segment magic {magic!r} is not {MAGIC!r}")
    if fmt not in SEGMENT_FORMATS:
        raise FormatVersionError(
            f"segment {seg_id} has format {fmt}; this build reads formats "
            f"{', '.join(map(str, SEGMENT_FORMATS))}"
        )
    if fmt == 1 and h:
        raise CorruptData(f"segment {seg_id}: format 1 with {h} holder entries")
    if not 1 <= n <= 64 or len(value) != HEADER.size + 24 * n + 16 * h:
        raise CorruptData(f"segment {seg_id}: nblocks {n} and {h} holder entries do not fit "
                          f"a value of {len(value)} B")
    mv = memoryview(value)
    if zlib.crc32(mv[44:], zlib.crc32(mv[:40])) != crc:
        raise CorruptData(f"segment {seg_id}: checksum mismatch")
    _check_id(seg_id, expect_id)
    seg = _segment_of(value, n, seg_id, window, presence, tag, h)
    xmeta, xmask = seg.xmeta, seg.xmask
    if h and (bool((xmask == 0).any()) or bool((xmask & ~np.uint64(presence)).any())
              or (h > 1 and bool((xmeta[1:] <= xmeta[:-1]).any()))):
        raise CorruptData(f"segment {seg_id}: holder table is not ascending, has an empty "
                          "entry or holds an absent block")
    return seg


@dataclass(frozen=True, slots=True)
class Counters:
    next_seg: int = 1
    next_version: int = 1
    blocks: int = 0  # present blocks
    segments: int = 0
    holdings: int = 0  # block-holder pairs of the present blocks

    def encode(self) -> bytes:
        return COUNTERS.pack(self.next_seg, self.next_version, self.blocks, self.segments,
                             self.holdings)

    @staticmethod
    def decode(value: bytes | None) -> Counters:
        if value is None:
            return Counters()
        if len(value) == COUNTERS_V1.size:  # before holders: one holder a block
            seg, version, blocks, segments = COUNTERS_V1.unpack(value)
            return Counters(seg, version, blocks, segments, blocks)
        if len(value) != COUNTERS.size:
            raise CorruptData(f"counters record of {len(value)} B, expected {COUNTERS.size} "
                              f"(or {COUNTERS_V1.size}, before holders)")
        return Counters(*COUNTERS.unpack(value))
