"""The routing directory in C (sarpd/core/_cdir.c over sarpd/core/csrc/directory.c)
against its reference, sarpd/core/directory.py: the same random operation sequences
(adds with repeated keys, set_filter, drop, merge, merges when needs_merge says so,
load_arrays of writable and read-only arrays, clear, to_arrays, probes of present and
absent keys, few and many) on both, under tiny delta limits so that merges interleave
with appends; after every step the same posting lists (in order), counts, has, probes,
flat arrays (and the posting lists rebuilt from them), entries, keys_count, version and
merges. Arrays handed out earlier are compared too: where the reference's are views
that a later change writes through, the C directory's must be as well (and where the
reference's stopped seeing changes, the C one's must too). Then hostile arguments, views
that outlive their directory, and a merge without the GIL beside readers.

Skipped only where the extension is not built and SARPD_NO_EXTENSIONS=1; anywhere else
a missing build fails."""

from __future__ import annotations

import gc
import importlib
import os
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import native as native_mod
from sarpd.core.directory import Directory, DirectoryArrays, FlatDirectory
from sarpd.core.native import DirectoryLike
from sarpd.model import U64Array


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("sarpd.core._cdir")
    except ImportError:
        return None


BUILT = _load()
pytestmark = pytest.mark.skipif(
    BUILT is None and os.environ.get("SARPD_NO_EXTENSIONS") == "1",
    reason="sarpd.core._cdir is not built and SARPD_NO_EXTENSIONS=1")

if TYPE_CHECKING:
    from sarpd.core import _cdir
else:
    _cdir = BUILT

MAX = 2**64 - 1
POOL = [0, 1, 2, 3, 5, 8, 13, 1 << 40, MAX]  # keys: repeats across base and delta
ABSENT = [4, 7, 1 << 41, MAX - 1]


def cdir(delta_max_entries: int) -> _cdir.Directory:
    if BUILT is None:
        pytest.fail("sarpd.core._cdir is not built (make setup builds it; "
                    "SARPD_NO_EXTENSIONS=1 skips these tests)")
    return _cdir.Directory(delta_max_entries)


def pair(delta_max_entries: int) -> tuple[DirectoryLike, DirectoryLike]:
    """(C, reference); the reference on the reference kernels (numpy order)."""
    return cdir(delta_max_entries), Directory(delta_max_entries, native_mod.REFERENCE)


# -- the operations ----------------------------------------------------------------------

KEYS = st.sampled_from(POOL)
SEGS = st.integers(0, 6)  # seg 0: an entry a merge drops
FILTS = st.integers(0, MAX)
ENTRY = st.tuples(KEYS, st.integers(1, 6), FILTS)
OP = st.one_of(
    st.tuples(st.just("add"), KEYS, SEGS, FILTS),
    st.tuples(st.just("add"), KEYS, SEGS, FILTS),
    st.tuples(st.just("add_many"), st.lists(st.tuples(KEYS, SEGS, FILTS), max_size=80)),
    st.tuples(st.just("filter"), KEYS, SEGS, FILTS),
    st.tuples(st.just("drop"), KEYS, st.integers(1, 6)),  # the reference loops on seg 0
    st.tuples(st.just("merge")),
    st.tuples(st.just("to_arrays")),
    st.tuples(st.just("iter_entries")),
    st.tuples(st.just("load"), st.lists(ENTRY, max_size=30), st.booleans()),
    st.tuples(st.just("clear")),
    st.tuples(st.just("limit"), st.integers(0, 9)),
)


def apply(d: DirectoryLike, op: tuple[Any, ...]) -> object:
    """One operation on one directory; its answer."""
    name = op[0]
    if name == "add":
        return d.add(op[1], op[2], op[3])
    if name == "add_many":
        for k, s, f in op[1]:
            d.add(k, s, f)
        return None
    if name == "filter":
        return d.set_filter(op[1], op[2], op[3])
    if name == "drop":
        return d.drop(op[1], op[2])
    if name == "merge":
        return d.merge()
    if name == "to_arrays":
        return arrays_of(d.to_arrays())
    if name == "iter_entries":
        return d.iter_entries()
    if name == "load":
        rows = sorted(op[1], key=lambda e: e[0])
        cols = [np.array([r[i] for r in rows], dtype=np.uint64) for i in range(3)]
        if not op[2]:  # read-only: copied (the reference's np.require copies too)
            for c in cols:
                c.flags.writeable = False
        return d.load_arrays(DirectoryArrays(*cols))
    if name == "clear":
        return d.clear()
    assert name == "limit"
    d.delta_max_entries = op[1]
    return None


def arrays_of(a: DirectoryArrays) -> list[list[int]]:
    return [a.keys.tolist(), a.segs.tolist(), a.filts.tolist()]


def flat_of(f: FlatDirectory) -> list[list[int]]:
    return [a.tolist() for a in (f.keys, f.segs, f.filts, f.dkeys, f.dsegs, f.dfilts, f.dorder)]


def from_flat(f: FlatDirectory, key: int) -> tuple[list[int], list[int]]:
    """A posting list rebuilt from flat arrays: the base slice, then the key's delta rows
    (dorder[lo:hi] of the delta rows sorted by key)."""
    k = np.uint64(key)
    a, b = (int(np.searchsorted(f.keys, k, side)) for side in ("left", "right"))
    dk = f.dkeys[f.dorder]
    lo, hi = (int(np.searchsorted(dk, k, side)) for side in ("left", "right"))
    rows = f.dorder[lo:hi]
    return (f.segs[a:b].tolist() + f.dsegs[rows].tolist(),
            f.filts[a:b].tolist() + f.dfilts[rows].tolist())


M64 = (1 << 64) - 1


def may_have(kfilter: U64Array, key: int) -> bool:
    """csrc/directory.h's dir_kf_may_have in Python: whether the key filter may hold
    `key` (an empty filter: any key may be held)."""
    if not len(kfilter):
        return True
    h = key ^ (key >> 30)
    h = h * 0xBF58476D1CE4E5B9 & M64
    h ^= h >> 27
    h = h * 0x94D049BB133111EB & M64
    h ^= h >> 31
    bits = (1 << (h & 63)) | (1 << ((h >> 6) & 63)) | (1 << ((h >> 12) & 63)) \
        | (1 << ((h >> 18) & 63))
    return int(kfilter[((h >> 32) * len(kfilter)) >> 32]) & bits == bits


def observe(d: DirectoryLike) -> dict[str, object]:
    """Everything a caller can see without changing the directory."""
    keys = POOL + ABSENT
    flat = d.flat()
    out: dict[str, object] = {
        "posting": [tuple(a.tolist() for a in d.posting(k)) for k in keys],
        "count": [d.count(k) for k in keys],
        "has": [d.has(k, s) for k in keys for s in range(7)],
        "probe": d.probe(np.array(keys, dtype=np.uint64)).tolist(),
        "probe_many": d.probe(np.array(keys * 12, dtype=np.uint64)).tolist(),
        "flat": flat_of(flat),
        "scalars": (d.entries, d.keys_count, d.version, d.merges, d.needs_merge(),
                    d.delta_max_entries),
    }
    rebuilt = [from_flat(flat, k) for k in keys]
    assert rebuilt == out["posting"]
    held_keys = [k for k, c in zip(keys, out["count"], strict=True) if c]  # type: ignore[call-overload]
    assert all(may_have(flat.kfilter, k) for k in held_keys), "a held key the filter lacks"
    assert out["probe"] == [bool(c) for c in out["count"]]  # type: ignore[attr-defined]
    return out


def held(d: DirectoryLike) -> list[U64Array]:
    """Arrays a caller keeps from this step: posting lists, flat arrays."""
    f = d.flat()
    got = [a for k in POOL for a in d.posting(k)]
    return [*got, f.keys, f.segs, f.filts, f.dkeys, f.dsegs, f.dfilts, f.dorder]


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OP, max_size=40), limit=st.integers(0, 12))
def test_same_as_the_reference_after_every_step(ops: list[tuple[Any, ...]], limit: int) -> None:
    c, r = pair(limit)
    assert observe(c) == observe(r)
    for op in ops:
        hc, hr = held(c), held(r)
        got_c, got_r = apply(c, op), apply(r, op)
        assert got_c == got_r, op
        assert c.needs_merge() == r.needs_merge()
        if r.needs_merge():  # as the index does between batches
            c.merge()
            r.merge()
        assert observe(c) == observe(r), op
        # what was handed out before: written through (or not) alike
        assert [a.tolist() for a in hc] == [a.tolist() for a in hr], op
    assert c.iter_entries() == r.iter_entries()
    assert arrays_of(c.to_arrays()) == arrays_of(r.to_arrays())
    assert c.merges == r.merges and c.version == r.version


@settings(max_examples=100, deadline=None)
@given(base=st.lists(st.integers(0, MAX) | st.integers(0, 40), max_size=300),
       steps=st.lists(st.tuples(st.lists(st.integers(0, MAX) | st.integers(0, 40), max_size=200),
                                st.lists(st.integers(0, MAX) | st.integers(0, 40), max_size=300)),
                      max_size=5))
def test_probes_and_postings_of_many_keys(base: list[int],
                                          steps: list[tuple[list[int], list[int]]]) -> None:
    """Big batches: many keys appended between probes of few and many keys, a base
    big enough for the range cache once merged."""
    c, r = pair(1 << 20)
    b = np.array(sorted(base), dtype=np.uint64)
    for d in (c, r):
        d.load_arrays(DirectoryArrays(b.copy(), np.arange(1, b.size + 1, dtype=np.uint64),
                                      np.zeros(b.size, np.uint64)))
    for i, (added, probed) in enumerate(steps):
        for d in (c, r):
            for j, k in enumerate(added):
                d.add(k, j + 1, i)
        ask = np.array(probed + added[:5], dtype=np.uint64)
        assert c.probe(ask).tolist() == r.probe(ask).tolist()
        assert c.probe(ask[:3]).tolist() == r.probe(ask[:3]).tolist()
        for k in set(probed[:50] + added[:50]):
            assert [a.tolist() for a in c.posting(k)] == [a.tolist() for a in r.posting(k)]
        assert flat_of(c.flat()) == flat_of(r.flat())
        if i % 2:
            c.merge()
            r.merge()
    assert c.entries == r.entries and c.keys_count == r.keys_count


def test_a_big_base_uses_the_range_cache_and_answers_alike() -> None:
    rng = np.random.default_rng(1)
    keys = np.sort(rng.integers(0, 1 << 20, 60_000, dtype=np.uint64))
    segs = np.arange(1, keys.size + 1, dtype=np.uint64)
    filts = rng.integers(0, MAX, keys.size, dtype=np.uint64)
    c, r = pair(1 << 20)
    c.load_arrays(DirectoryArrays(keys.copy(), segs.copy(), filts.copy()))
    r.load_arrays(c.to_arrays())  # the C one's arrays (read-only views: copied)
    for k in rng.integers(0, 1 << 20, 2000).tolist() * 2:  # asked twice: cached ranges
        assert c.count(k) == r.count(k)
        assert [a.tolist() for a in c.posting(k)] == [a.tolist() for a in r.posting(k)]
    c.add(int(keys[5]), 99, 1)
    r.add(int(keys[5]), 99, 1)
    c.merge()
    r.merge()  # the cache is emptied with the base
    assert [a.tolist() for a in c.posting(int(keys[5]))] == \
        [a.tolist() for a in r.posting(int(keys[5]))]


def test_the_key_filter_holds_every_key_and_few_others() -> None:
    """flat().kfilter: every key held passes it (loaded, added, past the room it was
    sized for, merged); of keys never held, few do (else it skips nothing)."""
    rng = np.random.default_rng(2)
    keys = np.unique(rng.integers(0, 1 << 62, 5000, dtype=np.uint64))
    c, _ = pair(64)
    c.load_arrays(DirectoryArrays(keys.copy(), np.arange(1, keys.size + 1, dtype=np.uint64),
                                  np.zeros(keys.size, np.uint64)))
    added = rng.integers(0, 1 << 62, 3000, dtype=np.uint64).tolist()
    first = c.flat().kfilter
    for i, k in enumerate(added):  # past the filter's room: it is rebuilt when asked
        c.add(k, i + 1, 0)
        if c.needs_merge() and i % 2:
            c.merge()
    f = c.flat()
    assert len(first) and len(f.kfilter)
    assert all(may_have(f.kfilter, k) for k in keys.tolist() + added)
    absent = rng.integers(1 << 62, 1 << 63, 20_000, dtype=np.uint64).tolist()
    assert sum(may_have(f.kfilter, k) for k in absent) < 0.03 * len(absent)
    c.clear()
    assert not any(may_have(c.flat().kfilter, k) for k in keys.tolist()[:2000])


# -- arrays handed out -------------------------------------------------------------------

def test_views_outlive_merges_and_the_directory() -> None:
    d = cdir(4)
    keys = np.array([1, 2, 2, 9], dtype=np.uint64)
    d.load_arrays(DirectoryArrays(keys, np.array([3, 4, 5, 6], np.uint64),
                                  np.array([7, 8, 9, 10], np.uint64)))
    posting = d.posting(2)
    flat, arrays = d.flat(), d.to_arrays()
    assert not posting[0].flags.writeable and not flat.keys.flags.writeable
    for k in range(100):
        d.add(k % 7, k + 1, k)  # the delta grows: its vecs are replaced
    d.merge()
    d.clear()
    del d, keys
    gc.collect()
    assert posting[0].tolist() == [4, 5] and posting[1].tolist() == [8, 9]
    assert flat.keys.tolist() == arrays.keys.tolist() == [1, 2, 2, 9]
    with pytest.raises(ValueError):
        posting[0][0] = 1  # read-only: a caller cannot corrupt the directory


def test_load_arrays_takes_writable_arrays_over_and_copies_read_only_ones() -> None:
    d = cdir(4)
    keys, segs, filts = (np.array([1, 2], np.uint64), np.array([3, 4], np.uint64),
                         np.array([5, 6], np.uint64))
    d.load_arrays(DirectoryArrays(keys, segs, filts))
    assert d.set_filter(2, 4, 77)
    assert filts.tolist() == [5, 77]  # taken over, as the reference does: written in place
    ro = [a.copy() for a in (keys, segs, filts)]
    for a in ro:
        a.flags.writeable = False
    d.load_arrays(DirectoryArrays(*ro))
    assert d.set_filter(1, 3, 11) and ro[2].tolist() == [5, 77]  # copied
    assert d.posting(1)[1].tolist() == [11]


def test_nbytes_is_the_memory_held() -> None:
    d = cdir(1 << 20)
    empty = d.nbytes
    d.load_arrays(DirectoryArrays(np.arange(100_000, dtype=np.uint64),
                                  np.ones(100_000, np.uint64), np.zeros(100_000, np.uint64)))
    assert d.nbytes >= empty + 24 * 100_000
    for k in range(10_000):
        d.add(k, 2, 0)
    assert d.nbytes >= empty + 24 * 110_000 + 8 * 10_000  # rows, their links and keys
    d.clear()
    assert d.nbytes < empty + 24 * 1000


# -- hostile arguments -----------------------------------------------------------------------

BAD_KEYS: list[tuple[object, type[Exception]]] = [
    (np.arange(4, dtype=np.int64), TypeError),
    (np.arange(4, dtype=np.float64), TypeError),
    (np.zeros((2, 2), np.uint64), ValueError),
    (np.arange(8, dtype=np.uint64)[::2], ValueError),
    ([1, 2], TypeError),
    (None, TypeError),
    (b"12345678", TypeError),
]


@pytest.mark.parametrize(("keys", "exc"), BAD_KEYS)
def test_probe_refuses_what_is_not_a_uint64_vector(keys: object, exc: type[Exception]) -> None:
    d = cdir(4)
    d.add(1, 1, 1)
    with pytest.raises(exc, match="keys"):
        d.probe(keys)  # type: ignore[arg-type]
    assert d.probe(np.array([1, 2], np.uint64)).tolist() == [True, False]


def _arrays(**bad: object) -> DirectoryArrays:
    good: dict[str, object] = {"keys": np.array([1, 2], np.uint64),
                               "segs": np.array([1, 2], np.uint64),
                               "filts": np.array([0, 0], np.uint64)}
    good.update(bad)
    return DirectoryArrays(**good)  # type: ignore[arg-type]


@pytest.mark.parametrize(("arrays", "exc", "match"), [
    (_arrays(keys=np.array([1, 2], np.int64)), TypeError, "arrays.keys must have dtype uint64"),
    (_arrays(segs=np.zeros((2, 1), np.uint64)), ValueError, "arrays.segs must be 1-D"),
    (_arrays(filts=np.zeros(4, np.uint64)[::2]), ValueError, "arrays.filts must be C-contiguous"),
    (_arrays(filts=np.zeros(3, np.uint64)), ValueError, "one length"),
    (_arrays(keys=[1, 2]), TypeError, "arrays.keys"),
    (object(), TypeError, "DirectoryArrays"),
])
def test_load_arrays_refuses_bad_arrays_and_changes_nothing(arrays: object,
                                                            exc: type[Exception],
                                                            match: str) -> None:
    d = cdir(4)
    d.add(7, 1, 2)
    version = d.version
    with pytest.raises(exc, match=match):
        d.load_arrays(arrays)  # type: ignore[arg-type]
    assert d.version == version and d.posting(7)[0].tolist() == [1]


@pytest.mark.parametrize(("args", "exc"), [
    ((-1,), OverflowError), ((2**64,), OverflowError), (("1",), TypeError), ((1.5,), TypeError),
    ((None,), TypeError),
])
def test_int_arguments_are_checked(args: tuple[object, ...], exc: type[Exception]) -> None:
    d = cdir(4)
    for call in (d.posting, d.count):
        with pytest.raises(exc, match="key"):
            call(*args)  # type: ignore[arg-type]
    with pytest.raises(exc, match="seg"):
        d.add(1, *args, 0)  # type: ignore[arg-type]
    with pytest.raises(exc, match="filt"):
        d.set_filter(1, 1, *args)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        d.add(1, 2)  # type: ignore[call-arg]
    assert d.version == 0 and d.entries == 0


def test_keywords_and_numpy_ints_are_accepted() -> None:
    d = cdir(delta_max_entries=4)
    d.add(key=np.uint64(5), seg=np.int64(2), filt=3)
    assert d.count(key=5) == 1 and d.has(5, seg=2) and d.set_filter(5, 2, filt=9)
    assert d.probe(keys=np.array([5], np.uint64)).tolist() == [True]
    d.delta_max_entries = 0
    assert d.needs_merge() and d.delta_max_entries == 0


def test_an_unsorted_base_gives_unspecified_answers_but_no_crash() -> None:
    """The snapshot reader refuses unsorted keys; handed them anyway, the directory
    reads and merges within its arrays."""
    d = cdir(2)
    keys = np.array([9, 3, MAX, 0, 3, 7], dtype=np.uint64)
    d.load_arrays(DirectoryArrays(keys, np.arange(1, 7, dtype=np.uint64), np.zeros(6, np.uint64)))
    for k in (3, 0, 8, MAX):
        d.add(k, 11, 1)
        d.posting(k)
        d.count(k)
    d.probe(np.array([0, 3, 9, MAX, 5], np.uint64))
    found = d.drop(3, 2)
    assert len(d.iter_entries()) == d.entries == 10 - found


# -- threads ----------------------------------------------------------------------------------

def test_a_merge_without_the_gil_beside_readers() -> None:
    """A merge big enough to let other threads run: readers meanwhile wait for it and
    see the same posting lists before, during and after (a merge changes no list)."""
    n = 400_000
    d = cdir(1 << 30)
    keys = np.repeat(np.arange(n // 4, dtype=np.uint64), 4)
    d.load_arrays(DirectoryArrays(keys, np.tile(np.arange(1, 5, dtype=np.uint64), n // 4),
                                  np.zeros(n, np.uint64)))
    for k in range(0, 2000, 3):
        d.add(k, 9, 1)
    want = {k: d.posting(k)[0].tolist() for k in range(0, 2000, 7)}
    stop, bad = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            for k, segs in want.items():
                if d.posting(k)[0].tolist() != segs or d.count(k) != len(segs):
                    bad.append(k)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(3):
        d.merge()
        for k in range(0, 2000, 3):
            d.set_filter(k, 9, i)
    stop.set()
    for t in readers:
        t.join()
    assert not bad and d.merges == 1 and d.entries == n + len(range(0, 2000, 3))
