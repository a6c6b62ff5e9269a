"""The decoded-segment cache in C (`_cmatch.SegmentCache`, sarpd/core/csrc/segcache.c)
against its reference, sarpd/core/segcache.py: the same random operation sequences
(put_many with repeated and new ids, hits with repeats and misses, get, membership, a
capacity that shrinks and grows, clear) on both; after every step the same answers and
the same order, and the C structure's own audit (its order and its hash table agree).
Then the argument checks and threads sharing one cache. The kernel's own reads of it
(`match` taking hits in C) are held to the store's order in tests/core/test_kernel.py.

Skipped only where the extension is not built and SARPD_NO_EXTENSIONS=1; anywhere else
a missing build fails."""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.segcache import SegmentCache


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


def _order(cache: SegmentCache) -> list[tuple[int, tuple[int, int]]]:
    return [(sid, seg.key) for sid, seg in cache.items()]  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 20), ops=st.lists(OPS, max_size=60))
def test_the_native_cache_keeps_the_references_answers_and_order(
        capacity: int, ops: list[tuple[str, object]]) -> None:
    c, ref = native(capacity), SegmentCache(capacity)
    for step, (op, arg) in enumerate(ops):
        if op == "put":
            assert isinstance(arg, list)
            segs = {sid: Seg(sid, step) for sid in arg}
            c.put_many(segs)
            ref.put_many(segs)
        elif op == "hits":
            assert isinstance(arg, list)
            got, want = c.hits(arg), ref.hits(arg)
            assert list(got[0].items()) == list(want[0].items()) and got[1] == want[1]
        elif op == "get":
            assert isinstance(arg, int)
            assert c.get(arg) is ref.get(arg)
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


def test_threads_sharing_the_native_cache_keep_it_whole() -> None:
    cache = native(64)
    errors: list[BaseException] = []

    def work(me: int) -> None:
        try:
            for i in range(3000):
                sids = [(me * 7 + i * 13 + k) % 200 for k in range(8)]
                _, missing = cache.hits(sids)
                cache.put_many({sid: Seg(sid, me) for sid in missing})
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not errors
    assert cache._audit() and len(cache) == 64  # type: ignore[attr-defined]
