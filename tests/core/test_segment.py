"""Segments and the other backend records (sarpd/core/segment.py): the byte layout,
the round trip, each field check, presence arithmetic, keys and counters."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.ids import id_bytes
from sarpd.core.segment import (
    COUNTERS_KEY,
    HEADER,
    LOCATOR,
    LOCATOR_DTYPE,
    MAGIC,
    MANIFEST_KEY,
    SEGMENT_FORMAT,
    Counters,
    Segment,
    block_key,
    block_keys,
    decode_segment,
    encode_segment,
    log_key,
    ns_count_key,
    seg_id_of_key,
    seg_key,
)
from sarpd.errors import CorruptData, FormatVersionError


def segment(n: int = 5, sid: int = 7, presence: int | None = None) -> Segment:
    rng = np.random.default_rng(n)
    return Segment(sid, 3, (1 << n) - 1 if presence is None else presence, 0xABCDEF,
                   rng.integers(0, 2**63, (n, 2)).astype(np.uint64),
                   rng.integers(0, 2**63, n).astype(np.uint64))


def recrc(value: bytearray) -> bytes:
    """The value with its CRC recomputed (a change the checksum does not catch)."""
    crc = zlib.crc32(bytes(value[44:]), zlib.crc32(bytes(value[:40])))
    struct.pack_into("<I", value, 40, crc)
    return bytes(value)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 64), presence=st.integers(0, 2**64 - 1), sid=st.integers(1, 2**63))
def test_round_trip(n: int, presence: int, sid: int) -> None:
    seg = segment(n, sid, presence)
    value = encode_segment(seg)
    assert len(value) == 48 + 24 * n
    back = decode_segment(value, sid)
    assert (back.seg_id, back.window, back.ns_tag) == (sid, 3, 0xABCDEF)
    assert back.presence == presence & ((1 << n) - 1)  # bits past nblocks are dropped
    assert (back.ids == seg.ids).all() and (back.meta == seg.meta).all()


def test_the_header_is_the_documented_table() -> None:
    seg = segment(2, 9)
    value = encode_segment(seg)
    magic, fmt, n, r1, sid, window, presence, tag, crc, r2 = HEADER.unpack_from(value)
    assert (magic, fmt, n, r1, r2) == (MAGIC, 1, 2, 0, 0)  # no holder table: format 1
    assert (sid, window, presence, tag) == (9, 3, 3, 0xABCDEF)
    assert crc == zlib.crc32(value[44:], zlib.crc32(value[:40]))
    assert value[48:64] == np.ascontiguousarray(seg.ids[0], "<u8").tobytes()
    assert value[80:88] == np.ascontiguousarray(seg.meta[0:1], "<u8").tobytes()


def test_each_field_check() -> None:
    good = encode_segment(segment(4, 11))
    with pytest.raises(CorruptData, match="shorter than its header"):
        decode_segment(good[:47])
    bad = bytearray(good)
    bad[:4] = b"XXXX"
    with pytest.raises(CorruptData, match="magic"):
        decode_segment(recrc(bad))
    bad = bytearray(good)
    bad[4] = SEGMENT_FORMAT + 1
    with pytest.raises(FormatVersionError, match=f"segment 11 has format {SEGMENT_FORMAT + 1}"):
        decode_segment(recrc(bad))
    bad = bytearray(good)
    bad[5] = 0
    with pytest.raises(CorruptData, match="nblocks 0 and 0 holder entries do not fit"):
        decode_segment(recrc(bad))
    with pytest.raises(CorruptData,
                       match="nblocks 4 and 0 holder entries do not fit a value of 100 B"):
        decode_segment(good[:100])
    bad = bytearray(good)
    bad[-1] ^= 1  # a metadata byte
    with pytest.raises(CorruptData, match="segment 11: checksum mismatch"):
        decode_segment(bytes(bad))
    with pytest.raises(CorruptData, match="under key 12 says it is 11"):
        decode_segment(good, 12)
    with pytest.raises(CorruptData, match=r"nblocks 65 not in 1\.\.64"):
        encode_segment(segment(65))


def test_decoded_arrays_are_views_and_writable_copies_are_not() -> None:
    seg = decode_segment(encode_segment(segment(3)))
    assert not seg.ids.flags.writeable
    w = seg.writable()
    w.meta[0] = 1
    w.ids[0, 0] = 2
    assert w.meta[0] == 1 and seg.meta[0] != 1 and seg.ids[0, 0] != 2


def test_presence_runs() -> None:
    seg = segment(6, presence=0b110111)
    assert seg.nblocks == 6
    assert seg.present_run(0) == 3 and seg.present_run(3) == 0 and seg.present_run(4) == 2
    assert seg.is_present(0) and not seg.is_present(3)
    assert segment(6).present_run(0) == 6


def test_keys_sort_numerically_and_round_trip() -> None:
    assert seg_key(1) < seg_key(255) < seg_key(256) < seg_key(2**40)
    assert seg_id_of_key(seg_key(2**40 + 3)) == 2**40 + 3
    assert log_key(2) < log_key(2**32) and log_key(1)[:1] == b"L"
    assert block_key(b"\x01" * 16) == b"B" + b"\x01" * 16
    assert ns_count_key(5) == b"C" + (5).to_bytes(8, "little")
    assert (MANIFEST_KEY, COUNTERS_KEY) == (b"M", b"N")
    prefixes = {seg_key(1)[:1], log_key(1)[:1], block_key(b"\0" * 16)[:1], ns_count_key(1)[:1],
                MANIFEST_KEY, COUNTERS_KEY}
    assert len(prefixes) == 6  # one key space each


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=20))
def test_block_keys_agree_with_block_key(rows: list[tuple[int, int]]) -> None:
    """The vectorised locator keys are the scalar ones, row by row: prefix, then the
    id's 16 bytes little-endian."""
    ids = np.array(rows, dtype=np.uint64).reshape(-1, 2)
    keys = block_keys(ids)
    assert keys == [block_key(id_bytes(r)) for r in ids]
    assert keys == [b"B" + lo.to_bytes(8, "little") + hi.to_bytes(8, "little")
                    for lo, hi in rows]


def test_locator_values_packed_both_ways_agree() -> None:
    vals = np.array([(2**64 - 1, 7), (5, 2**32 - 1)], dtype=LOCATOR_DTYPE)
    assert [v.tobytes() for v in vals] == [LOCATOR.pack(2**64 - 1, 7), LOCATOR.pack(5, 2**32 - 1)]


def test_counters_round_trip_and_size_check() -> None:
    assert Counters.decode(None) == Counters(1, 1, 0, 0)
    c = Counters(9, 20, 300, 4, 310)
    assert Counters.decode(c.encode()) == c and len(c.encode()) == 40
    with pytest.raises(CorruptData, match="counters record of 31 B, expected 40"):
        Counters.decode(c.encode()[:31])
    # a record from before holders: one holder a block
    assert Counters.decode(c.encode()[:32]) == Counters(9, 20, 300, 4, 300)


# -- holders (format 2) ----------------------------------------------------------------
def held(seg: Segment) -> list[set[int]]:
    return [set(seg.holders_of(i)) for i in range(seg.nblocks)]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(0, 5)),
                    max_size=60))
def test_holders_follow_a_model(ops: list[tuple[bool, int, int]]) -> None:
    """add_holder / drop_holder against sets per block; the table survives a round trip
    in format 2, and a segment left with one holder a block is format 1 again."""
    seg = segment(8).writable()
    seg.meta[:] = 100
    model = [{100} for _ in range(8)]
    for add, i, h in ops:
        holder = None if (not add and h == 5) else 100 + h
        if add:
            assert seg.add_holder(i, 100 + h) == (bool(model[i]) and 100 + h not in model[i])
            if model[i]:
                model[i].add(100 + h)
        else:
            gone = seg.drop_holder(i, holder)
            before = bool(model[i])
            model[i] = set() if holder is None else model[i] - {holder}
            assert gone == (before and not model[i])
        assert held(seg) == model
        assert seg.holdings() == sum(len(m) for m in model)
        value = encode_segment(seg)
        assert value[4] == (2 if len(seg.xmeta) else 1)
        assert held(decode_segment(value, seg.seg_id)) == model


def test_a_refilled_hole_is_its_new_holders_and_a_copy_keeps_the_head() -> None:
    seg = segment(4).writable()
    seg.meta[:] = 1
    assert seg.add_holder(2, 9) and seg.add_holder(3, 9)
    assert seg.drop_holder(2, 1) is False and seg.holders_of(2) == [9]  # 9 promoted
    assert seg.drop_holder(2, None) and seg.holders_of(2) == []
    xmeta, xmask = seg.keep_head(3)  # blocks 0..2: 9 held only block 3 (and 2, gone)
    assert xmeta.tolist() == [] and xmask.tolist() == []
    assert seg.keep_head(4)[0].tolist() == [9]


def test_a_bad_holder_table_is_corrupt() -> None:
    seg = segment(4).writable()
    seg.add_holder(1, 5)
    seg.add_holder(2, 3)
    value = bytearray(encode_segment(seg))
    off = 48 + 24 * 4
    assert struct.unpack_from("<QQ", value, off) == (3, 5)  # ascending
    swapped = bytearray(value)
    struct.pack_into("<QQ", swapped, off, 5, 3)
    with pytest.raises(CorruptData, match="holder table"):
        decode_segment(recrc(swapped))
    empty = bytearray(value)
    struct.pack_into("<Q", empty, off + 16, 0)
    with pytest.raises(CorruptData, match="holder table"):
        decode_segment(recrc(empty))
    one = bytearray(value)
    one[4] = 1
    with pytest.raises(CorruptData, match="format 1 with 2 holder entries"):
        decode_segment(recrc(one))
