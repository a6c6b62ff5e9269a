"""The block map in C (sarpd/core/_cmap.c over sarpd/core/csrc/blockmap.c) against its
reference, sarpd/core/blockmap.py: the same random operation sequences (add, add_bulk,
lookup, discard, clear, a snapshot round trip) on both, under tiny budgets and
generations so that freezing, eviction, refreshing and the collision rule all run, with
repeated ids and ids constructed to share a mix, and arguments in every accepted form
(lists, arrays of other integer dtypes, non-contiguous ids); after every step the same
answers, spills (the same entries in the same order, the same dtypes), snapshot arrays,
len, nbytes and stats. Then the argument checks and threads sharing a map.

Skipped only where the extension is not built and SARPD_NO_EXTENSIONS=1; anywhere else
a missing build fails."""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import blockmap
from sarpd.core.blockmap import BlockMap, MapArrays, Spill
from sarpd.model import IdArray


def _load() -> ModuleType | None:
    try:
        return importlib.import_module("sarpd.core._cmap")
    except ImportError:
        return None


BUILT = _load()
pytestmark = pytest.mark.skipif(
    BUILT is None and os.environ.get("SARPD_NO_EXTENSIONS") == "1",
    reason="sarpd.core._cmap is not built and SARPD_NO_EXTENSIONS=1")

if TYPE_CHECKING:
    from sarpd.core import _cmap
else:
    _cmap = BUILT


def need() -> None:
    if BUILT is None:
        pytest.fail("sarpd.core._cmap is not built (make setup builds it; "
                    "SARPD_NO_EXTENSIONS=1 skips these tests)")


def native(budget_bytes: int, generation: int = 65_536) -> _cmap.BlockMap:
    need()
    return _cmap.BlockMap(budget_bytes, generation)


MIX = 0x9E3779B97F4A7C15
M64 = 2**64 - 1


def sharing_mix(mix: int, his: list[int]) -> list[tuple[int, int]]:
    """Ids whose mix (lo ^ hi * MIX mod 2**64) is `mix`: lo solved for each hi."""
    return [(mix ^ (h * MIX & M64), h) for h in his]


COLLIDING = sharing_mix(5, [0, 1, 2, 3]) + sharing_mix(M64 - 2, [7, 12_345, M64])


def ids_of(keys: list[tuple[int, int]]) -> IdArray:
    return np.array(keys, dtype=np.uint64).reshape(-1, 2)


# -- the same operations on both ---------------------------------------------------------

def same(a: npt.NDArray[Any], b: npt.NDArray[Any], what: str) -> None:
    assert (a.dtype, a.shape) == (b.dtype, b.shape), what
    assert np.array_equal(a, b), (what, a.tolist(), b.tolist())


def same_spill(r: Spill | None, c: Spill | None) -> None:
    assert (r is None) == (c is None), (r, c)
    if r is not None and c is not None:
        assert type(c) is Spill
        same(r.ids, c.ids, "spill ids")
        same(r.heads, c.heads, "spill heads")
        same(r.pos, c.pos, "spill pos")


def ids_as(keys: list[tuple[int, int]], form: int) -> IdArray:
    """The same ids C-contiguous (0), in Fortran order (1), as a strided view (2) or
    with negative strides (3)."""
    a = ids_of(keys)
    if form == 1:
        return np.asfortranarray(a)
    if form == 2:
        wide = np.zeros((len(a), 3), np.uint64)
        wide[:, 0], wide[:, 2] = a[:, 0], a[:, 1]
        return wide[:, ::2]
    if form == 3:
        return a[::-1].copy()[::-1]
    return a


def values(step: int, n: int, form: int) -> tuple[Any, Any]:
    """Heads over all 64 bits and positions over all 32, as lists (0), uint64/int64
    arrays (1), a strided uint64 view / uint32 array (2), a list / uint64 array (3)."""
    heads = [(step * MIX + i * 0xBF58476D1CE4E5B9) & M64 for i in range(n)]
    pos = [(step * 2_654_435_761 + i * 40_503) & 0xFFFFFFFF for i in range(n)]
    if form == 1:
        return np.array(heads, np.uint64), np.array(pos, np.int64)
    if form == 2:
        return np.repeat(np.array(heads, np.uint64), 2)[::2], np.array(pos, np.uint32)
    if form == 3:
        return heads, np.array(pos, np.uint64)
    return heads, pos


class Pair:
    """A reference map and a C map, fed the same operations."""

    def __init__(self, budget_bytes: int, generation: int) -> None:
        self.ref = BlockMap(budget_bytes, generation)
        self.c = native(budget_bytes, generation)

    def check(self) -> None:
        assert len(self.c) == len(self.ref)
        assert self.c.nbytes == self.ref.nbytes
        assert list(self.c.stats().items()) == list(self.ref.stats().items())
        a, b = self.ref.to_arrays(), self.c.to_arrays()
        assert type(b) is MapArrays
        same(a.ids, b.ids, "to_arrays ids")
        same(a.heads, b.heads, "to_arrays heads")
        same(a.pos, b.pos, "to_arrays pos")

    def add(self, ids: IdArray, heads: Any, pos: Any, bulk: bool) -> None:
        if bulk:
            same_spill(self.ref.add_bulk(ids, heads, pos), self.c.add_bulk(ids, heads, pos))
        else:
            same_spill(self.ref.add(ids, heads, pos), self.c.add(ids, heads, pos))

    def lookup(self, ids: IdArray, how: str = "lookup") -> None:
        (rh, rp), (ch, cp) = getattr(self.ref, how)(ids), getattr(self.c, how)(ids)
        same(rh, ch, f"{how} heads")
        same(rp, cp, f"{how} pos")

    def discard(self, ids: IdArray) -> None:
        self.ref.discard(ids)
        self.c.discard(ids)

    def clear(self) -> None:
        self.ref.clear()
        self.c.clear()

    def reload(self) -> None:
        """Each loads the other's snapshot (they are equal: check())."""
        a, b = self.ref.to_arrays(), self.c.to_arrays()
        same_spill(self.ref.load_arrays(b), self.c.load_arrays(a))

    def run(self, op: str, ids: IdArray, heads: Any = None, pos: Any = None) -> None:
        if op in ("add", "bulk"):
            self.add(ids, heads, pos, op == "bulk")
        elif op in ("lookup", "peek"):
            self.lookup(ids, op)
        elif op == "discard":
            self.discard(ids)
        elif op == "clear":
            self.clear()
        else:
            self.reload()
        self.check()


KEY = st.one_of(st.tuples(st.integers(0, 12), st.sampled_from([0, 7, M64])),
                st.sampled_from(COLLIDING))
# (op, its ids, their form, picks: for recall / forget, ids added before, by index)
Op = tuple[str, list[tuple[int, int]], int, list[int]]
OP: st.SearchStrategy[Op] = st.one_of(
    st.tuples(st.sampled_from(["add", "bulk", "lookup", "peek", "discard"]),
              st.lists(KEY, max_size=8), st.integers(0, 3), st.just([])),
    st.tuples(st.sampled_from(["recall", "recall", "glance", "forget"]), st.just([]),
              st.integers(0, 3),
              st.lists(st.integers(0, 63), max_size=8)),
    st.tuples(st.sampled_from(["clear", "reload"]), st.just([]), st.just(0), st.just([])),
)


@settings(max_examples=500, deadline=None)
@given(ops=st.lists(OP, max_size=50), generation=st.sampled_from([1, 2, 3, 4, 6, 40]),
       budget_bytes=st.integers(0, 60 * 33))
def test_the_same_operations_give_the_same_answers_spills_and_state(
        ops: list[Op], generation: int, budget_bytes: int) -> None:
    """recall: a lookup of ids added before (frozen hits, refreshes, an id asked twice);
    glance: their peek (frozen hits left where they are); forget: their discard."""
    pair = Pair(budget_bytes, generation)
    added: list[tuple[int, int]] = []
    for step, (op, keys, form, picks) in enumerate(ops, 1):
        if op in ("recall", "glance", "forget"):
            keys = [added[-1 - i % len(added)] for i in picks] if added else []
            op = {"recall": "lookup", "glance": "peek", "forget": "discard"}[op]
        elif op in ("add", "bulk"):
            added += keys
        heads, pos = values(step, len(keys), form)
        pair.run(op, ids_as(keys, form), heads, pos)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), generation=st.sampled_from([16, 33, 64, 200, 1000]),
       budget_entries=st.integers(0, 3000))
def test_longer_runs_with_larger_batches_agree(seed: int, generation: int,
                                               budget_entries: int) -> None:
    """Batches of hundreds from a pool of 1,500 random ids and the colliding ones: the
    radix sort, the young table's growth and tombstones, many generations."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([rng.integers(0, 2**64, (1500, 2), dtype=np.uint64),
                           ids_of(COLLIDING)])
    pair = Pair(budget_entries * blockmap.FROZEN_ENTRY_BYTES, generation)
    ops = ["add", "add", "add", "bulk", "lookup", "lookup", "discard", "reload"]
    for step in range(30):
        op = ops[int(rng.integers(0, len(ops)))]
        ids = pool[rng.integers(0, len(pool), int(rng.integers(0, 400)))]
        heads = rng.integers(0, 2**64, len(ids), dtype=np.uint64)
        pos = rng.integers(0, 2**32, len(ids), dtype=np.int64)
        pair.run(op, ids, heads, pos)
        if step % 10 == 9:  # the oldest ids: frozen hits, refreshed
            pair.run("lookup", pool[:200])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), generation=st.sampled_from([1, 2, 5, 16, 64]),
       budget_entries=st.sampled_from([40, 400, 100_000]))
def test_many_generations_copies_refreshes_and_absent_ids_agree(
        seed: int, generation: int, budget_entries: int) -> None:
    """Dozens to hundreds of frozen generations (small generations, many adds; a large
    budget keeps them all): ids re-added after they froze, so that several generations
    hold one (a lookup answers the newest, a discard drops every copy), lookups and
    discards mixing held ids (young, old, in several generations), ids never added and
    ids refreshed by a lookup just before (moved young), add_bulk and reloads. Every
    generation's filter and search are then taken by ids it holds and ids it does not."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([rng.integers(0, 2**64, (600, 2), dtype=np.uint64),
                           ids_of(COLLIDING)])
    absent = rng.integers(0, 2**64, (200, 2), dtype=np.uint64)
    pair = Pair(budget_entries * blockmap.FROZEN_ENTRY_BYTES, generation)
    recent = pool[:0]
    ops = ["add", "add", "add", "bulk", "lookup", "lookup", "peek", "discard", "refresh",
           "reload"]
    for step in range(60):
        op = ops[int(rng.integers(0, len(ops)))] if step >= 8 else "add"
        ids = pool[rng.integers(0, min(len(pool), 60 + 20 * step), int(rng.integers(1, 48)))]
        if op in ("lookup", "peek", "discard"):
            ids = np.concatenate([ids, absent[rng.integers(0, len(absent), len(ids) // 2)],
                                  recent[: int(rng.integers(0, len(recent) + 1))]])
            ids = ids[rng.permutation(len(ids))]
        if op == "refresh":  # the oldest ids: frozen hits, young again; discarded next
            op, ids = "lookup", pool[: int(rng.integers(1, 120))]
            recent = ids
        heads = rng.integers(0, 2**64, len(ids), dtype=np.uint64)
        pos = rng.integers(0, 2**32, len(ids), dtype=np.int64)
        pair.run(op, ids, heads, pos)
    pair.run("lookup", np.concatenate([pool, absent]))
    pair.run("discard", np.concatenate([absent, pool[::-1]]))
    assert len(pair.c) == len(pair.ref) == 0


def test_an_id_in_several_generations() -> None:
    """Held in three frozen generations and the young one: a lookup answers the newest
    entry (young, then the newest frozen one) and refreshes it; a discard drops every
    copy, in the generations whose filters let it through and nowhere else."""
    pair = Pair(1 << 20, 3)
    a, b = (11, 5), (12, 5)
    for step in range(4):  # a, b and another id each time: a generation of three
        pair.run("add", ids_of([a, b, (100 + step, 0)]), [step, step, 0], [step, step, 0])
    pair.run("add", ids_of([a]), [9], [9])  # and young
    assert pair.c.stats()["generations"] == 4 and len(pair.c) == 13
    pair.run("lookup", ids_of([a, b, (7, 7)]))
    for m in (pair.ref, pair.c):
        assert m.lookup(ids_of([a, b]))[1].tolist() == [9, 3]  # young a; b refreshed
    pair.run("discard", ids_of([a, (7, 7)]))
    assert len(pair.c) == 8 and pair.c.stats()["discarded"] == 5
    for m in (pair.ref, pair.c):
        assert m.lookup(ids_of([a]))[1].tolist() == [-1]
    pair.run("discard", ids_of([b, b]))
    assert len(pair.c) == 4 and pair.c.stats()["discarded"] == 9


# -- by hand ------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["reference", "native"])
def test_a_repeated_frozen_hit_is_moved_and_counted_once(impl: str) -> None:
    """One lookup asking a frozen id twice: both answered, the entry moved to the young
    generation once (blockmap.py counted it twice, then dropped the generation, count 0,
    with block (2, 0) still in it, unspilled, until `r = np.unique(r)`)."""
    m = BlockMap(1 << 20, generation=2) if impl == "reference" else native(1 << 20, 2)
    m.add(ids_of([(1, 0), (2, 0)]), [1, 2], [1, 2])  # frozen: one generation of two
    assert m.lookup(ids_of([(1, 0), (1, 0)]))[1].tolist() == [1, 1]
    assert len(m) == 2
    assert m.lookup(ids_of([(2, 0)]))[1].tolist() == [2]


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_a_peek_answers_as_a_lookup_and_moves_nothing(impl: str) -> None:
    """A removal's lookup (`peek`): the same answers and counts as `lookup`, but a
    frozen hit stays in its generation (the map's entries and their order unchanged),
    so that a lookup after it still finds it frozen and moves it then."""
    m = BlockMap(1 << 20, generation=4) if impl == "reference" else native(1 << 20, 4)
    m.add(ids_of([(1, 0), (2, 0), (4, 0), (5, 0), (3, 0)]), [1, 2, 4, 5, 3],
          [1, 2, 4, 5, 3])  # 1, 2, 4, 5 frozen, 3 young
    before = m.to_arrays()
    heads, pos = m.peek(ids_of([(1, 0), (3, 0), (9, 9), (1, 0)]))
    assert heads.tolist() == [1, 3, 0, 1] and pos.tolist() == [1, 3, -1, 1]
    after = m.to_arrays()
    assert after.ids.tolist() == before.ids.tolist() and after.pos.tolist() == before.pos.tolist()
    assert m.stats()["hits"] == 3 and m.stats()["misses"] == 1
    m.lookup(ids_of([(1, 0)]))  # now refreshed: young, listed last
    assert m.to_arrays().ids.tolist()[-1] == [1, 0]


def test_ids_whose_mixes_collide_are_both_held() -> None:
    """blockmap's collision test on the C map: a frozen generation keeps the last entry
    of a mix; another block with that mix goes young, a same block's older entry goes."""
    a, b = (5, 1), sharing_mix(5 ^ (1 * MIX & M64), [2])[0]
    assert (a[0] ^ (a[1] * MIX & M64)) == (b[0] ^ (b[1] * MIX & M64))
    for bulk in (False, True):
        m = native(1 << 20, 4)
        keys = [a, b, (9, 9), a]
        if bulk:
            m.add_bulk(ids_of(keys), np.array([1, 2, 3, 4], np.uint64),
                       np.array([1, 2, 3, 4], np.uint32))
        else:
            m.add(ids_of(keys), [1, 2, 3, 4], [1, 2, 3, 4])  # 3 distinct ids: all young
            m.add_bulk(ids_of([]), [], [])  # freezes the young generation
        heads, pos = m.lookup(ids_of([a, b, (9, 9)]))
        assert heads.tolist() == [4, 2, 3] and pos.tolist() == [4, 2, 3], bulk
        assert len(m) == 3


def test_constants_generation_rule_and_settable_budget() -> None:
    need()
    assert _cmap.YOUNG_ENTRY_BYTES == blockmap.YOUNG_ENTRY_BYTES
    assert _cmap.FROZEN_ENTRY_BYTES == blockmap.FROZEN_ENTRY_BYTES
    for budget in (0, 1, 639, 640, 641, 10**6, 64 << 20, 42_000_000, 2**63):
        assert _cmap.block_map_generation(budget) == blockmap.block_map_generation(budget)
    pair = Pair(1 << 20, 4)
    keys = [(i, 3) for i in range(40)]
    pair.run("add", ids_of(keys), list(range(40)), list(range(40)))
    pair.ref.budget_bytes = pair.c.budget_bytes = 10 * 33  # a smaller budget: next add evicts
    pair.ref.generation = pair.c.generation = 3
    assert (pair.c.budget_bytes, pair.c.generation) == (330, 3)
    pair.run("add", ids_of([(99, 3)]), [7], [7])
    assert pair.c.stats()["spilled"] > 0


# -- arguments ---------------------------------------------------------------------------

def test_the_constructor_refuses_as_the_reference_does() -> None:
    need()
    for args in [(-1,), (10, 0), (-5, -5)]:
        with pytest.raises(ValueError) as want:
            BlockMap(*args)
        with pytest.raises(ValueError, match=re.escape(str(want.value))):
            _cmap.BlockMap(*args)
    bad: Any = _cmap.BlockMap
    with pytest.raises(TypeError, match="budget_bytes"):
        bad(1.5)
    with pytest.raises(TypeError, match="generation"):
        bad(10, "2")
    with pytest.raises(ValueError, match="budget_bytes"):
        bad(2**64)
    m = native(10, generation=3)
    with pytest.raises(ValueError, match="generation"):
        m.generation = 0
    with pytest.raises(ValueError, match="budget_bytes"):
        m.budget_bytes = -1
    assert (m.budget_bytes, m.generation) == (10, 3)
    assert native(5).generation == 65_536


def test_bad_arguments_are_refused_by_name_and_change_nothing() -> None:
    m = native(1 << 20, 4)
    ids = ids_of([(1, 0), (2, 0)])
    m.add(ids_of([(7, 7), (8, 8), (9, 9), (10, 10), (11, 11)]), [1, 2, 3, 4, 5], [1, 2, 3, 4, 5])
    before, counts = m.to_arrays(), m.stats()
    call: Any = m
    f64 = np.array([1.0, 2.0])
    cases: list[tuple[Callable[[], object], type[Exception], str]] = [
        (lambda: call.lookup(np.array([1, 2], np.uint64)), ValueError,
         r"ids must have shape \(n, 2\), got \(2,\)"),
        (lambda: call.lookup(np.zeros((2, 3), np.uint64)), ValueError, r"ids .*\(2, 3\)"),
        (lambda: call.lookup(np.zeros((2, 2), np.int64)), TypeError, "ids must have dtype uint64"),
        (lambda: call.lookup(np.zeros((2, 2), np.float64)), TypeError, "ids must have dtype"),
        (lambda: call.lookup([[1, 0]]), TypeError, "ids must be a uint64 array"),
        (lambda: call.discard(np.zeros(4, np.uint64)), ValueError, "ids must have shape"),
        (lambda: call.add(ids, [1], [1, 2]), ValueError, "heads has 1 entries, ids 2"),
        (lambda: call.add(ids, [1, 2], np.array([1, 2, 3])), ValueError, "pos has 3 entries"),
        (lambda: call.add(ids, [1, -1], [1, 2]), ValueError, r"heads\[1\] is -1, not in"),
        (lambda: call.add(ids, [1, 2**64], [1, 2]), ValueError,
         r"heads\[1\] is 18446744073709551616"),
        (lambda: call.add(ids, [1, 2], [1, 2**32]), ValueError, r"pos\[1\] is 4294967296"),
        (lambda: call.add(ids, [1, 2], np.array([1, -1])), ValueError, r"pos\[1\] is -1"),
        (lambda: call.add(ids, np.array([-3, 2], np.int8), [1, 2]), ValueError,
         r"heads\[0\] is -3"),
        (lambda: call.add(ids, [1, 2], np.array([1, 2**40], np.uint64)), ValueError, r"pos\[1\]"),
        (lambda: call.add(ids, f64, [1, 2]), TypeError, "heads must have an integer dtype"),
        (lambda: call.add(ids, [1, 2.5], [1, 2]), TypeError, r"heads\[1\] must be an int"),
        (lambda: call.add(ids, np.zeros((2, 1), np.uint64), [1, 2]), ValueError,
         r"heads must have shape \(n,\)"),
        (lambda: call.add(ids, [1, 2], "ab"), TypeError, "pos must be an integer array"),
        (lambda: call.add(ids, [1, 2], None), TypeError, "pos must be"),
        (lambda: call.add(ids, np.array([True, False]), [1, 2]), TypeError, "heads"),
        (lambda: call.add_bulk(ids, [1, 2], np.array([1, 2**32], np.uint64)), ValueError, "pos"),
        (lambda: call.add(ids, [1, 2]), TypeError, "missing required argument 'pos'"),
        (lambda: call.add(ids, [1, 2], [1, 2], 4), TypeError, "3 positional arguments"),
        (lambda: call.add(ids, [1, 2], pos=[1, 2], heads=[1, 2]), TypeError, "multiple values"),
        (lambda: call.lookup(idz=ids), TypeError, "idz"),
        (lambda: call.load_arrays(object()), TypeError, "arrays must have ids, heads and pos"),
        (lambda: call.load_arrays(MapArrays(ids, np.zeros(1, np.uint64), np.zeros(2, np.uint32))),
         ValueError, "arrays.heads has 1 entries"),
    ]
    for fn, kind, match in cases:
        with pytest.raises(kind, match=match):
            fn()
    after = m.to_arrays()
    same(before.ids, after.ids, "ids")
    same(before.heads, after.heads, "heads")
    assert m.stats() == counts


def test_keywords_and_every_accepted_form() -> None:
    pair = Pair(1 << 20, 3)
    ids = ids_of([(1, 2), (3, 4), (5, 6), (1, 2)])
    pair.ref.add(ids=ids, heads=[1, 2, 3, 4], pos=[5, 6, 7, 8])
    assert pair.c.add(ids=ids, heads=[1, 2, 3, 4], pos=[5, 6, 7, 8]) is None
    pair.check()
    pos_forms: list[Any] = [range(4), (1, 2, 3, 4), np.arange(4, dtype=np.int16),
                            np.arange(8, dtype=np.uint8)[::2], np.array([0, 1, 2, 2**32 - 1])]
    for step, pos in enumerate(pos_forms):
        heads = np.arange(4, dtype=np.int32) + step
        pair.run("add", ids, heads, pos)
        pair.run("bulk", ids, heads, pos)
    pair.run("lookup", np.asfortranarray(ids))
    assert pair.c.lookup(ids=ids_of([]))[1].dtype == np.int64
    pair.run("discard", ids[::-1])


# -- threads -----------------------------------------------------------------------------

def test_threads_share_a_map_and_lose_nothing() -> None:
    """Four threads adding and looking up disjoint ids in batches big enough to run
    without the GIL, on a budget that evicts: every id is held once or spilled once."""
    per, batch = 60_000, 6_000
    m = native(100_000 * 33, generation=8_192)
    spills: list[list[Spill]] = [[] for _ in range(4)]

    def work(t: int) -> None:
        lo = np.arange(t * per, (t + 1) * per, dtype=np.uint64)
        ids = np.stack([lo, np.full(per, 9, np.uint64)], axis=1)
        for i in range(0, per, batch):
            sp = m.add(ids[i : i + batch], lo[i : i + batch], lo[i : i + batch] % 1000)
            if sp is not None:
                spills[t].append(sp)
            m.lookup(ids[max(0, i - batch) : i + batch])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    spilled = np.concatenate([sp.ids for row in spills for sp in row])
    assert len(np.unique(spilled[:, 0])) == len(spilled)
    assert len(m) + len(spilled) == 4 * per == m.stats()["entries"] + m.stats()["spilled"]
    everything = np.stack([np.arange(4 * per, dtype=np.uint64),
                           np.full(4 * per, 9, np.uint64)], axis=1)
    heads, pos = m.lookup(everything)
    held = pos >= 0
    assert (heads[held] == everything[held, 0]).all()
    assert (pos[held] == everything[held, 0] % 1000).all()
    assert set(everything[~held, 0].tolist()) == set(spilled[:, 0].tolist())
