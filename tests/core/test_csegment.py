"""The C segment library (sarpd/core/csrc/segment.c, driven through sarpd/core/_cwrite.c's
seg_ops, delta and apply_delta) against its reference, segment.Segment and
sarpd/core/delta.py: the same random sequences of holder operations return the same
answers and leave the same segment (its encode_segment bytes compared after every
step); delta records are byte-identical to delta.encode_delta, applying one gives
delta.apply_delta's segment, and every damaged record is refused by the check that
refuses it in the reference (one code per check). Covered on purpose: many holders of
one block, holders dropped to none (presence cleared), the first holder dropped (the
smallest other becomes first), tables growing and compacting, 64-block segments,
keep_head, and values the reference accepts but never writes (presence bits past the
blocks, a table entry repeating a block's first holder)."""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarpd.core.delta import HEAD, _encode_delta, apply_delta
from sarpd.core.segment import HEADER, Segment, _decode_segment, _encode_segment
from sarpd.errors import CorruptData, FormatVersionError

try:
    from sarpd.core import _cwrite
except ImportError:  # pragma: no cover: built by `make setup` wherever a compiler is
    pytest.skip("sarpd.core._cwrite is not built", allow_module_level=True)

Op = tuple[Any, ...]
CHECKS = _cwrite.CHECKS
U64 = st.integers(0, 2**64 - 1)
# holders from a small pool too: one holder on many blocks, first holders met again
HOLDER = st.one_of(st.integers(0, 9), st.sampled_from([2**63, 2**64 - 1]), U64)
BLOCKS = st.one_of(st.integers(1, 64), st.sampled_from([1, 2, 63, 64]))
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fix_crc(value: bytes | bytearray, crc_at: int = 40, head: int = 48) -> bytes:
    """`value` with its CRC made right again (a segment value's by default; a delta
    record's: crc_at 24)."""
    v = bytes(value)
    if len(v) < head:
        return v
    crc = zlib.crc32(v[crc_at + 4 :], zlib.crc32(v[:crc_at]))
    return v[:crc_at] + crc.to_bytes(4, "little") + v[crc_at + 4 :]


def value_of(n: int, presence: int, meta: list[int], table: dict[int, int], *,
             seed: int = 0, stray: int = 0, header: tuple[int, int, int] = (7, 3, 99)) -> bytes:
    """A segment value: n blocks of random ids, `table` {holder: mask}, `stray` presence
    bits past the blocks (the value rewritten; the reference accepts it)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    xmeta = sorted(table)
    seg = Segment(header[0], header[1], presence, header[2], ids, np.array(meta, np.uint64),
                  np.array(xmeta, np.uint64), np.array([table[h] for h in xmeta], np.uint64))
    value = _encode_segment(seg)
    if stray:
        p = (presence | stray) & (2**64 - 1)
        value = fix_crc(value[:24] + p.to_bytes(8, "little") + value[32:])
    _decode_segment(value)  # the reference accepts it
    return value


@st.composite
def values(draw: st.DrawFn, max_holders: int = 24) -> bytes:
    """A segment value the reference accepts: 1..64 blocks (1 and 64 often), holes, a
    holder table or none; now and then presence bits past the blocks (and table masks
    holding them) and table entries repeating a block's first holder."""
    n = draw(BLOCKS)
    full = (1 << n) - 1
    presence = draw(st.one_of(st.just(full), st.integers(0, full), st.just(0)))
    stray = 0
    if n < 64 and draw(st.integers(0, 5)) == 0:
        stray = (draw(st.integers(1, 2**64 - 1)) << n) & (2**64 - 1)
    meta = draw(st.lists(HOLDER, min_size=n, max_size=n))
    repeat = draw(st.booleans())  # may an entry repeat a first holder of a block it holds
    table: dict[int, int] = {}
    held = (presence & full) | stray
    if held and draw(st.booleans()):
        for h in draw(st.sets(HOLDER, max_size=max_holders)):
            mask = draw(st.integers(1, 2**64 - 1)) & held
            if not repeat:
                mask &= ~sum(1 << i for i in range(n) if meta[i] == h)
            if mask:
                table[h] = mask
    return value_of(n, presence, meta, table, seed=draw(st.integers(0, 2**32 - 1)),
                    stray=stray, header=(draw(U64), draw(U64), draw(U64)))


def ops_for(n: int) -> st.SearchStrategy[list[Op]]:
    """Random holder operations on a segment of n blocks (adds and drops weighed up)."""
    block = st.integers(0, n - 1)
    add = st.tuples(st.just("add"), block, HOLDER)
    drop = st.tuples(st.just("drop"), block, st.one_of(st.none(), HOLDER))
    one = st.one_of(
        add, add, add, drop, drop,
        st.tuples(st.just("present_run"), st.integers(0, n)),
        st.tuples(st.just("is_present"), st.integers(0, 70)),
        # lo None: the block's own id (when it has one)
        st.tuples(st.just("has_at"), st.integers(0, 70), st.one_of(st.none(), U64), U64),
        st.tuples(st.just("holders_of"), block),
        st.tuples(st.just("holds"), block, HOLDER),
        st.tuples(st.just("keep_head"), st.integers(0, 64)),
        st.just(("holdings",)),
        st.just(("copy",)),
    )
    return st.lists(one, max_size=60)


def with_ids(value: bytes, ops: list[Op]) -> list[Op]:
    """has_at ops whose lo is None get the block's own id (when it exists)."""
    ids = _decode_segment(value).ids.tolist()
    out = []
    for op in ops:
        if op[0] == "has_at" and op[2] is None:
            lo, hi = ids[op[1]] if op[1] < len(ids) else (0, op[3])
            op = ("has_at", op[1], lo, hi)
        out.append(op)
    return out


def run_reference(seg: Segment, op: Op) -> tuple[Segment, object]:
    """One operation on the reference: (the segment after it, its result)."""
    name, *args = op
    if name == "add":
        return seg, seg.add_holder(*args)
    if name == "drop":
        return seg, seg.drop_holder(*args)
    if name == "present_run":
        return seg, seg.present_run(*args)
    if name == "is_present":
        return seg, seg.is_present(*args)
    if name == "has_at":
        return seg, seg.has_at(args[0], [args[1], args[2]])
    if name == "holders_of":
        return seg, seg.holders_of(*args)
    if name == "holds":
        return seg, seg.holds(*args)
    if name == "keep_head":
        xmeta, xmask = seg.keep_head(*args)
        return seg, (xmeta.tolist(), xmask.tolist())
    if name == "holdings":
        return seg, seg.holdings()
    assert name == "copy"
    return seg.writable(), None


def check_ops(value: bytes, ops: list[Op]) -> Segment:
    """Run ops on the C library and on the reference; every answer and every value after
    a step must be the same. Returns the reference's segment at the end."""
    got = _cwrite.seg_ops(value, ops)
    assert not isinstance(got, int), f"the C library refuses the value: check {got}"
    assert len(got) == len(ops)
    seg = _decode_segment(value).writable()
    for k, (op, (result, after)) in enumerate(zip(ops, got, strict=True)):
        seg, want = run_reference(seg, op)
        assert (type(result), result) == (type(want), want), (k, op)
        assert after == _encode_segment(seg), (k, op)
    return seg


@SETTINGS
@given(values(), st.data())
def test_holder_operations_match_the_reference(value: bytes, data: st.DataObject) -> None:
    n = value[5]
    check_ops(value, with_ids(value, data.draw(ops_for(n))))


def test_many_holders_of_one_block_dropped_to_none() -> None:
    full = 2**64 - 1
    value = value_of(64, full, [5] * 64, {})
    rng = random.Random(1)
    holders = rng.sample(range(1, 10**6), 300)
    ops: list[Op] = [("add", 63, h) for h in holders] + [("add", 0, h) for h in holders[:40]]
    ops += [("holders_of", 63), ("holdings",), ("keep_head", 63), ("keep_head", 64)]
    order = [5, *holders]  # the first holder among the first dropped
    rng.shuffle(order)
    for h in order:
        ops += [("drop", 63, h), ("holders_of", 63), ("holds", 63, h), ("present_run", 0)]
    seg = check_ops(value, ops)
    assert not seg.is_present(63) and seg.is_present(0)  # its last holder took presence
    assert len(seg.xmeta) == 40  # block 0's extra holders alone are left


def test_the_first_holder_dropped_makes_the_smallest_other_first() -> None:
    value = value_of(3, 0b111, [50, 50, 50], {})
    ops: list[Op] = [("add", 1, 70), ("add", 1, 60), ("add", 1, 80), ("add", 2, 60),
                     ("drop", 1, 50), ("holders_of", 1), ("drop", 1, 60), ("holders_of", 1),
                     ("drop", 1, 80), ("drop", 1, 70), ("is_present", 1), ("holders_of", 1),
                     ("holders_of", 2), ("drop", 2, None), ("holdings",)]
    got = _cwrite.seg_ops(value, ops)
    assert not isinstance(got, int)
    results = [r for r, _ in got]
    assert results[5] == [60, 70, 80] and results[7] == [70, 80]  # smallest other first
    assert results[9:13] == [True, False, [], [50, 60]]  # the last holder gone: absent
    assert results[13:] == [True, 1]
    check_ops(value, ops)


def test_tables_grow_and_compact_back_to_format_1() -> None:
    value = value_of(64, 2**64 - 1, list(range(64)), {})
    ops: list[Op] = [("add", i, 1000 + (i * 7 + j) % 500) for j in range(8) for i in range(64)]
    ops += [("holdings",), ("copy",), ("keep_head", 0), ("keep_head", 17)]
    ops += [("drop", i, 1000 + (i * 7 + j) % 500) for j in range(8) for i in range(64)]
    ops += [("holdings",)]
    got = _cwrite.seg_ops(value, ops)
    assert not isinstance(got, int)
    assert max(len(v) for _, v in got) > HEADER.size + 24 * 64 + 16 * 400  # hundreds of entries
    assert got[-1] == (64, value)  # every extra holder gone: the format 1 value again
    check_ops(value, ops)


def test_drops_on_a_segment_without_a_table_and_the_last_block() -> None:
    value = value_of(64, (2**64 - 1) ^ (1 << 5), [9] * 64, {})
    ops: list[Op] = [("drop", 63, 8), ("drop", 63, 9), ("present_run", 0), ("present_run", 6),
                     ("present_run", 64), ("drop", 5, None), ("drop", 0, None),
                     ("present_run", 0), ("add", 63, 1), ("add", 62, 1), ("holders_of", 62),
                     ("keep_head", 64), ("keep_head", 62), ("is_present", 63)]
    check_ops(value, ops)


def test_values_with_bits_the_reference_never_writes() -> None:
    # presence bits past the blocks (and a mask holding them), an entry repeating a
    # first holder: accepted by the reference's checks, so answered alike
    value = value_of(4, 0b1011, [1, 2, 3, 4], {1: 0b1001, 5: 0b11 | 1 << 40}, stray=1 << 40)
    ops: list[Op] = [("holdings",), ("holders_of", 0), ("holds", 0, 1), ("drop", 0, 1),
                     ("holders_of", 0), ("drop", 0, 1), ("add", 3, 1), ("is_present", 40),
                     ("keep_head", 64), ("keep_head", 4), ("drop", 1, None), ("holdings",)]
    check_ops(value, ops)


def reference_check(value: bytes) -> int:
    """The code of the check the reference refuses `value` with (0: accepted)."""
    try:
        _decode_segment(value)
    except FormatVersionError:
        return CHECKS["format"]
    except CorruptData as exc:
        for text, name in (("shorter than its header", "short"), ("magic", "magic"),
                           ("format 1 with", "format1_table"), ("do not fit", "size"),
                           ("checksum", "checksum"), ("holder table", "table")):
            if text in exc.message:
                return CHECKS[name]
        raise
    return 0


@SETTINGS
@given(values(max_holders=4), st.data())
def test_decoding_refuses_by_the_references_check(value: bytes, data: st.DataObject) -> None:
    raw = bytearray(value)
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "header", "table"]))
    if how == "flip":
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)):]
    elif how == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=40))
    elif how == "header":  # a field rewritten, the checksum made right: the deeper checks
        raw[data.draw(st.sampled_from([0, 4, 5, 24, 25, 31, 44, 45]))] = data.draw(
            st.integers(0, 255))
    else:  # a table word rewritten (entries: ascending, non-empty, present blocks)
        at = HEADER.size + 24 * raw[5]
        if len(raw) > at:
            word = data.draw(st.integers(0, (len(raw) - at) // 8 - 1))
            raw[at + 8 * word : at + 8 * word + 8] = data.draw(U64).to_bytes(8, "little")
    bad = fix_crc(raw) if how in ("header", "table") else bytes(raw)
    want = reference_check(bad)
    got = _cwrite.seg_ops(bad, [("holdings",)])
    if want:
        assert got == want == _cwrite.parse_segment(bad)
    else:
        check_ops(bad, [("holdings",), ("drop", 0, None), ("add", 0, 3)])


def test_each_table_check_refuses_alike() -> None:
    for xmeta, xmask in (([5, 5], [1, 2]), ([5, 4], [1, 2]), ([5], [0]), ([5], [0b1000]),
                         ([2**64 - 1, 0], [1, 1]), ([1, 2, 2], [1, 1, 1])):
        seg = Segment(3, 0, 0b0111, 1, np.zeros((4, 2), np.uint64), np.zeros(4, np.uint64),
                      np.array(xmeta, np.uint64), np.array(xmask, np.uint64))
        value = _encode_segment(seg)  # the reference writes what it is given
        assert reference_check(value) == CHECKS["table"]
        assert _cwrite.seg_ops(value, []) == CHECKS["table"] == _cwrite.parse_segment(value)


# -- delta records ------------------------------------------------------------------
def reference_apply(value: bytes, record: bytes) -> bytes | int:
    """delta.apply_delta on the reference: the value of its segment, or the code of the
    check that refuses the record (delta_blocks: applied, but past 64 blocks, which is
    no segment: encode_segment refuses it)."""
    try:
        seg = apply_delta(_decode_segment(value), record, "d")
    except CorruptData as exc:
        for text, name in (("shorter than a delta header", "delta_short"),
                           ("not a delta record", "delta_magic"),
                           ("checksum mismatch", "delta_checksum"),
                           ("does not apply", "delta_fit")):
            if text in exc.message:
                return CHECKS[name]
        raise
    if seg.nblocks > 64:
        return CHECKS["delta_blocks"]
    return _encode_segment(seg)


@st.composite
def changes(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(before, after): a segment value and the value of a write's change of it: holder
    operations, blocks appended, presence bits flipped, first holders set, the table
    replaced."""
    before = draw(values(max_holders=6))
    seg = _decode_segment(before).writable()
    n0 = seg.nblocks
    for op in draw(st.lists(st.sampled_from(["add", "drop"]), max_size=12)):
        i = draw(st.integers(0, n0 - 1))
        if op == "add":
            seg.add_holder(i, draw(HOLDER))
        else:
            seg.drop_holder(i, draw(st.one_of(st.none(), HOLDER)))
    n1 = min(64, n0 + draw(st.one_of(st.just(0), st.integers(0, 64))))
    if n1 > n0:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        seg.ids = np.concatenate([seg.ids, rng.integers(0, 2**64, (n1 - n0, 2), np.uint64)])
        seg.meta = np.concatenate([seg.meta, np.array(
            draw(st.lists(HOLDER, min_size=n1 - n0, max_size=n1 - n0)), np.uint64)])
    seg.presence = (seg.presence ^ draw(st.integers(0, 2**64 - 1))) & ((1 << n1) - 1)
    for i in draw(st.lists(st.integers(0, n0 - 1), max_size=5)):
        seg.meta[i] = np.uint64(draw(HOLDER))
    present = seg.presence
    if draw(st.integers(0, 3)) == 0:  # a new table (its masks on present blocks)
        xmeta = sorted(draw(st.sets(HOLDER, max_size=5)))
        masks = [draw(st.integers(1, 2**64 - 1)) & present for _ in xmeta]
        keep = [j for j, m in enumerate(masks) if m]
        seg.xmeta = np.array([xmeta[j] for j in keep], np.uint64)
        seg.xmask = np.array([masks[j] for j in keep], np.uint64)
    else:  # the table kept to present blocks (a flipped presence bit may leave it)
        m = seg.xmask & np.uint64(present)
        seg.xmeta, seg.xmask = seg.xmeta[m != 0], m[m != 0]
    return before, _encode_segment(seg)


@SETTINGS
@given(changes())
def test_delta_records_are_the_references_bytes(change: tuple[bytes, bytes]) -> None:
    before, after = change
    record = _cwrite.delta(before, after)
    assert record == _encode_delta(_decode_segment(before), _decode_segment(after))
    assert _cwrite.apply_delta(before, record) == reference_apply(before, record)
    assert _cwrite.apply_delta(before, record) == after  # the change, exactly
    if after == before:
        assert len(record) == HEAD.size


@SETTINGS
@given(changes(), st.data())
def test_damaged_records_are_refused_by_the_references_check(
        change: tuple[bytes, bytes], data: st.DataObject) -> None:
    before, after = change
    raw = bytearray(_encode_delta(_decode_segment(before), _decode_segment(after)))
    target = before
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "header", "body", "other"]))
    if how == "flip":
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del raw[data.draw(st.integers(0, len(raw) - 1)):]
    elif how == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=40))
    elif how == "header":  # magic, format, n0, n1, flags, presence, meta mask, h
        at = data.draw(st.sampled_from([0, 4, 5, 6, 7, 8, 15, 16, 23, 28, 29]))
        raw[at] = data.draw(st.sampled_from([0, 1, 63, 64, 65, 255, raw[at] ^ 1]))
    elif how == "body" and len(raw) > HEAD.size:  # a word of the body (a table: unchecked)
        word = data.draw(st.integers(0, (len(raw) - HEAD.size) // 8 - 1))
        at = HEAD.size + 8 * word
        raw[at : at + 8] = data.draw(U64).to_bytes(8, "little")
    else:  # the record applied to another segment (wrong n0, or the same n0)
        target = data.draw(values(max_holders=2))
    bad = fix_crc(raw, 24, HEAD.size) if how in ("header", "body") else bytes(raw)
    assert _cwrite.apply_delta(target, bad) == reference_apply(target, bad)


def record(n0: int, n1: int, presence: int, appended: int, *, meta_mask: int = 0,
           metas: int = 0, flags: int = 0, h: int = 0) -> bytes:
    """A hand-made delta record with a right checksum: `appended` blocks' words, `metas`
    new first holders, h table entries (all words 1)."""
    body = b"\1\0\0\0\0\0\0\0" * (3 * appended + metas + 2 * h)
    head = HEAD.pack(b"SRPD", 1, n0, n1, flags, presence, meta_mask, 0, h)
    return fix_crc(head + body, 24, HEAD.size)


def test_every_record_check_has_its_own_code() -> None:
    base = value_of(10, 0b11_1111_1111, list(range(10)), {})
    full64 = value_of(64, 2**64 - 1, [1] * 64, {})
    full63 = value_of(63, 2**63 - 1, [1] * 63, {})
    cases = [
        (base, record(10, 12, 0b1111, 2), None),  # a good one
        (base, record(10, 10, 1, 0, flags=1), None),  # the table cleared
        (base, record(10, 11, 1, 1)[:20], "delta_short"),
        (base, b"SRPX" + record(10, 11, 1, 1)[4:], "delta_magic"),
        (base, fix_crc(record(10, 11, 1, 1)[:4] + b"\2" + record(10, 11, 1, 1)[5:], 24, 32),
         "delta_magic"),
        (base, record(10, 11, 1, 1)[:-1] + b"\7", "delta_checksum"),
        (base, record(9, 11, 1, 2), "delta_fit"),  # wrong n0
        (base, record(10, 9, 1, 0), "delta_fit"),  # shrinks
        (base, record(10, 10, 1 << 10, 0), "delta_fit"),  # presence past n1
        (base, record(10, 10, 1, 0, meta_mask=1 << 10, metas=1), "delta_fit"),  # meta past n0
        (base, record(10, 10, 1, 0, h=1), "delta_fit"),  # a table without its flag
        (base, fix_crc(record(10, 11, 1, 1) + bytes(8), 24, 32), "delta_fit"),  # its size
        (base, record(10, 65, 1, 55), "delta_blocks"),  # past 64 blocks
        (full64, record(64, 64, 2**64 - 1, 0, meta_mask=2**63, metas=1), None),
        (full64, record(64, 65, 1, 1), "delta_blocks"),
        (full63, record(63, 63, 1 << 63, 0), "delta_fit"),  # bit 63 past 63 blocks
        (full63, record(63, 63, 1, 0, meta_mask=1 << 63, metas=1), "delta_fit"),
        (full63, record(63, 64, 1 << 63, 1, meta_mask=1 << 62, metas=1), None),
        (full64, record(64, 200, 0, 136), "delta_blocks"),
    ]
    codes = set()
    for value, rec, name in cases:
        want = reference_apply(value, rec)
        got = _cwrite.apply_delta(value, rec)
        assert got == want, (name, got, want)
        assert (name is None) == isinstance(got, bytes), name
        if name is not None:
            assert got == CHECKS[name]
            codes.add(got)
    assert len(codes) == 5  # one code per check


def test_a_delta_cannot_shrink_or_move_a_segment_as_in_the_reference() -> None:
    big = value_of(8, 0xFF, [1] * 8, {}, header=(5, 3, 9))
    small = value_of(4, 0xF, [1] * 4, {}, header=(5, 3, 9))
    moved = value_of(8, 0xFF, [1] * 8, {}, header=(5, 4, 9))
    retagged = value_of(8, 0xFF, [1] * 8, {}, header=(5, 3, 8))
    for before, after in ((big, small), (big, moved), (big, retagged)):
        with pytest.raises(ValueError) as ref:
            _encode_delta(_decode_segment(before), _decode_segment(after))
        with pytest.raises(ValueError) as got:
            _cwrite.delta(before, after)
        assert str(got.value) == str(ref.value)
        with pytest.raises(ValueError) as got:
            _cwrite.encode_delta(_decode_segment(before), _decode_segment(after))
        assert str(got.value) == str(ref.value)


@SETTINGS
@given(changes())
def test_encode_delta_of_segment_objects_is_the_references(change: tuple[bytes, bytes]) -> None:
    """The writer's form (Segment objects: read-only views as decoded, or writable
    copies) writes the reference's bytes."""
    before, after = (_decode_segment(v) for v in change)
    assert _cwrite.encode_delta(before, after) == _encode_delta(before, after)
    assert _cwrite.encode_delta(before.writable(), after.writable()) == \
        _encode_delta(before, after)


def test_bad_arguments_are_refused() -> None:
    value = value_of(2, 0b11, [1, 2], {})
    assert _cwrite.seg_ops(value, []) == []
    assert _cwrite.seg_ops(value[:-1], []) == CHECKS["size"]
    cases: list[tuple[Any, type[Exception], str]] = [
        ([("add", 2, 1)], ValueError, r"block 2 not in 0\.\.1"),
        ([("present_run", 3)], ValueError, r"block 3 not in 0\.\.2"),
        ([("keep_head", 65)], ValueError, r"block 65 not in 0\.\.64"),
        ([("add", -1, 1)], ValueError, "block -1"),
        ([("add", 0, -1)], OverflowError, "holder"),
        ([("has_at", 0, 2**64, 0)], OverflowError, "lo"),
        ([("add", 0)], ValueError, "not an operation"),
        ([("fly", 0)], ValueError, "not an operation"),
        ([["add", 0, 1]], TypeError, "must be a tuple"),
    ]
    for ops, exc, text in cases:
        with pytest.raises(exc, match=text):
            _cwrite.seg_ops(value, ops)
    with pytest.raises(TypeError, match="ops must be a sequence"):
        _cwrite.seg_ops(value, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value must be bytes"):
        _cwrite.seg_ops(5, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="before: the segment value fails check 5"):
        _cwrite.delta(value[:-1], value)
    with pytest.raises(ValueError, match="value: the segment value fails check 1"):
        _cwrite.apply_delta(b"", b"")
    with pytest.raises(TypeError, match="record must be bytes"):
        _cwrite.apply_delta(value, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="2 arguments"):
        _cwrite.delta(value)  # type: ignore[call-arg]
