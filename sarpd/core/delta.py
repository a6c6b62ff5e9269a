"""Delta records: a small change of a segment written as itself, not as the segment
again (issue 24). A segment is its value under ``S<sid>`` (sarpd/core/segment.py)
followed by its delta records, applied in order; folding writes the merged value back
under ``S<sid>`` and deletes the records, in one write batch, so that at every point
the backend holds the segment as base + deltas.

Key: b"D" + u64 seg id (BE) + u32 record number (BE), numbered from 0 after each fold.

Value, little-endian:

    off  size  field
    0    4     magic b"SRPD"
    4    1     format (1)
    5    1     n0: blocks before the change (the segment it applies to has n0)
    6    1     n1: blocks after it (n1 >= n0: appended blocks n0..n1-1)
    7    1     flags: bit 0 = the holder table follows (it changed)
    8    8     presence mask after the change
    16   8     meta mask: bit i set <=> block i (< n0) has a new first holder
    24   4     CRC-32 of bytes [0, 24) followed by [28, end)
    28   4     h: holder table entries (0 without flag bit 0)
    32   16a   appended block ids (a = n1 - n0)
    +    8a    appended blocks' first holders
    +    8m    the new first holders of the meta mask's blocks, ascending (m: its bits)
    +    8h    holder table after the change: metadata words, then 8h: their masks

A record that fails a check is CorruptData: the segment it belongs to is not served
(as a bad segment value is not).

`encode_delta` has a C twin (sarpd/core/_cwrite.c, native path "write", on the
segment library's `seg_encode_delta`); `_encode_delta` is its reference.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

import numpy as np

from sarpd.core import native
from sarpd.core.native import Kernels
from sarpd.core.segment import Segment
from sarpd.errors import CorruptData

__all__ = ["DELTA_PREFIX", "Records", "apply_delta", "by_segment", "delta_key", "delta_key_id",
           "encode_delta", "merge"]

DELTA_PREFIX = b"D"
MAGIC = b"SRPD"
FORMAT = 1
HEAD = struct.Struct("<4sBBBBQQII")
assert HEAD.size == 32
KEY = struct.Struct(">QI")


Records = dict[int, list[tuple[int, bytes]]]  # seg id -> [(record number, value)], in order


def by_segment(items: Iterable[tuple[bytes, bytes]]) -> Records:
    """Delta records as a key-order scan of the D prefix gives them, by segment."""
    out: Records = {}
    for key, value in items:
        sid, k = delta_key_id(key)
        out.setdefault(sid, []).append((k, value))
    return out


def merge(seg: Segment, records: list[tuple[int, bytes]]) -> Segment:
    """`seg` (its base value) with its records applied in turn: CorruptData when one is
    missing (they are numbered from 0) or fails its checks."""
    for i, (k, value) in enumerate(records):
        if k != i:
            raise CorruptData(f"delta record {i} missing (found {k})")
        seg = apply_delta(seg, value, f"delta record {k}")
    return seg


def delta_key(seg_id: int, k: int) -> bytes:
    return DELTA_PREFIX + KEY.pack(seg_id, k)


def delta_key_id(key: bytes) -> tuple[int, int]:
    """(seg id, record number) of a delta key."""
    if len(key) != 1 + KEY.size or key[:1] != DELTA_PREFIX:
        raise CorruptData(f"delta key {key.hex()}: not b'D' + seg id + record number")
    sid, k = KEY.unpack_from(key, 1)
    return int(sid), int(k)


def _bits(mask: int) -> list[int]:
    return [i for i in range(64) if (mask >> i) & 1]


def encode_delta(before: Segment, after: Segment, k: Kernels | None = None) -> bytes:
    """The record that turns `before` into `after` (the same segment, grown or with
    presence, first holders or holder table changed; never shrunk), by the kernels `k`
    (None: the process default): the write kernel's `encode_delta`, else
    `_encode_delta`."""
    c = (k or native.pick()).write
    if c is not None:
        out: bytes = c.encode_delta(before, after)
        return out
    return _encode_delta(before, after)


def _encode_delta(before: Segment, after: Segment) -> bytes:
    """The reference of `encode_delta`."""
    n0, n1 = before.nblocks, after.nblocks
    if n1 < n0 or after.window != before.window or after.ns_tag != before.ns_tag:
        raise ValueError(f"segment {after.seg_id}: a delta cannot shrink it or move it")
    changed = np.flatnonzero(before.meta != after.meta[:n0]).tolist()
    meta_mask = sum(1 << i for i in changed)
    table = not (np.array_equal(before.xmeta, after.xmeta)
                 and np.array_equal(before.xmask, after.xmask))
    h = len(after.xmeta) if table else 0
    body = b"".join((
        np.ascontiguousarray(after.ids[n0:], dtype="<u8").tobytes(),
        np.ascontiguousarray(after.meta[n0:], dtype="<u8").tobytes(),
        np.ascontiguousarray(after.meta[changed], dtype="<u8").tobytes(),
        np.ascontiguousarray(after.xmeta, dtype="<u8").tobytes() if table else b"",
        np.ascontiguousarray(after.xmask, dtype="<u8").tobytes() if table else b"",
    ))
    head = HEAD.pack(MAGIC, FORMAT, n0, n1, int(table), after.presence, meta_mask, 0, h)
    crc = zlib.crc32(body, zlib.crc32(head[28:], zlib.crc32(head[:24])))
    return head[:24] + crc.to_bytes(4, "little") + head[28:] + body


def apply_delta(seg: Segment, value: bytes, where: str) -> Segment:
    """`seg` with the record `value` applied (a new Segment; `where` names the record
    in errors)."""
    if len(value) < HEAD.size:
        raise CorruptData(f"{where}: {len(value)} bytes is shorter than a delta header")
    magic, fmt, n0, n1, flags, presence, meta_mask, crc, h = HEAD.unpack_from(value)
    if magic != MAGIC or fmt != FORMAT:
        raise CorruptData(f"{where}: not a delta record of format {FORMAT} "
                          f"(magic {magic!r}, format {fmt})")
    if zlib.crc32(value[28:], zlib.crc32(value[:24])) != crc:
        raise CorruptData(f"{where}: checksum mismatch")
    a, m = n1 - n0, len(_bits(meta_mask))
    if n0 != seg.nblocks or a < 0 or meta_mask >> n0 or presence >> n1 or \
            len(value) != HEAD.size + 24 * a + 8 * m + 16 * h or (h and not flags & 1):
        raise CorruptData(f"{where}: does not apply to a segment of {seg.nblocks} blocks "
                          f"(record of {n0} -> {n1} blocks, {len(value)} bytes)")
    u64 = np.frombuffer(value, dtype="<u8", offset=HEAD.size).astype(np.uint64)
    ids = np.concatenate([seg.ids, u64[: 2 * a].reshape(a, 2)])
    meta = np.concatenate([seg.meta, u64[2 * a : 3 * a]])
    meta[_bits(meta_mask)] = u64[3 * a : 3 * a + m]
    xmeta, xmask = (u64[3 * a + m : 3 * a + m + h], u64[3 * a + m + h :]) if flags & 1 \
        else (seg.xmeta, seg.xmask)
    return Segment(seg.seg_id, seg.window, presence, seg.ns_tag, ids, meta,
                   np.array(xmeta, dtype=np.uint64), np.array(xmask, dtype=np.uint64))
