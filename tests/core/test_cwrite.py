"""The write path's C codecs (sarpd/core/_cwrite.c) against their references in
sarpd/core/segment.py and sarpd/core/writer.py: byte-equal values, the same
accept/refuse decision and fields on random and adversarial values (1 and 64 blocks,
holes, format 1 and 2, 1,024 holders on a block, damaged and random bytes), the
locator records, the dispatch, and the argument checks."""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import native
from sarpd.core.router import segment_filters
from sarpd.core.routing import filters_at, fingerprints
from sarpd.core.segment import (
    LOCATOR,
    Segment,
    _block_keys,
    _decode_segment,
    _encode_segment,
    block_key,
    block_keys,
    decode_segment,
    encode_segment,
    locator_records,
)
from sarpd.errors import CorruptData, FormatVersionError


def _cw() -> ModuleType | None:
    try:
        return importlib.import_module("sarpd.core._cwrite")
    except ImportError:
        return None


CW = _cw()
pytestmark = pytest.mark.skipif(CW is None, reason="sarpd.core._cwrite is not built")
U64 = st.integers(0, 2**64 - 1)
# ids from a small pool too: duplicates and ties are as likely as distinct ids
WORD = st.one_of(U64, st.sampled_from([0, 1, 2**63, 2**64 - 1]))


@st.composite
def segments(draw: st.DrawFn, max_holders: int = 40) -> Segment:
    n = draw(st.integers(1, 64))
    ids = np.array(draw(st.lists(st.tuples(WORD, WORD), min_size=n, max_size=n)),
                   dtype=np.uint64).reshape(n, 2)
    meta = np.array(draw(st.lists(WORD, min_size=n, max_size=n)), dtype=np.uint64)
    presence = draw(st.one_of(st.integers(0, (1 << n) - 1), st.just((1 << n) - 1), U64))
    present = presence & ((1 << n) - 1)
    xmeta: list[int] = []
    xmask: list[int] = []
    if present and draw(st.booleans()):  # format 2: a holder table
        holders = sorted(draw(st.sets(U64, min_size=1, max_size=max_holders)))
        for h in holders:
            m = draw(st.integers(1, 2**64 - 1)) & present
            if m:
                xmeta.append(h)
                xmask.append(m)
    return Segment(draw(U64), draw(U64), presence, draw(U64), ids, meta,
                   np.array(xmeta, dtype=np.uint64), np.array(xmask, dtype=np.uint64))


def _same(a: Segment, b: Segment) -> None:
    assert (a.seg_id, a.window, a.presence, a.ns_tag) == (b.seg_id, b.window, b.presence, b.ns_tag)
    for x, y in ((a.ids, b.ids), (a.meta, b.meta), (a.xmeta, b.xmeta), (a.xmask, b.xmask)):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def _reference_outcome(value: bytes) -> Segment | tuple[type, str]:
    try:
        return _decode_segment(value)
    except (CorruptData, FormatVersionError) as exc:
        return type(exc), exc.message


def _native_outcome(value: bytes) -> Segment | tuple[type, str]:
    try:
        return decode_segment(value)
    except (CorruptData, FormatVersionError) as exc:
        return type(exc), exc.message


@settings(max_examples=300, deadline=None)
@given(segments())
def test_encode_is_byte_equal_and_round_trips(seg: Segment) -> None:
    assert CW is not None
    n = seg.nblocks
    value = CW.encode_segment(seg.seg_id, seg.window, seg.presence & ((1 << n) - 1),
                              seg.ns_tag, seg.ids, seg.meta, seg.xmeta, seg.xmask)
    assert value == _encode_segment(seg)
    assert value[4] == (2 if len(seg.xmeta) else 1)  # format 1 without a holder table
    fields = CW.parse_segment(value)
    assert fields == (value[4], n, seg.seg_id, seg.window, seg.presence & ((1 << n) - 1),
                      seg.ns_tag, len(seg.xmeta))
    _same(decode_segment(value, seg.seg_id), _decode_segment(value, seg.seg_id))


def test_many_holders_on_one_block_and_the_extremes() -> None:
    ids = np.arange(128, dtype=np.uint64).reshape(64, 2)
    top = 2**64 - 1
    full = Segment(top, top, top, top, ids, np.full(64, top, np.uint64))
    one = Segment(0, 0, 0, 0, ids[:1].copy(), np.zeros(1, np.uint64))
    holes = Segment(5, 1, 0b1010_0101, 9, ids[:8].copy(), np.arange(8, dtype=np.uint64),
                    np.array([3, 7], np.uint64), np.array([0b101, 0b1000_0000], np.uint64))
    crowd = Segment(9, 2, 0b11, 4, ids[:2].copy(), np.array([1, 1], np.uint64),
                    np.arange(2, 1026, dtype=np.uint64), np.full(1024, 0b01, np.uint64))
    for seg in (full, one, holes, crowd):
        value = encode_segment(seg)
        assert value == _encode_segment(seg)
        _same(decode_segment(value), _decode_segment(value))
    assert len(decode_segment(encode_segment(crowd)).holders_of(0)) == 1025


@settings(max_examples=400, deadline=None)
@given(segments(max_holders=4), st.data())
def test_damaged_values_are_refused_alike(seg: Segment, data: st.DataObject) -> None:
    value = bytearray(_encode_segment(seg))
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "header"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(value) - 1))
        value[at] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del value[data.draw(st.integers(0, len(value) - 1)):]
    elif how == "extend":
        value += data.draw(st.binary(min_size=1, max_size=40))
    else:  # a header field rewritten, the checksum made right again: deeper checks
        at = data.draw(st.sampled_from([4, 5, 24, 25, 31, 44, 45]))
        value[at] = data.draw(st.integers(0, 255))
        value = bytearray(_fix_crc(bytes(value)))
    raw = bytes(value)
    ref, got = _reference_outcome(raw), _native_outcome(raw)
    assert CW is not None
    code = CW.parse_segment(raw)
    if isinstance(ref, Segment):
        assert isinstance(got, Segment) and not isinstance(code, int)
        _same(got, ref)
    else:
        assert isinstance(code, int) and code > 0
        assert got == ref  # the same error type and message


def _fix_crc(value: bytes) -> bytes:
    import zlib
    if len(value) < 48:
        return value
    crc = zlib.crc32(value[44:], zlib.crc32(value[:40]))
    return value[:40] + crc.to_bytes(4, "little") + value[44:]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_refused_alike(raw: bytes) -> None:
    for value in (raw, b"SRPS" + raw, _fix_crc(b"SRPS\x02\x01" + raw)):
        ref, got = _reference_outcome(value), _native_outcome(value)
        if isinstance(ref, Segment):
            assert isinstance(got, Segment)
            _same(got, ref)
        else:
            assert got == ref


def test_table_checks_and_a_wrong_key_raise_the_references_errors() -> None:
    ids = np.arange(8, dtype=np.uint64).reshape(4, 2)
    base = dict(seg_id=3, window=0, presence=0b0111, ns_tag=1, ids=ids,
                meta=np.zeros(4, np.uint64))
    bad_tables = [([5, 5], [1, 2]), ([5, 4], [1, 2]), ([5], [0]), ([5], [0b1000])]
    for xmeta, xmask in bad_tables:
        seg = Segment(**base, xmeta=np.array(xmeta, np.uint64),  # type: ignore[arg-type]
                      xmask=np.array(xmask, np.uint64))
        value = _encode_segment(seg)  # the reference writes what it is given
        with pytest.raises(CorruptData, match="holder table"):
            decode_segment(value)
        with pytest.raises(CorruptData, match="says it is 3"):  # the key check comes first
            decode_segment(value, 4)
    good = _encode_segment(Segment(**base))  # type: ignore[arg-type]
    with pytest.raises(CorruptData, match="under key 9 says it is 3"):
        decode_segment(good, 9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(WORD, WORD), max_size=70), U64, st.integers(0, 2**32 - 71))
def test_locator_records_match_the_reference(rows: list[tuple[int, int]], head: int,
                                             first: int) -> None:
    assert CW is not None
    ids = np.array(rows, dtype=np.uint64).reshape(len(rows), 2)
    assert CW.block_keys(ids) == _block_keys(ids)
    got = locator_records(ids, np.full(len(ids), head, np.uint64),
                          np.arange(first, first + len(ids), dtype=np.int64), native.pick())
    want: dict[bytes, bytes] = {}
    for i, row in enumerate(ids):  # a later record of a duplicate id wins
        want[block_key(row.astype("<u8").tobytes())] = LOCATOR.pack(head, first + i)
    assert got == want and list(got) == list(want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(WORD, WORD), min_size=1, max_size=64),
       st.lists(st.integers(0, 64), max_size=20))
def test_routing_filters_match_the_fingerprint_reference(rows: list[tuple[int, int]],
                                                         offsets: list[int]) -> None:
    assert CW is not None
    ids = np.array(rows, dtype=np.uint64).reshape(len(rows), 2)
    want = filters_at(fingerprints(ids, 64), np.array(offsets, dtype=np.int64)).tolist()
    assert CW.filters(ids, offsets) == want  # blocks past the end fingerprint as 0
    assert segment_filters(ids, offsets, 64, native.pick()) == want
    assert segment_filters(ids, offsets, 64, native.pick(reference=True)) == want


def test_the_kernels_given_run() -> None:
    seg = Segment(1, 0, 1, 2, np.ones((1, 2), np.uint64), np.ones(1, np.uint64))
    assert native.pick().write is not None or not native.ENABLED
    fast = (encode_segment(seg, native.pick()), block_keys(seg.ids, native.pick()))
    ref = native.pick(reference=True)
    assert ref.write is None
    assert (encode_segment(seg, ref), block_keys(seg.ids, ref)) == fast
    strided = np.arange(12, dtype=np.uint64).reshape(3, 4)[:, ::2]  # not contiguous
    assert block_keys(strided) == _block_keys(strided)
    signed = Segment(1, 0, 1, 2, np.ones((1, 2), np.int64), np.ones(1, np.int64))
    assert encode_segment(signed) == _encode_segment(signed)


def test_bad_arguments_are_refused_with_their_names() -> None:
    assert CW is not None
    ids, meta, none = np.zeros((2, 2), np.uint64), np.zeros(2, np.uint64), np.zeros(0, np.uint64)
    ok = (1, 0, 3, 0, ids, meta, none, none)
    assert CW.encode_segment(*ok)
    with pytest.raises(TypeError, match="8 arguments"):
        CW.encode_segment(*ok[:7])
    with pytest.raises(TypeError, match="ids must have dtype uint64"):
        CW.encode_segment(1, 0, 3, 0, ids.astype(np.int64), meta, none, none)
    with pytest.raises(ValueError, match="ids must have shape"):
        CW.encode_segment(1, 0, 3, 0, meta, meta, none, none)
    with pytest.raises(ValueError, match="ids must be a C-contiguous"):
        CW.encode_segment(1, 0, 3, 0, np.zeros((2, 4), np.uint64)[:, ::2], meta, none, none)
    with pytest.raises(ValueError, match=r"1\.\.64"):
        CW.encode_segment(1, 0, 3, 0, np.zeros((65, 2), np.uint64), np.zeros(65, np.uint64),
                          none, none)
    with pytest.raises(ValueError, match=r"1\.\.64"):
        CW.encode_segment(1, 0, 3, 0, np.zeros((0, 2), np.uint64), none, none, none)
    with pytest.raises(ValueError, match="meta: 1 values for 2 blocks"):
        CW.encode_segment(1, 0, 3, 0, ids, meta[:1], none, none)
    with pytest.raises(ValueError, match="xmask: 0 entries, xmeta has 1"):
        CW.encode_segment(1, 0, 3, 0, ids, meta, meta[:1], none)
    with pytest.raises(OverflowError, match="seg_id"):
        CW.encode_segment(-1, 0, 3, 0, ids, meta, none, none)
    with pytest.raises(OverflowError, match="presence"):
        CW.encode_segment(1, 0, 2**64, 0, ids, meta, none, none)
    with pytest.raises(TypeError, match="window must be an int"):
        CW.encode_segment(1, 0.5, 3, 0, ids, meta, none, none)
    with pytest.raises(TypeError, match="meta must be a uint64 array"):
        CW.encode_segment(1, 0, 3, 0, ids, [0, 0], none, none)
    with pytest.raises(TypeError, match="value must be bytes"):
        CW.parse_segment(5)
    with pytest.raises(ValueError, match="ids must have shape"):
        CW.block_keys(meta)
    with pytest.raises(ValueError, match=r"offsets\[1\] is -1"):
        CW.filters(ids, [0, -1])
    with pytest.raises(ValueError, match=r"offsets\[0\] is 65"):
        CW.filters(ids, [65])
    with pytest.raises(TypeError, match="offsets must be a sequence"):
        CW.filters(ids, 5)
    with pytest.raises(TypeError, match="2 arguments"):
        CW.filters(ids)


# -- drop_windows: WriteTxn.drop's loop over a removal's windows' segments --------------
def reference_drop(segs: list[Segment], targets: list[tuple[int, int, int]], holder: int | None
                   ) -> tuple[list[Segment], set[int], set[tuple[int, int, int]], int]:
    """WriteTxn.drop's loop (sarpd/core/writer.py) over one window, on writable copies:
    the segments after it, which changed, the blocks left absent, the holdings taken
    off."""
    segs = [s.writable() for s in segs]
    gone: set[tuple[int, int, int]] = set()
    taken: dict[tuple[int, int, int], int] = {}
    changed: set[int] = set()
    wanted = {t: [t[1], t[2]] for t in targets}
    for k, c in enumerate(segs):
        for block, want in wanted.items():
            o = block[0]
            if not (c.is_present(o) and c.has_at(o, want)):
                continue
            hs = c.holders_of(o)
            if holder is not None and holder not in hs:
                continue
            taken.setdefault(block, len(hs) if holder is None else 1)
            if c.drop_holder(o, holder):
                gone.add(block)
            changed.add(k)
    return segs, changed, gone, sum(taken.values())


@st.composite
def drop_targets(draw: st.DrawFn, segs: list[Segment]) -> list[tuple[int, int, int]]:
    """Targets mostly naming blocks of `segs` (repeats, a sibling's id, absent blocks)."""
    targets: list[tuple[int, int, int]] = []
    for _ in range(draw(st.integers(0, 12))):
        seg = draw(st.sampled_from(segs))
        o = draw(st.integers(0, seg.nblocks - 1))
        lo, hi = (int(x) for x in seg.ids[o])
        if draw(st.integers(0, 4)) == 0:
            hi ^= 1  # a sibling's id at the same offset
        targets.append((o, lo, hi))
    return targets


def _ends(parts: list[list[object]] | list[list[tuple[int, int, int]]]) -> np.ndarray:
    return np.cumsum([len(p) for p in parts], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(segments(max_holders=6), min_size=0, max_size=4), min_size=0,
                max_size=4), st.data())
def test_drop_windows_is_the_writers_drop(windows: list[list[Segment]],
                                          data: st.DataObject) -> None:
    """Windows of random segments (holder tables, holes; a window may have none), each
    with its targets (one window's targets may repeat another's block: each window
    counts its own), a holder they hold, another, or every holder: each window's
    changes, blocks gone and holdings are the reference loop's over that window."""
    assert CW is not None
    targets = [data.draw(drop_targets(segs)) if segs else [] for segs in windows]
    held = sorted({h for segs in windows for s in segs for o in range(s.nblocks)
                   for h in s.holders_of(o)})
    holder = data.draw(st.one_of(st.none(), st.sampled_from(held or [7]), U64))
    flat = [t for ts in targets for t in ts]
    offs = np.array([t[0] for t in flat], np.int64)
    ids = np.array([[t[1], t[2]] for t in flat], np.uint64).reshape(-1, 2)
    changed, taken, gone = CW.drop_windows([s for segs in windows for s in segs],
                                           _ends(windows), offs, ids, _ends(targets), holder)
    got = {k: rest for k, *rest in changed}
    lost = np.frombuffer(gone, np.bool_).tolist()
    took = np.frombuffer(taken, np.int64).tolist()
    k0 = t0 = 0
    for segs, ts in zip(windows, targets, strict=True):
        want_segs, want_changed, want_gone, want_taken = reference_drop(segs, ts, holder)
        assert {k - k0 for k in got if k0 <= k < k0 + len(segs)} == want_changed
        for k in want_changed:
            presence, meta, xmeta, xmask = got[k0 + k]
            w = want_segs[k]
            assert presence == w.presence
            assert np.frombuffer(meta, np.uint64).tolist() == w.meta.tolist()
            assert np.frombuffer(xmeta, np.uint64).tolist() == w.xmeta.tolist()
            assert np.frombuffer(xmask, np.uint64).tolist() == w.xmask.tolist()
        mine = lost[t0 : t0 + len(ts)]
        assert {ts[t] for t, x in enumerate(mine) if x} == want_gone
        assert sum(mine) == len(want_gone)  # a repeated block counts once
        assert sum(took[t0 : t0 + len(ts)]) == want_taken
        k0, t0 = k0 + len(segs), t0 + len(ts)
    assert len(got) == len(changed)  # a segment changed once at most


def test_drop_windows_refuses_bad_arguments_by_name() -> None:
    assert CW is not None
    seg = Segment(1, 0, 1, 2, np.ones((1, 2), np.uint64), np.ones(1, np.uint64))
    one, end = np.zeros(1, np.int64), np.ones(1, np.int64)
    row = np.ones((1, 2), np.uint64)
    with pytest.raises(ValueError, match=r"offs\[0\] is 64, not in 0..63"):
        CW.drop_windows([seg], end, np.array([64]), row, end, None)
    with pytest.raises(ValueError, match="ids must have one row per offset"):
        CW.drop_windows([seg], end, one, np.ones((2, 2), np.uint64), end, None)
    with pytest.raises(OverflowError, match="holder"):
        CW.drop_windows([seg], end, one, row, end, -1)
    with pytest.raises(TypeError, match="segs must be a sequence"):
        CW.drop_windows(3, end, one, row, end, None)
    with pytest.raises(ValueError, match=r"seg_ends\[0\] is 2: ends must ascend from 0 to 1"):
        CW.drop_windows([seg], np.array([2]), one, row, end, None)
    with pytest.raises(ValueError, match="tgt_ends ends at 0, not at its sequence's length 1"):
        CW.drop_windows([seg], end, one, row, np.zeros(1, np.int64), None)
    with pytest.raises(ValueError, match="seg_ends has 2 windows, tgt_ends 1"):
        CW.drop_windows([seg], np.array([0, 1]), one, row, end, None)
    with pytest.raises(ValueError, match=r"seg_ends\[1\] is 0: ends must ascend"):
        CW.drop_windows([seg], np.array([1, 0]), one, row, np.array([1, 1]), None)


class _Shrinking(Segment):
    """A segment whose presence, read, empties the list it is in (a caller's hostile
    sequence: drop_windows must not read past the list's end)."""

    victims: list[Segment]

    @property  # type: ignore[override]
    def presence(self) -> int:
        self.victims.clear()
        return self._presence

    @presence.setter
    def presence(self, value: int) -> None:
        self._presence = value


def test_drop_windows_refuses_a_list_that_shrinks_while_it_is_read() -> None:
    assert CW is not None
    ids = np.ones((1, 2), np.uint64)
    first = _Shrinking(1, 0, 1, 2, ids, np.ones(1, np.uint64))
    segs: list[Segment] = [first, Segment(2, 0, 1, 2, ids.copy(), np.ones(1, np.uint64))]
    first.victims = segs
    with pytest.raises(RuntimeError, match="segs changed size while it was read"):
        CW.drop_windows(segs, np.array([2]), np.zeros(1, np.int64), ids, np.array([1]), None)


# -- add_holders, refill_blocks: WriteTxn.add_holders' and refill's loops ----------------
Targets = list[tuple[int, int, int, int]]  # (offset, id lo, id hi, meta)


def reference_add(segs: list[Segment], targets: Targets) -> tuple[list[Segment], set[int],
                                                                  set[int]]:
    """WriteTxn.add_holders' reference loop (sarpd/core/writer.py) on writable copies:
    the segments after it, which changed, the targets that added a holder."""
    segs = [s.writable() for s in segs]
    changed, hit = set(), set()
    for k, c in enumerate(segs):
        for t, (o, lo, hi, m) in enumerate(targets):
            if c.is_present(o) and not c.holds(o, m) and c.has_at(o, [lo, hi]):
                c.add_holder(o, m)
                changed.add(k)
                hit.add(t)
    return segs, changed, hit


def reference_refill(segs: list[Segment], targets: Targets) -> tuple[list[Segment], set[int],
                                                                     set[int]]:
    """WriteTxn.refill's reference loop, on writable copies (as reference_add)."""
    segs = [s.writable() for s in segs]
    changed, hit = set(), set()
    for k, c in enumerate(segs):
        for t, (o, lo, hi, m) in enumerate(targets):
            if not c.is_present(o) and c.has_at(o, [lo, hi]):
                c.presence |= 1 << o
                c.meta[o] = m
                changed.add(k)
                hit.add(t)
    return segs, changed, hit


def window_targets(segs: list[Segment], data: st.DataObject) -> Targets:
    """Targets mostly naming the segments' blocks (repeats, siblings' ids, absent and
    present blocks), with a holder they have, another, or any."""
    held = sorted({h for s in segs for o in range(s.nblocks) for h in s.holders_of(o)})
    out: Targets = []
    for _ in range(data.draw(st.integers(0, 12))):
        seg = data.draw(st.sampled_from(segs))
        o = data.draw(st.integers(0, seg.nblocks - 1))
        lo, hi = (int(x) for x in seg.ids[o])
        if data.draw(st.integers(0, 4)) == 0:
            hi ^= 1  # a sibling's id at the same offset
        out.append((o, lo, hi, data.draw(st.one_of(st.sampled_from(held or [7]), U64))))
    return out


@pytest.mark.parametrize("kernel", ["add_holders", "refill_blocks"])
@settings(max_examples=300, deadline=None)
@given(segs=st.lists(segments(max_holders=6), min_size=1, max_size=4), data=st.data())
def test_add_and_refill_are_the_writers_loops(kernel: str, segs: list[Segment],
                                              data: st.DataObject) -> None:
    """Random window segments (no presence bits past their blocks: the writer's never
    have them, and there the reference raises IndexError where the C sees absent
    blocks), targets from window_targets."""
    assert CW is not None
    for seg in segs:
        seg.presence &= (1 << seg.nblocks) - 1
    targets = window_targets(segs, data)
    ref = reference_add if kernel == "add_holders" else reference_refill
    want_segs, want_changed, want_hit = ref(segs, targets)
    offs = np.array([t[0] for t in targets], np.int64)
    ids = np.array([[t[1], t[2]] for t in targets], np.uint64).reshape(-1, 2)
    metas = np.array([t[3] for t in targets], np.uint64)
    changed, hit = getattr(CW, kernel)(segs, offs, ids, metas)
    assert {k for k, *_ in changed} == want_changed
    assert set(np.flatnonzero(np.frombuffer(hit, np.bool_)).tolist()) == want_hit
    for k, presence, meta, xmeta, xmask in changed:
        w = want_segs[k]
        assert presence == w.presence
        assert np.frombuffer(meta, np.uint64).tolist() == w.meta.tolist()
        assert np.frombuffer(xmeta, np.uint64).tolist() == w.xmeta.tolist()
        assert np.frombuffer(xmask, np.uint64).tolist() == w.xmask.tolist()


def test_add_and_refill_refuse_bad_arguments_by_name() -> None:
    assert CW is not None
    seg = Segment(1, 0, 1, 2, np.ones((1, 2), np.uint64), np.ones(1, np.uint64))
    one, ids = np.zeros(1, np.int64), np.ones((1, 2), np.uint64)
    for f in (CW.add_holders, CW.refill_blocks):
        with pytest.raises(ValueError, match=r"offs\[0\] is -1, not in 0..63"):
            f([seg], np.array([-1]), ids, np.ones(1, np.uint64))
        with pytest.raises(ValueError, match="metas must have one row per offset"):
            f([seg], one, ids, np.ones(2, np.uint64))
        with pytest.raises(TypeError, match="metas must be a"):
            f([seg], one, ids, [1])
        with pytest.raises(TypeError, match="4 arguments"):
            f([seg], one, ids)
        with pytest.raises(TypeError, match="segs must be a sequence"):
            f(3, one, ids, np.ones(1, np.uint64))
        bad = Segment(1, 0, 1, 2, np.ones((1, 2), np.uint64), np.ones(2, np.uint64))
        with pytest.raises(ValueError, match="a meta each"):
            f([bad], one, ids, np.ones(1, np.uint64))
