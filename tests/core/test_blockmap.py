"""The block map against a dict: never a wrong answer, and every entry it let go was
spilled (what the index writes as a locator record), under tiny budgets and generations
so that freezing, refreshing and eviction all run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.blockmap import FROZEN_ENTRY_BYTES, YOUNG_ENTRY_BYTES, BlockMap


def ids_of(keys: list[tuple[int, int]]) -> np.ndarray:
    return np.array(keys, dtype=np.uint64).reshape(-1, 2)


KEY = st.tuples(st.integers(0, 40), st.sampled_from([0, 7, 2**64 - 1]))
OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["add", "bulk"]), st.lists(KEY, max_size=6)),
    st.tuples(st.just("lookup"), st.lists(KEY, max_size=6)),
    st.tuples(st.just("discard"), st.lists(KEY, max_size=3)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, generation=st.integers(1, 6), budget_entries=st.integers(0, 30))
def test_answers_as_a_dict_and_spills_what_it_drops(ops: list[tuple[str, list[tuple[int, int]]]],
                                                     generation: int,
                                                     budget_entries: int) -> None:
    m = BlockMap(budget_entries * FROZEN_ENTRY_BYTES, generation=generation)
    truth: dict[tuple[int, int], tuple[int, int]] = {}
    spilled: dict[tuple[int, int], tuple[int, int]] = {}
    for step, (op, keys) in enumerate(ops, 1):
        if op in ("add", "bulk") and keys:
            heads = [step * 10 + i for i in range(len(keys))]
            pos = [step + i for i in range(len(keys))]
            sp = m.add(ids_of(keys), heads, pos) if op == "add" else m.add_bulk(
                ids_of(keys), np.array(heads, np.uint64), np.array(pos, np.uint32))
            for k, h, p in zip(keys, heads, pos, strict=True):
                truth[k] = (h, p)
            if sp is not None:
                for (lo, hi), h, p in zip(sp.ids.tolist(), sp.heads.tolist(), sp.pos.tolist(),
                                          strict=True):
                    spilled[(lo, hi)] = (h, p)
        elif op == "discard" and keys:
            m.discard(ids_of(keys))
            for k in keys:
                truth.pop(k, None)
        elif keys:
            heads, pos = m.lookup(ids_of(keys))
            for k, h, p in zip(keys, heads.tolist(), pos.tolist(), strict=True):
                if p >= 0:
                    assert truth.get(k) == (h, p), k  # never a wrong or discarded entry
        if op in ("add", "bulk") and keys:  # a lookup's refreshed entries wait for an add
            assert m.nbytes <= max(m.budget_bytes, len(m.young) * YOUNG_ENTRY_BYTES)
    heads, pos = m.lookup(ids_of(list(truth))) if truth else (np.zeros(0), np.zeros(0))
    for k, h, p in zip(truth, heads.tolist(), pos.tolist(), strict=True):
        if p >= 0:
            assert truth[k] == (h, p)
        else:  # let go: its newest value was spilled
            assert spilled.get(k) == truth[k], k


def test_snapshot_round_trip_keeps_order_and_values() -> None:
    m = BlockMap(1 << 20, generation=4)
    keys = [(i, 5) for i in range(10)]
    m.add(ids_of(keys), list(range(10)), list(range(100, 110)))
    m.lookup(ids_of([(0, 5)]))  # refreshed: newest now
    arrays = m.to_arrays()
    assert arrays.ids[-1].tolist() == [0, 5] and len(arrays.ids) == 10
    again = BlockMap(1 << 20, generation=4)
    assert again.load_arrays(arrays) is None
    heads, pos = again.lookup(ids_of(keys))
    assert heads.tolist() == list(range(10)) and pos.tolist() == list(range(100, 110))


def test_a_smaller_budget_at_load_spills_the_oldest() -> None:
    m = BlockMap(1 << 20, generation=4)
    m.add(ids_of([(i, 0) for i in range(12)]), list(range(12)), list(range(12)))
    small = BlockMap(5 * FROZEN_ENTRY_BYTES, generation=4)
    sp = small.load_arrays(m.to_arrays())
    assert sp is not None and sp.ids[:, 0].tolist()[:4] == [0, 1, 2, 3]
    assert len(small) + len(sp) == 12


def test_counts_and_bad_arguments() -> None:
    m = BlockMap(1 << 20, generation=2)
    m.add(ids_of([(1, 0), (2, 0), (3, 0)]), [1, 2, 3], [1, 2, 3])
    m.lookup(ids_of([(1, 0), (9, 0)]))
    m.discard(ids_of([(2, 0)]))
    s = m.stats()
    assert (s["entries"], s["hits"], s["misses"], s["discarded"]) == (2, 1, 1, 1)
    assert s["bytes"] == m.nbytes > 0
    with pytest.raises(ValueError, match="generation"):
        BlockMap(10, generation=0)


def test_ids_whose_mixes_collide_are_both_held() -> None:
    """Two blocks with one 64-bit mix (constructed: 2**-64 a pair by chance) and a block
    added twice in one bulk: every lookup answers its own, newest entry."""
    c = 0x9E3779B97F4A7C15
    a = (5, 1)
    b = (5 ^ (1 * c % 2**64) ^ (2 * c % 2**64), 2)  # lo ^ hi * C equal to a's
    for bulk in (False, True):
        m = BlockMap(1 << 20, generation=4)
        keys = [a, b, (9, 9), a]
        if bulk:
            m.add_bulk(ids_of(keys), np.array([1, 2, 3, 4], np.uint64), np.array([1, 2, 3, 4],
                                                                              np.uint32))
        else:
            m.add(ids_of(keys), [1, 2, 3, 4], [1, 2, 3, 4])
            m._freeze()
        heads, pos = m.lookup(ids_of([a, b, (9, 9)]))
        assert heads.tolist() == [4, 2, 3] and pos.tolist() == [4, 2, 3], bulk
