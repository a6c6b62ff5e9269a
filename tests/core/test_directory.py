"""The routing directory against a plain dict model: postings, probes and counts stay
exact through appends, filter updates, drops and merges (base + delta), and a merge
records how long it paused."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.directory import Directory, DirectoryArrays

KEYS = st.integers(1, 12)  # few keys: postings get long and keys repeat across base/delta
SEGS = st.integers(1, 40)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS, SEGS, st.integers(0, 2**64 - 1)),
        st.tuples(st.just("filter"), KEYS, SEGS, st.integers(0, 2**64 - 1)),
        st.tuples(st.just("drop"), KEYS, SEGS, st.just(0)),
        st.tuples(st.just("merge"), st.just(0), st.just(0), st.just(0)),
    ),
    max_size=120,
)


def _posting(d: Directory, key: int) -> list[tuple[int, int]]:
    segs, filts = d.posting(key)
    return sorted(zip(segs.tolist(), filts.tolist(), strict=True))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(ops=OPS, delta_max=st.integers(1, 8))
def test_directory_matches_a_dict_model(ops: list[tuple[str, int, int, int]],
                                        delta_max: int) -> None:
    d = Directory(delta_max_entries=delta_max)
    model: dict[int, list[list[int]]] = defaultdict(list)  # key -> [[seg, filt], ...]
    for op, key, seg, filt in ops:
        if op == "add":
            d.add(key, seg, filt)
            model[key].append([seg, filt])
        elif op == "filter":
            hit = [e for e in model[key] if e[0] == seg]
            assert d.set_filter(key, seg, filt) == bool(hit)
            for e in hit:
                e[1] = filt
        elif op == "drop":
            present = any(e[0] == seg for e in model[key])
            assert d.drop(key, seg) == present
            model[key] = [e for e in model[key] if e[0] != seg]
        else:
            d.merge()
        if d.needs_merge():
            d.merge()
        for k in range(1, 13):
            assert _posting(d, k) == sorted((s, f) for s, f in model[k]), (op, k)
            assert d.count(k) == len(model[k])
    keys = np.arange(1, 14, dtype=np.uint64)
    assert d.probe(keys).tolist() == [bool(model.get(k)) for k in range(1, 14)]
    arr = d.to_arrays()
    assert (np.diff(arr.keys.astype(np.float64)) >= 0).all()
    assert arr.keys.size == sum(len(v) for v in model.values()) == d.entries


def test_merge_is_timed_and_keeps_the_base_sorted() -> None:
    rng = np.random.default_rng(0)
    base = np.sort(rng.integers(1, 2**63, 5000, dtype=np.uint64))
    d = Directory(delta_max_entries=100)
    d.load_arrays(DirectoryArrays(base, np.full(base.size, 3, np.uint64),
                                  np.zeros(base.size, np.uint64)))
    merges = d.merges
    extra = [*rng.integers(1, 2**63, 200, dtype=np.uint64).tolist(), int(base[7])]
    for k in extra:
        d.add(k, 9, 1)
    assert d.needs_merge()
    d.merge()
    assert d.merges == merges + 1 and d.merge_s_max > 0 and d.merge_s_total >= d.merge_s_max
    arr = d.to_arrays()
    assert arr.keys.tolist() == sorted(base.tolist() + extra)
    assert _posting(d, int(base[7])) == [(3, 0), (9, 1)]


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 6), max_size=40), max_size=8))
def test_flat_delta_order_is_a_stable_argsort_kept_across_appends(
        steps: list[list[int]]) -> None:
    d = Directory(delta_max_entries=1 << 20)
    seg = 0
    for keys in steps:  # appends between reads: the order is merged, not re-sorted
        for k in keys:
            seg += 1
            d.add(k, seg, 0)
        flat = d.flat()
        assert flat.dorder.tolist() == np.argsort(flat.dkeys, kind="stable").tolist()
        for k in set(keys):  # a key's rows in insertion order: its posting list's delta part
            rows = flat.dorder[flat.dkeys[flat.dorder] == np.uint64(k)]
            assert flat.dsegs[rows].tolist() == d.posting(k)[0].tolist()


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 9),
                                         max_size=30),
                                st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 9),
                                         min_size=0, max_size=150)),
                      max_size=6),
       base=st.lists(st.integers(0, 12), max_size=20))
def test_probe_of_many_keys_sees_every_append(steps: list[tuple[list[int], list[int]]],
                                              base: list[int]) -> None:
    """Probes of more than 64 keys (the sorted-delta path) between appends (repeats,
    0 and 2**64-1 included) answer what a set of the added keys answers."""
    d = Directory(delta_max_entries=1 << 20)
    keys_in = set(base)
    b = np.array(sorted(base), dtype=np.uint64)
    d.load_arrays(DirectoryArrays(b, np.ones(b.size, np.uint64), np.zeros(b.size, np.uint64)))
    for added, probed in steps:
        for k in added:
            d.add(k, 1, 0)
            keys_in.add(k)
        for ask in (probed, probed * 3, [*keys_in, *probed] * 2):  # few and > 64 keys
            got = d.probe(np.array(ask, dtype=np.uint64)).tolist()
            assert got == [k in keys_in for k in ask]
