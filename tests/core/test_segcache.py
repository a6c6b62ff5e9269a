"""The decoded-segment cache in C (`_cmatch.SegmentCache`, sarpd/core/csrc/segcache.c)
against its reference, sarpd/core/segcache.py: the same random operation sequences
(put_many with repeated and new ids, hits with repeats and misses, get, membership, a
capacity that shrinks and grows, clear) on both; after every step the same answers and
the same order, and the C structure's own audit (its order and its hash table agree).
Then the argument checks and threads sharing one cache; then stored values
(`put_values`: held raw in C and decoded when Python asks, decoded at once by the
reference), sound and damaged, among the same operations. The kernel's own reads of it
(`match` taking hits in C, its misses put as stored values) are held to the store's
order in tests/core/test_kernel.py.

Skipped only where the extension is not built and SARPD_NO_EXTENSIONS=1; anywhere else
a missing build fails."""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.segcache import SegmentCache
from sarpd.core.segment import Segment, decode_segment, encode_segment


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("sarpd.core._cmatch")
    except ImportError:
        return None


BUILT = _load()
pytestmark = pytest.mark.skipif(
    BUILT is None and os.environ.get("SARPD_NO_EXTENSIONS") == "1",
    reason="sarpd.core._cmatch is not built and SARPD_NO_EXTENSIONS=1")


def native(capacity: int) -> SegmentCache:
    if BUILT is None:
        pytest.fail("sarpd.core._cmatch is not built (make setup builds it; "
                    "SARPD_NO_EXTENSIONS=1 skips these tests)")
    cache: SegmentCache = BUILT.SegmentCache(capacity)
    return cache


class Seg:
    """A stand-in segment: the cache keeps objects, it never reads them."""

    def __init__(self, sid: int, version: int) -> None:
        self.key = (sid, version)

    def __repr__(self) -> str:
        return f"Seg{self.key}"


SIDS = st.one_of(st.integers(0, 40), st.sampled_from([2**63, 2**64 - 1, 64, 128, 4096]))
OPS = st.one_of(
    st.tuples(st.just("put"), st.lists(SIDS, max_size=12)),
    st.tuples(st.just("hits"), st.lists(SIDS, max_size=16)),
    st.tuples(st.just("get"), SIDS),
    st.tuples(st.just("in"), st.one_of(SIDS, st.just(-1), st.just("7"))),
    st.tuples(st.just("capacity"), st.integers(0, 24)),
    st.tuples(st.just("clear"), st.none()),
)


def _order(cache: SegmentCache[object]) -> list[tuple[int, object]]:
    return [(sid, _fields(seg)) for sid, seg in cache.items()]


def _apply(c: SegmentCache[object], ref: SegmentCache[object], step: int, op: str,
           arg: object) -> None:
    """One operation on both caches: the same answers (segments compared by content),
    then the same order and size, and the C structure's own audit."""
    if op == "values":  # (sid, kind, seed): what a multi-get may give (_stored)
        assert isinstance(arg, list)
        sids = [sid for sid, _, _ in arg]
        values = [_stored(sid, kind, seed) for sid, kind, seed in arg]
        assert list(c.put_values(sids, values)) == list(ref.put_values(sids, values))
    elif op == "put":
        assert isinstance(arg, list)
        segs = {sid: Seg(sid, step) for sid in arg}
        c.put_many(segs)
        ref.put_many(segs)
    elif op == "hits":
        assert isinstance(arg, list)
        (got, missing), (want, want_missing) = c.hits(arg), ref.hits(arg)
        assert [(k, _fields(v)) for k, v in got.items()] == \
            [(k, _fields(v)) for k, v in want.items()] and missing == want_missing
    elif op == "get":
        assert isinstance(arg, int)
        seg, want_seg = c.get(arg), ref.get(arg)
        assert (seg is None) == (want_seg is None)
        if seg is not None:
            assert _fields(seg) == _fields(want_seg)
            assert c.get(arg) is seg  # a raw entry is decoded once: the Segment stays
    elif op == "in":
        assert (arg in c) == (arg in ref)
    elif op == "capacity":
        assert isinstance(arg, int)
        c.capacity = ref.capacity = arg
    else:
        c.clear()
        ref.clear()
    assert _order(c) == _order(ref), (step, op)
    assert len(c) == len(ref) and c.capacity == ref.capacity
    assert c._audit()  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 20), ops=st.lists(OPS, max_size=60))
def test_the_native_cache_keeps_the_references_answers_and_order(
        capacity: int, ops: list[tuple[str, object]]) -> None:
    c, ref = native(capacity), SegmentCache[object](capacity)
    for step, (op, arg) in enumerate(ops):
        _apply(c, ref, step, op, arg)


def test_a_full_cache_drops_the_least_recently_used() -> None:
    for cache in (native(3), SegmentCache(3)):
        cache.put_many({1: Seg(1, 0), 2: Seg(2, 0), 3: Seg(3, 0)})
        hits, missing = cache.hits([1, 9])
        assert list(hits) == [1] and missing == [9]
        cache.put_many({4: Seg(4, 0)})  # 2 is the oldest now: it goes
        assert [sid for sid, _ in cache.items()] == [3, 1, 4]
        assert cache.get(2) is None and 2 not in cache


@pytest.mark.parametrize("make", [native, SegmentCache], ids=["native", "reference"])
def test_a_trace_gets_every_hit_in_order_while_it_is_set(make: type[SegmentCache]) -> None:
    cache = make(4)
    cache.put_many({1: Seg(1, 0), 2: Seg(2, 0)})
    cache.hits([1, 3])  # no trace: nothing recorded anywhere
    trace: list[int] = []
    cache.trace = trace
    cache.hits([2, 9, 1, 2])
    assert trace == [2, 1, 2] and cache.trace is trace
    cache.trace = None
    cache.hits([1])
    assert trace == [2, 1, 2] and cache.trace is None


def test_the_native_trace_must_be_a_list() -> None:
    cache = native(2)
    with pytest.raises(TypeError, match="trace must be a list or None, got tuple"):
        cache.trace = ()  # type: ignore[assignment]


@pytest.mark.parametrize("make", [native, SegmentCache], ids=["native", "reference"])
def test_bad_arguments_are_refused_with_the_value(make: type[SegmentCache]) -> None:
    with pytest.raises(ValueError, match="capacity must be >= 0, got -1"):
        make(-1)
    cache = make(4)
    with pytest.raises(ValueError, match="capacity must be >= 0, got -2"):
        cache.capacity = -2
    with pytest.raises(ValueError, match="segment 5 is None"):
        cache.put_many({5: None})  # type: ignore[dict-item]
    assert cache.capacity == 4


def test_the_native_cache_refuses_ids_that_are_not_u64() -> None:
    cache = native(4)
    with pytest.raises(OverflowError, match=r"segment id -1 is not in 0\.\.2"):
        cache.put_many({-1: Seg(0, 0)})
    with pytest.raises(TypeError, match="segment id must be an int, got str"):
        cache.hits(["x"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="mapping"):
        cache.put_many([1, 2])  # type: ignore[arg-type]
    assert cache._audit() and len(cache) == 0  # type: ignore[attr-defined]


def _in_threads(step: Callable[[int, int], None], rounds: int, threads: int = 4) -> None:
    """step(thread, round) for each round, on `threads` threads at once; the first
    failure of any is raised here."""
    errors: list[BaseException] = []

    def work(me: int) -> None:
        try:
            for i in range(rounds):
                step(me, i)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]


def test_threads_sharing_the_native_cache_keep_it_whole() -> None:
    cache = native(64)

    def step(me: int, i: int) -> None:
        _, missing = cache.hits([(me * 7 + i * 13 + k) % 200 for k in range(8)])
        cache.put_many({sid: Seg(sid, me) for sid in missing})

    _in_threads(step, 3000)
    assert cache._audit() and len(cache) == 64  # type: ignore[attr-defined]


# -- stored values (put_values): raw entries in C, decoded at once in the reference ----

def _value(sid: int, n: int, holders: int, seed: int) -> bytes:
    """A stored segment value: n blocks, some absent, `holders` table entries."""
    rng = np.random.default_rng(seed)
    presence = int(rng.integers(1, 2**n, dtype=np.uint64)) if n < 64 else 2**64 - 1
    ids = rng.integers(0, 2**63, (n, 2), dtype=np.uint64)
    meta = rng.integers(0, 2**63, n, dtype=np.uint64)
    xmeta = np.sort(rng.choice(2**40, holders, replace=False).astype(np.uint64))
    xmask = np.array([presence & int(rng.integers(1, 2**63)) or (presence & -presence)
                      for _ in range(holders)], np.uint64)
    return encode_segment(Segment(sid, int(rng.integers(0, 2**40)), presence,
                                  int(rng.integers(0, 2**64, dtype=np.uint64)), ids, meta,
                                  xmeta, xmask))


def _decode(sid: int, value: bytes) -> Segment:
    return decode_segment(value, sid)


def _fields(seg: object) -> object:
    """What a cached object holds, comparable across the two caches."""
    if isinstance(seg, Seg):
        return seg.key
    assert isinstance(seg, Segment)
    return (seg.seg_id, seg.window, seg.presence, seg.ns_tag, seg.ids.tobytes(),
            seg.meta.tobytes(), seg.xmeta.tobytes(), seg.xmask.tobytes())


def _stored(sid: int, kind: str, seed: int) -> object:
    """A value for segment sid of one kind: what a backend's multi-get may give."""
    good = _value(sid, 1 + seed % 64, seed % 4, seed)
    if kind == "good":
        return good
    if kind == "other id":  # a sound value stored under another key
        return _value(sid + 1, 3, 0, seed)
    if kind == "flipped":  # the checksum catches it
        bad = bytearray(good)
        bad[48 + seed % (len(good) - 48)] ^= 0x40
        return bytes(bad)
    if kind == "torn":
        return good[: 48 + seed % (len(good) - 48)]
    if kind == "not bytes":
        return bytearray(good)
    return None


KINDS = st.sampled_from(["good", "good", "good", "other id", "flipped", "torn", "not bytes",
                         "missing"])
VALUE_OPS = st.one_of(
    st.tuples(st.just("values"), st.lists(st.tuples(st.integers(0, 30), KINDS,
                                                    st.integers(0, 2**16)), max_size=10)),
    st.tuples(st.just("put"), st.lists(st.integers(0, 30), max_size=6)),
    st.tuples(st.just("hits"), st.lists(st.integers(0, 34), max_size=12)),
    st.tuples(st.just("get"), st.integers(0, 34)),
    st.tuples(st.just("capacity"), st.integers(0, 16)),
)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 16), ops=st.lists(VALUE_OPS, max_size=40))
def test_stored_values_are_held_as_the_reference_holds_their_segments(
        capacity: int, ops: list[tuple[str, object]]) -> None:
    """put_values among the other operations: the same ids held (what fails a check,
    None or not bytes left to the caller), the same order, and wherever Python code
    asks (get, hits, items) the same segments: the native cache's raw entries decoded
    then, the reference's at once."""
    c, ref = native(capacity), SegmentCache[object](capacity)
    c.decoder = ref.decoder = _decode  # type: ignore[assignment]
    for step, (op, arg) in enumerate(ops):
        _apply(c, ref, step, op, arg)


def test_a_raw_entry_is_decoded_once_and_keeps_its_view() -> None:
    cache = native(4)
    calls: list[int] = []

    def decode(sid: int, value: bytes) -> Segment:
        calls.append(sid)
        return decode_segment(value, sid)

    cache.decoder = decode
    views = cache.put_values([7, 8], [_value(7, 5, 2, 1), None])
    assert list(views) == [7] and type(views[7]).__name__ == "SegmentView"
    assert calls == [] and len(cache) == 1  # checked, not decoded
    seg = cache.get(7)
    assert isinstance(seg, Segment) and calls == [7]
    assert seg._cview is views[7]  # the kernel reads the Segment through the same view
    assert cache.hits([7])[0][7] is seg and [s for _, s in cache.items()] == [seg]
    assert calls == [7]


def test_a_decoder_is_needed_and_its_errors_reach_the_caller() -> None:
    for cache in (native(4), SegmentCache[object](4)):
        with pytest.raises(RuntimeError, match="no decoder"):
            cache.put_values([1], [_value(1, 2, 0, 0)])
        with pytest.raises(ValueError, match="2 segment ids and 1 values"):
            cache.decoder = _decode  # type: ignore[assignment]
            cache.put_values([1, 2], [_value(1, 2, 0, 0)])
    cache = native(4)
    with pytest.raises(TypeError, match="decoder must be callable or None, got int"):
        cache.decoder = 3  # type: ignore[assignment]
    cache.decoder = _decode
    cache.put_values([1], [_value(1, 2, 0, 0)])

    def failing(sid: int, value: bytes) -> Segment:
        raise OSError(f"cannot decode {sid}")

    cache.decoder = failing
    with pytest.raises(OSError, match="cannot decode 1"):
        cache.get(1)
    cache.decoder = None
    with pytest.raises(RuntimeError, match="segment 1 is held as a stored value"):
        cache.hits([1])
    cache.decoder = _decode  # the entry is still there, raw: decoded now
    assert _fields(cache.get(1)) == _fields(_decode(1, _value(1, 2, 0, 0)))
    assert cache._audit()  # type: ignore[attr-defined]


def test_a_large_batch_of_values_is_checked_as_a_small_one() -> None:
    """Past 64 KiB the native cache checks the values without the GIL."""
    sids = list(range(200))
    values = [_stored(sid, "flipped" if sid % 7 == 3 else "good", sid) for sid in sids]
    assert sum(len(v) for v in values if isinstance(v, bytes)) > 64 * 1024
    c, ref = native(150), SegmentCache[object](150)
    c.decoder = ref.decoder = _decode  # type: ignore[assignment]
    assert list(c.put_values(sids, values)) == list(ref.put_values(sids, values))
    assert [(k, _fields(v)) for k, v in c.items()] == [(k, _fields(v)) for k, v in ref.items()]


def test_threads_putting_values_and_decoding_keep_the_cache_whole() -> None:
    cache = native(48)
    cache.decoder = _decode
    stored = {sid: _value(sid, 1 + sid % 64, sid % 3, sid) for sid in range(120)}

    def step(me: int, i: int) -> None:
        hits, missing = cache.hits([(me * 11 + i * 17 + k) % 120 for k in range(6)])
        assert all(_fields(s) == _fields(_decode(k, stored[k])) for k, s in hits.items())
        cache.put_values(missing, [stored[s] for s in missing])

    _in_threads(step, 400)
    assert cache._audit() and len(cache) == 48  # type: ignore[attr-defined]
