"""Fuzz sarpd/core/_cwrite.c against its references in sarpd/core/segment.py and
sarpd/core/routing.py:

- `encode_segment` is `_encode_segment` byte for byte for every valid segment (1..64
  blocks, holder tables of any size, edge values of every header field) and refuses
  what is no segment (0 or 65+ blocks, metas or holder masks of another length,
  fields outside uint64) with a clean exception;
- `parse_segment` passes exactly the values `_decode_segment` accepts, with their
  header fields, and for any other value names the check that `_decode_segment`
  fails (values encoded, then mutated: a flipped bit, a header field rewritten with
  or without a fixed checksum, truncated, extended; or random bytes);
- `block_keys` is `_block_keys`;
- `filters` is `filters_at(fingerprints(ids))` for offsets 0..64;
and every entry point refuses hostile arrays (another dtype, byte order, shape or
memory order, no buffer) with a clean exception."""

from __future__ import annotations

import struct
import sys
import zlib

import numpy as np
import pytest

from sarpd.core import segment
from sarpd.core.routing import filters_at, fingerprints
from sarpd.core.segment import Segment
from sarpd.errors import CorruptData, FormatVersionError
from tests.fuzz._common import (
    U64,
    Source,
    clean,
    extension,
    outcome,
    refused,
    replay,
    u64_form,
)

C = extension("write")

# _cwrite.c's check codes, by the reference's error for the same value
SHORT, MAGIC, FORMAT, FORMAT1_TABLE, SIZE, CHECKSUM, TABLE = range(1, 8)
REF_CODES = (("shorter than its header", SHORT), ("magic", MAGIC), ("has format", FORMAT),
             ("format 1 with", FORMAT1_TABLE), ("do not fit", SIZE), ("checksum", CHECKSUM),
             ("holder table", TABLE))


NOT_U64 = (-1, -(2**63), 2**64, 2**70, -(2**70), 3.0, None, "3", b"3", np.int64(3))


def _segment(src: Source) -> Segment:
    """A segment: valid, mostly (holder tables ascending, masks within presence)."""
    n = src.integer(1, 64) if src.chance(90) else src.pick([1, 63, 64])
    presence = src.u64() & ((1 << n) - 1) if src.chance(70) else (1 << n) - 1
    seg_ids = src.u64s((n, 2), pool=src.pick([0, 2]))
    meta = src.u64s(n)
    h = src.pick([0, 0, 0, 1, 2, 5])
    xmeta = np.unique(src.u64s(h))
    masks = [src.u64() & presence for _ in xmeta] if presence else []
    xmeta = xmeta[: len(masks)]
    keep = [i for i, m in enumerate(masks) if m]
    xmask = np.array([masks[i] for i in keep], np.uint64)
    return Segment(src.u64(), src.u64(), presence, src.u64(), seg_ids, meta, xmeta[keep],
                   xmask)


def _encode_args(seg: Segment) -> list[object]:
    n = seg.nblocks
    return [seg.seg_id, seg.window, seg.presence & ((1 << n) - 1), seg.ns_tag,
            segment.as_u64(seg.ids), segment.as_u64(seg.meta), segment.as_u64(seg.xmeta),
            segment.as_u64(seg.xmask)]


def _check_encode(src: Source) -> None:
    assert C is not None
    seg = _segment(src)
    args = _encode_args(seg)
    valid = True
    k = src.integer(0, 9)
    if k == 5:  # an array in another form
        at = src.integer(4, 7)
        args[at], valid = u64_form(src, args[at])  # type: ignore[arg-type]
    elif k == 6:  # no segment: blocks 0 or 65+, metas or masks of another length
        bad = src.integer(0, 3)
        if bad == 0:
            args[4] = src.pick([np.zeros((0, 2), np.uint64), np.zeros((65, 2), np.uint64),
                                np.zeros((n := seg.nblocks, 3), np.uint64),
                                np.zeros(2 * n, np.uint64)])
        elif bad == 1:
            args[5] = np.zeros(seg.nblocks + src.pick([-1, 1]), np.uint64)
        else:
            args[6 + bad - 2] = np.zeros(len(seg.xmeta) + 1, np.uint64)
        valid = False
    elif k == 7:  # a field outside uint64, or no int
        args[src.integer(0, 3)] = src.pick(NOT_U64)
        valid = False
    elif k == 8:
        refused(outcome(lambda: C.encode_segment(*args[: src.integer(0, 7)]))[1],
                "encode_segment(argc)")
        return
    got, err = outcome(lambda: C.encode_segment(*args))
    if not valid:
        refused(err, "encode_segment")
        return
    assert err is None, f"encode_segment refused a valid segment: {err!r}"
    want = segment._encode_segment(seg)
    assert got == want, "encode_segment: not the reference's bytes"
    _check_decode(got)


def _fix_crc(v: bytearray) -> None:
    if len(v) >= 48:
        v[40:44] = zlib.crc32(bytes(v[44:]), zlib.crc32(bytes(v[:40]))).to_bytes(4, "little")


def _mutated(src: Source) -> bytes:
    """A value near a valid one: the checks past the checksum are reached too."""
    v = bytearray(segment._encode_segment(_segment(src)))
    for _ in range(src.integer(1, 3)):
        k = src.integer(0, 6)
        if k == 0 and v:
            v[src.integer(0, len(v) - 1)] ^= 1 << src.integer(0, 7)
        elif k == 1 and len(v) > 5:  # format, nblocks
            v[src.pick([4, 5])] = src.pick([0, 1, 2, 3, 63, 64, 65, 255])
        elif k == 2:  # h
            v[44:48] = src.pick([0, 1, 2, 2**31, 2**32 - 1]).to_bytes(4, "little")
        elif k == 3:
            del v[src.integer(0, len(v)) :]
        elif k == 4:
            v += src.raw(src.pick([1, 8, 16, 24]))
        elif k == 5 and len(v) >= 48:  # a holder table entry: an absent block, an
            n, h = v[5], int.from_bytes(v[44:48], "little")
            if h and len(v) >= 48 + 24 * n + 16 * h:  # empty mask, disorder
                at = 48 + 24 * n + 8 * h * src.integer(0, 1) + 8 * src.integer(0, h - 1)
                v[at : at + 8] = src.u64().to_bytes(8, "little")
        else:
            v[:4] = src.pick([b"SRPS", b"SRPT", b"\0\0\0\0"])
        if src.chance(70):
            _fix_crc(v)
    return bytes(v)


def _check_decode(value: bytes | bytearray | memoryview) -> None:
    assert C is not None
    got, err = outcome(lambda: C.parse_segment(value))
    assert err is None, f"parse_segment raised {err!r}"
    seg, ref_err = outcome(lambda: segment._decode_segment(bytes(value)))
    if ref_err is not None:
        if not isinstance(ref_err, CorruptData | FormatVersionError):
            raise AssertionError(f"the reference raised {ref_err!r}") from ref_err
        code = next(c for words, c in REF_CODES if words in str(ref_err))
        assert got == code, f"parse_segment: {got}, reference fails check {code}: {ref_err}"
        return
    assert seg is not None
    want = (bytes(value)[4], seg.nblocks, seg.seg_id, seg.window, seg.presence, seg.ns_tag,
            len(seg.xmeta))
    assert got == want, f"parse_segment: {got}, reference {want}"


def _check_parse(src: Source) -> None:
    assert C is not None
    k = src.integer(0, 9)
    if k <= 6:
        value = _mutated(src)
    elif k == 7:
        value = src.raw(src.pick([0, 1, 47, 48, 72, 96, 200]))
    else:  # random fields and body, a size that fits them, a valid checksum
        made = bytearray(src.raw(48))
        made[:6] = b"SRPS" + bytes([src.integer(1, 2), src.integer(0, 65)])
        made += src.raw(24 * made[5] + 16 * src.pick([0, 1, 3]))
        made[44:48] = src.pick([0, 1, 3]).to_bytes(4, "little")
        _fix_crc(made)
        value = bytes(made)
    form = src.integer(0, 4)
    if form == 3:
        _check_decode(bytearray(value))
    elif form == 4:
        _check_decode(memoryview(value))
    else:
        _check_decode(value)
    if src.chance(5):
        bad = src.pick([None, 5, "SRPS", memoryview(bytes(200))[::2]])
        refused(outcome(lambda: C.parse_segment(bad))[1], "parse_segment(no bytes)")


def _ids(src: Source) -> U64:
    return src.u64s((src.integer(0, 70), 2), pool=src.pick([0, 0, 1, 3]))


def _check_keys(src: Source) -> None:
    assert C is not None
    arr = _ids(src)
    obj, ok = u64_form(src, arr)
    if src.chance(5):
        obj, ok = src.pick([arr.reshape(-1), np.zeros((3, 3), np.uint64)]), False
    got, err = outcome(lambda: C.block_keys(obj))
    if not ok:
        refused(err, "block_keys")
        return
    assert err is None, f"block_keys refused valid ids: {err!r}"
    assert got == segment._block_keys(arr), "block_keys: not the reference's keys"


def _check_filters(src: Source) -> None:
    assert C is not None
    arr = _ids(src)
    obj, ok = u64_form(src, arr)
    offsets: list[object] = [src.integer(0, 64) for _ in range(src.integer(0, 6))]
    if src.chance(15):
        offsets.insert(src.integer(0, len(offsets)),
                       src.pick([-1, 65, 2**63, 2**64, 2**70, None, "1", 1.0, np.int64(1)]))
        ok = False
    as_seq = src.pick([list, tuple])
    got, err = outcome(lambda: C.filters(obj, as_seq(offsets)))
    if not ok:
        refused(err, "filters")
        return
    assert err is None, f"filters refused valid arguments: {err!r}"
    fp = fingerprints(arr, max(len(arr), 64))
    want = filters_at(fp, np.array(offsets, np.int64)).tolist() if offsets else []
    assert got == want, f"filters: {got}, reference {want}"


def one_input(data: bytes) -> None:
    if C is None:
        return
    src = Source(data)
    check = src.pick([_check_encode, _check_parse, _check_parse, _check_keys, _check_filters])
    check(src)
    clean(None, "")


@pytest.mark.skipif(C is None, reason="the C codecs are not built")
def test_replay() -> None:
    replay(one_input, seed=3, runs=1500, max_len=1500)


def test_the_check_codes_are_the_reference_errors() -> None:
    """REF_CODES names each check by the reference's text: a header alone fails SIZE."""
    head = struct.pack("<4sBBHQQQQII", b"SRPS", 1, 1, 0, 0, 0, 0, 0, 0, 0)
    err = outcome(lambda: segment._decode_segment(head))[1]
    assert isinstance(err, CorruptData) and "do not fit" in str(err)


if __name__ == "__main__":
    from tests.fuzz._common import fuzz

    fuzz(one_input, sys.argv)
