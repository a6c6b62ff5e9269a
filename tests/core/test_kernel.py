"""The match kernel (sarpd/core/kernel.py, sarpd/core/_cmatch.c) against its reference
(the router's deepest/plan_at/_first, the index's first verification round), on
random and adversarial directories: empty, one key, duplicate keys across base and
delta, hot posting lists of thousands of segments with tied fingerprints, queries
shorter than a window, exactly a window, many windows. Skipped where the kernel is
not built (SARPD_NO_EXTENSIONS=1: the reference is what runs)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core import holders, kernel, native, verify
from sarpd.core.directory import DirectoryArrays, _Delta
from sarpd.core.index import SarpIndex
from sarpd.core.plan import WindowPlan
from sarpd.core.router import Router
from sarpd.core.routing import filter_at, fingerprints
from sarpd.core.segment import Segment
from sarpd.model import IdArray, Insert, Match, MatchResult, Remove, SeqSpec, U64Array
from tests.oracle import spans_of

K = native.pick().match
REF = native.pick(reference=True)
pytestmark = pytest.mark.skipif(K is None, reason="the match kernel is not built")

SMALL = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, window_cap=2)
CONFIGS = {
    "small-cap2": SMALL,
    "small-cap40": IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1,
                               window_cap=40),
    "default": IndexConfig(),
    "default-cap1": IndexConfig(window_cap=1),
}


def kern() -> native.MatchKernel:
    assert K is not None
    return K


def plan_fields(p: WindowPlan) -> tuple[Any, ...]:
    segs, filts = p.posting()
    return (p.window, p.length, p.offset, p.first, p.count, p.first_bound, segs.tolist(),
            filts.tolist(), p.qw.tolist())


def reference_plans(router: Router, qs: list[IdArray]) -> list[list[tuple[Any, ...]]]:
    return [[plan_fields(p) for p in plans] for plans in router.plan_many_reference(qs)]


def kernel_plans(router: Router, qs: list[IdArray]) -> list[list[tuple[Any, ...]]]:
    routed = router.route(qs, kern())
    return [[plan_fields(p) for p in router.plans(routed, lo, hi)] for lo, hi in routed.spans()]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[IndexConfig, Router, list[IdArray]]:
    """A directory (base and an unmerged delta) over a small pool of ids, with filters
    drawn so that agreements tie, and queries walking the pool."""
    cfg = CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pool = rng.integers(0, 2**64, size=(draw(st.integers(1, 12)), 2), dtype=np.uint64)
    qs = [pool[rng.integers(0, len(pool), size=draw(st.integers(0, 3 * cfg.segment_blocks)))]
          for _ in range(draw(st.integers(0, 6)))]
    qfilts = [filter_at(fingerprints(q[: cfg.segment_blocks], cfg.segment_blocks), o)
              for q in qs if len(q) for o in range(min(len(q), cfg.segment_blocks))] or [0]

    def entries(n: int) -> list[tuple[int, int, int]]:
        out = []
        for _ in range(n):
            f = int(qfilts[int(rng.integers(len(qfilts)))])
            if rng.random() < 0.5:  # differs from a query's at one nibble: a given agreement
                f ^= 1 << int(rng.integers(64))
            out.append((int(pool[int(rng.integers(len(pool))), 0]),
                        int(rng.integers(1, draw(st.sampled_from([3, 50, 1 << 40])))), f))
        return out

    router = Router(cfg)
    base = sorted(entries(draw(st.integers(0, 60))), key=lambda e: e[0])
    arr = np.array(base, dtype=np.uint64).reshape(-1, 3)
    router.dir.load_arrays(DirectoryArrays(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy()))
    for key, seg, f in entries(draw(st.integers(0, 40))):
        router.dir.add(key, seg, f)
    return cfg, router, qs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_routing_is_the_references_on_random_directories(
        world: tuple[IndexConfig, Router, list[IdArray]]) -> None:
    _, router, qs = world
    want = reference_plans(router, qs)
    assert kernel_plans(router, qs) == want
    assert [[plan_fields(p) for p in plans] for plans in router.plan_many(qs)] == want
    for q, plans in zip(qs, want, strict=True):  # one window at a time (the write path)
        sb = router.geo.sb
        one = router.plan_window(q[:sb], 0)
        assert (plan_fields(one) if one is not None else None) == (plans[0] if plans else None)


def _router(cfg: IndexConfig, base: list[tuple[int, int, int]],
            delta: list[tuple[int, int, int]]) -> Router:
    router = Router(cfg)
    arr = np.array(sorted(base, key=lambda e: e[0]), dtype=np.uint64).reshape(-1, 3)
    router.dir.load_arrays(DirectoryArrays(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy()))
    for e in delta:
        router.dir.add(*e)
    return router


def ids(n: int, seed: int) -> IdArray:
    return np.random.default_rng(seed).integers(0, 2**64, size=(n, 2), dtype=np.uint64)


def test_empty_directory_empty_batch_and_empty_queries() -> None:
    router = _router(IndexConfig(), [], [])
    for qs in ([], [ids(0, 1)], [ids(5, 1), ids(0, 2), ids(200, 3)]):
        assert kernel_plans(router, qs) == reference_plans(router, qs) == [[] for _ in qs]


def test_one_key_and_duplicates_across_base_and_delta() -> None:
    q = ids(64, 4)
    key = int(q[0, 0])
    qf = filter_at(fingerprints(q, 64), 0)
    one = _router(IndexConfig(), [(key, 7, qf)], [])
    assert kernel_plans(one, [q]) == reference_plans(one, [q])
    assert kernel_plans(one, [q])[0][0][3] == [7]
    # the same key (and the same segment) in the base and the delta, past the cap
    dup = _router(IndexConfig(window_cap=2), [(key, 3, qf), (key, 9, qf ^ 1), (key, 5, qf)],
                  [(key, 9, qf), (key, 3, qf), (key, 11, qf ^ (1 << 63))])
    assert kernel_plans(dup, [q]) == reference_plans(dup, [q])
    assert kernel_plans(dup, [q])[0][0][3] == [9, 5]  # full agreement, newest first


@pytest.mark.parametrize("cap", [4, 40])
def test_a_hot_posting_list_of_thousands_with_tied_fingerprints(cap: int) -> None:
    q = ids(64 * 3, 5)
    head = int(q[0, 0])
    rng = np.random.default_rng(6)
    qf = filter_at(fingerprints(q[:64], 64), 0)
    ties = [qf, qf ^ (1 << 60), qf ^ 1, qf ^ (1 << 30)]  # agreements 16, 15 (tied), 0, 8
    base = [(head, int(s), ties[int(rng.integers(4))]) for s in rng.permutation(5000) + 1]
    delta = [(head, int(s), ties[int(rng.integers(4))]) for s in range(6000, 6500)]
    delta += [(int(q[64, 0]), 77, 0), (int(q[64 + 32, 0]), 78, 0)]  # window 1: deeper point
    router = _router(IndexConfig(window_cap=cap), base, delta)
    got = kernel_plans(router, [q, q[:64], q[:10]])
    assert got == reference_plans(router, [q, q[:64], q[:10]])
    assert [len(p) for p in got] == [2, 1, 1] and got[0][1][2] == 32


def test_queries_shorter_than_a_window_exactly_one_and_many() -> None:
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, window_cap=1)
    q = ids(8 * 40, 7)
    base = [(int(q[w * 8 + o, 0]), 100 + w * 8 + o, 0) for w in range(40) for o in (0, 3, 5)]
    router = _router(cfg, base, [(int(q[8 * 39 + 7, 0]), 9999, 0)])
    qs = [q[:1], q[:7], q[:8], q[:9], q, q[8:], ids(20, 99)]
    assert kernel_plans(router, qs) == reference_plans(router, qs)
    assert [len(p) for p in kernel_plans(router, qs)] == [1, 1, 1, 2, 40, 39, 0]


# -- verify --------------------------------------------------------------------------------
def reference_verify(routed: kernel.Routed, segs: dict[int, Segment],
                     sb: int) -> list[tuple[int, int]]:
    out = []
    for row in routed.rows.tolist():
        start = int(routed.qstarts[row[kernel.Q]]) + row[kernel.W] * sb
        qw = routed.qids[start : start + row[kernel.LEN]]
        best, sid = 0, 0
        for s in routed.first[row[kernel.FSTART] : row[kernel.FSTART] + row[kernel.FCOUNT]]:
            c = segs.get(int(s))
            if c is not None and c.window == row[kernel.W]:
                run = min(verify.first_mismatch(c.ids, qw, REF), c.present_run(0))
                if run > best:
                    best, sid = run, int(s)
        out.append((best, sid))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds(), seed=st.integers(0, 2**32 - 1))
def test_verify_is_the_references_first_round(
        world: tuple[IndexConfig, Router, list[IdArray]], seed: int) -> None:
    cfg, router, qs = world
    sb = cfg.segment_blocks
    routed = router.route(qs, kern())
    rng = np.random.default_rng(seed)
    segs: dict[int, Segment] = {}
    for row in routed.rows.tolist():  # candidates: copies of the query, cut, holed, moved
        start = int(routed.qstarts[row[kernel.Q]]) + row[kernel.W] * sb
        qw = routed.qids[start : start + row[kernel.LEN]]
        for s in routed.first[row[kernel.FSTART] : row[kernel.FSTART] + row[kernel.FCOUNT]]:
            if int(s) in segs or rng.random() < 0.15:
                continue  # missing (or corrupt): not offered
            n = int(rng.integers(1, sb + 1))
            cand = np.resize(qw, (n, 2)).copy() if len(qw) else ids(n, 1)
            if rng.random() < 0.4:
                cand[int(rng.integers(n)), int(rng.integers(2))] ^= np.uint64(1)
            window = row[kernel.W] + (1 if rng.random() < 0.1 else 0)
            holes = sum(1 << i for i in range(n) if rng.random() < 0.2)
            presence = ((1 << n) - 1) & ~(holes if rng.random() < 0.3 else 0)
            segs[int(s)] = Segment(int(s), window, presence, 0, cand, np.zeros(n, np.uint64))
    best, sid = kernel.verify(kern(), routed, segs, sb)
    assert list(zip(best.tolist(), sid.tolist(), strict=True)) == reference_verify(routed, segs, sb)


# -- the index: the kernel's answers are the reference's -------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), exact=st.booleans())
def test_match_many_answers_what_the_reference_answers(seed: int, exact: bool) -> None:
    rng = np.random.default_rng(seed)
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=2,
                      window_cap=2, exact_match=exact)
    ix, ref = (SarpIndex(MemoryBackend(), cfg, kernels=k) for k in (native.pick(), REF))
    ix.recover()
    ref.recover()
    trunk = ids(40, seed % 1000)
    seqs = []
    for i in range(30):  # siblings of shared prefixes: ties past the cap, holders
        cut = int(rng.integers(0, 40))
        seq = np.concatenate([trunk[:cut], ids(int(rng.integers(1, 12)), seed + i)])
        seqs.append(seq)
        op = _insert(i, seq, int(rng.integers(1, 4)))
        for index in (ix, ref):
            index.write_many([op])
    queries = [Match(i, SeqSpec("", hashes=s[: int(rng.integers(0, len(s) + 1))]),
                     holders=int(rng.integers(0, 3)), with_ids=bool(i % 2))
               for i, s in enumerate(seqs)]
    assert _answers(ix.match_many(queries)) == _answers(ref.match_many(queries))
    # the one-call match runs the reference's bound-and-verify rounds, round for round
    assert ix.store.activity.extra_rounds == ref.store.activity.extra_rounds


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_views_kept_on_segments_follow_every_write(seed: int) -> None:
    """The kernel keeps what it read of a segment on it (`Segment._cview`) for later
    calls: a segment the store hands out never changes, so matches between writes that
    extend, refill, add holders to and remove from the same windows answer what the
    reference answers, round after round."""
    rng = np.random.default_rng(seed)
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, window_cap=2)
    ix, ref = (SarpIndex(MemoryBackend(), cfg, kernels=k) for k in (native.pick(), REF))
    for index in (ix, ref):
        index.recover()
    trunk = ids(30, seed % 997)
    seqs: list[IdArray] = []
    for step in range(12):
        ops: list[Insert | Remove] = []
        for i in range(4):
            cut = int(rng.integers(1, 31))
            seq = np.concatenate([trunk[:cut], ids(int(rng.integers(0, 9)), seed + 50 * step + i)])
            seqs.append(seq)
            ops.append(_insert(i, seq, int(rng.integers(1, 5))))
        if step % 3 == 2:  # blocks go: some of a sequence's, by id, one holder or all
            victim = seqs[int(rng.integers(0, len(seqs)))]
            take = victim[int(rng.integers(0, len(victim))):]
            ops.append(Remove(9, ns="", ids=take, meta=None if step % 2 else 1))
        for index in (ix, ref):
            index.write_many(ops)
        queries = [Match(j, SeqSpec("", hashes=s), holders=2)
                   for j, s in enumerate([*seqs[-6:], trunk])]
        assert _answers(ix.match_many(queries)) == _answers(ref.match_many(queries)), step
    if native.pick().match is not None:  # the views are kept where the store caches
        assert any(seg._cview is not None for _, seg in ix.store.cached_segments())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_match_takes_cached_segments_in_c_as_the_store_would(seed: int) -> None:
    """`match` takes what the store's segment cache holds from it in C (moving each to
    the recent end), the rest through `Store.read_views` (into the cache as stored
    values): under a cache far smaller than the index, writes and matches in turn
    answer, read the backend and leave the cache's order exactly as the same kernel
    reading every segment through `Store.fetch`."""
    rng = np.random.default_rng(seed)
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, window_cap=2)
    trunk = ids(30, seed % 991)
    steps = []
    for step in range(10):
        seqs = [np.concatenate([trunk[: int(rng.integers(1, 31))],
                                ids(int(rng.integers(0, 9)), seed + 40 * step + i)])
                for i in range(4)]
        cuts = [int(rng.integers(0, len(s) + 1)) for s in seqs]
        steps.append((seqs, cuts))

    def run(ix: SarpIndex) -> tuple[list[Any], list[int], int]:
        ix.recover()
        ix.store.cache_segments = 6
        got: list[Any] = []
        for step, (seqs, cuts) in enumerate(steps):
            ix.write_many([_insert(i, s, 1 + (step + i) % 3) for i, s in enumerate(seqs)])
            got += _answers(ix.match_many([Match(j, SeqSpec("", hashes=s[:c]), holders=2)
                                           for j, (s, c) in enumerate(zip(seqs, cuts,
                                                                          strict=True))]))
        order = [sid for sid, _ in ix.store.cached_segments()]
        return got, order, ix.store.activity.segment_reads

    with_cache = run(SarpIndex(MemoryBackend(), cfg, kernels=native.pick()))
    plain = kernel.match
    def fetch_all(*args: Any) -> Any:  # no cache: every segment through Store.fetch
        assert args[7].__name__ == "read_views"  # the store's read of the kernel's misses
        return plain(*args[:7], args[7].__self__.fetch, *args[8:11], None, *args[12:])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernel, "match", fetch_all)
        through_fetch = run(SarpIndex(MemoryBackend(), cfg, kernels=native.pick()))
    assert with_cache == through_fetch
    assert with_cache[2] > 0 and len(with_cache[1]) == 6  # the cache was too small


@pytest.mark.parametrize("locators", [True, False])
def test_match_runs_the_references_rounds_on_a_hot_prefix(locators: bool) -> None:
    """Hundreds of branches of one prefix, a cap of 2: windows whose first round falls
    short read further rounds (with block locators, a next block held nowhere settles
    its window first); answers (spans too, where asked) and rounds are the reference's."""
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, window_cap=2,
                      block_locators=locators)
    ix, ref = (SarpIndex(MemoryBackend(), cfg, kernels=k) for k in (native.pick(), REF))
    for index in (ix, ref):
        index.recover()
    trunk = ids(24, 7)
    rng = np.random.default_rng(7)
    ops = [_insert(i, np.concatenate([trunk[: int(rng.integers(1, 24))], ids(5, 100 + i)]),
                   int(rng.integers(1, 9))) for i in range(300)]
    for index in (ix, ref):
        index.write_many(ops)
    queries = [Match(i, SeqSpec("", hashes=np.concatenate([trunk[:cut], ids(3, 5000 + i)])),
                     holders=3, spans=bool(i % 2)) for i, cut in enumerate(range(1, 24))]
    queries += [Match(99, SeqSpec("", hashes=op.seq.hashes), holders=2, spans=j % 3 == 0)
                for j, op in enumerate(ops[:40]) if op.seq.hashes is not None]
    assert _answers(ix.match_many(queries)) == _answers(ref.match_many(queries))
    assert ix.store.activity.extra_rounds == ref.store.activity.extra_rounds > 0


def test_match_refuses_bad_callbacks_and_passes_their_errors_on() -> None:
    k = kern()
    u = np.zeros(1, np.uint64)
    q = np.ones((3, 2), np.uint64)
    good: list[Any] = [q, np.array([3], np.int64), np.ones(1, np.uint64), np.full(1, 5, np.uint64),
                       u, u[:0], u[:0], u[:0], np.zeros(0, np.int64), 8, 1, 2, lambda s: {},
                       None, np.zeros(1, np.int64), True]
    res, meta, tops, hspans, rounds = k.match(*good)  # segment 5 is missing: nothing matched
    assert (np.frombuffer(res, np.int64).tolist(), len(meta), len(tops), len(hspans),
            rounds) == ([0] * kernel.RES_FIELDS, 0, 0, 0, 0)
    for at, value, exc, word in [(12, 5, TypeError, "read"), (13, 7, TypeError, "indexed"),
                                 (14, np.zeros(2, np.int64), ValueError, "ks"),
                                 (12, lambda s: [], TypeError, "dict")]:
        args = list(good)
        args[at] = value
        with pytest.raises(exc, match=word):
            k.match(*args)

    def broken(sids: list[int]) -> dict[int, Segment]:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="on fire"):
        k.match(*good[:12], broken, *good[13:])
    with pytest.raises(TypeError, match="16 to 19 arguments"):
        k.match(*good[:5])
    with pytest.raises(TypeError, match="cache must be a SegmentCache or None, got dict"):
        k.match(*good, None, {})
    cache = native.pick().segment_cache(4)  # held segments are taken from it, not read
    cache.put_many({5: Segment(5, 0, 0b111, 0, q.copy(), np.full(3, 9, np.uint64))})
    cache.trace = []  # the kernel's hits are traced as `hits`' are
    res, meta, _, _, _ = k.match(*good[:12], broken, *good[13:], None, cache)
    assert cache.trace == [5]
    assert np.frombuffer(res, np.int64).tolist()[0] == 3
    assert np.frombuffer(meta, np.uint64).tolist() == [9, 9, 9]


def _insert(i: int, seq: IdArray, meta: int) -> Insert:
    return Insert(i, SeqSpec("", hashes=seq), meta=meta, add_holder=bool(i % 3))


def _answers(results: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for r in results:
        assert isinstance(r, MatchResult), r
        out.append((r.blocks, r.meta.tolist(), None if r.ids is None else r.ids.tolist(),
                    r.holders, r.spans))
    return out


# -- bad arguments: clear errors, no crash -----------------------------------------------------
def test_route_refuses_bad_arguments_by_name() -> None:
    k = kern()
    u = np.zeros(3, np.uint64)
    good = [np.ones((3, 2), np.uint64), np.array([3], np.int64), u, u, u, u, u, u,
            np.arange(3, dtype=np.int64), 8, 1, 2]
    assert k.route(*good) == (b"", b"")  # the query's key (1) is not in the directory
    cases: list[tuple[int, Any, type[Exception], str]] = [
        (0, np.zeros((3, 3), np.uint64), ValueError, "qids"),
        (1, np.array([2], np.int64), ValueError, "qlens sum"),
        (1, np.array([-1], np.int64), ValueError, "qlens"),
        (2, np.zeros(3, np.int64), TypeError, "bkeys"),
        (3, np.zeros(2, np.uint64), ValueError, "bsegs"),
        (8, np.array([0, 1, 5], np.int64), ValueError, "dorder"),
        (8, [0, 1, 2], TypeError, "dorder"),
        (9, 65, ValueError, "sb"),
        (11, 0, ValueError, "cap"),
        (12, np.zeros(4, np.int64), TypeError, "kfilter"),
    ]
    for at, value, exc, word in cases:
        args = [*good, np.zeros(4, np.uint64)]
        args[at] = value
        with pytest.raises(exc, match=word):
            k.route(*args)
    with pytest.raises(TypeError, match="12 or 13 arguments"):
        k.route(*good[:5])


def test_verify_refuses_bad_arguments_by_name() -> None:
    k = kern()
    qids = np.zeros((8, 2), np.uint64)
    rows = np.zeros((1, kernel.ROW_FIELDS), np.int64)
    rows[0, kernel.LEN] = 8
    starts, first = np.zeros(1, np.int64), np.zeros(0, np.uint64)
    assert k.verify(qids, starts, rows, first, {}, 8) == (bytes(8), bytes(8))
    with pytest.raises(TypeError, match="segs"):
        k.verify(qids, starts, rows, first, [], 8)
    with pytest.raises(ValueError, match="sb"):
        k.verify(qids, starts, rows, first, {}, 0)
    bad = rows.copy()
    bad[0, kernel.FCOUNT] = 1  # past `first`
    with pytest.raises(ValueError, match="rows\\[0\\]"):
        k.verify(qids, starts, bad, first, {}, 8)
    bad = rows.copy()
    bad[0, kernel.W] = 1  # past qids
    with pytest.raises(ValueError, match="rows\\[0\\]"):
        k.verify(qids, starts, bad, first, {}, 8)
    rows[0, kernel.FCOUNT] = 1
    one = np.array([5], np.uint64)
    with pytest.raises(AttributeError):
        k.verify(qids, starts, rows, one, {5: object()}, 8)
    assert k.verify(qids, starts, rows, one, {5: Segment(5, 0, 0b111, 0, qids[:5].copy(),
                                                          np.zeros(5, np.uint64))}, 8) == (
        (3).to_bytes(8, "little"), (5).to_bytes(8, "little"))


# -- assemble -------------------------------------------------------------------------------
@st.composite
def holder_segment(draw: st.DrawFn, sid: int, w: int, run: int, sb: int) -> Segment:
    """A segment of n >= run blocks, blocks [0, run) present, first holders and a
    holder table drawn from a small pool (many holders of one block, shared runs)."""
    n = draw(st.integers(run, sb))
    presence = (1 << run) - 1 | draw(st.integers(0, (1 << n) - 1))
    pool = st.integers(1, 6)
    meta = np.array(draw(st.lists(pool, min_size=n, max_size=n)), np.uint64)
    xmeta: list[int] = []
    xmask: list[int] = []
    if draw(st.booleans()):
        for h in sorted(draw(st.sets(pool, max_size=5))):
            mask = 0
            for b in range(n):
                if presence >> b & 1 and int(meta[b]) != h and draw(st.integers(0, 2)):
                    mask |= 1 << b
            if mask:
                xmeta.append(h)
                xmask.append(mask)
    return Segment(sid, w, presence, 0, ids(n, sid), meta, np.array(xmeta, np.uint64),
                   np.array(xmask, np.uint64))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_assemble_is_match_holders(data: st.DataObject) -> None:
    """Per query: blocks through the first short window, match_holders' meta per block,
    its top k holders (k from 0: none, to more than there are) and, where asked, its
    spans, with and without holder tables (csrc/holders.c against sarpd/core/holders.py)."""
    sb = 8
    nq = data.draw(st.integers(0, 5))
    rows, best, sids, spans, ks = [], [], [], [], []
    segs: dict[int, Segment] = {}
    for q in range(nq):
        lo = len(rows)
        ks.append(data.draw(st.integers(0, 9)))
        for w in range(data.draw(st.integers(0, 4))):
            length = data.draw(st.integers(1, sb))
            run = data.draw(st.integers(0, length))
            row = [0] * kernel.ROW_FIELDS
            row[kernel.Q], row[kernel.W], row[kernel.LEN] = q, w, length
            sid = 0
            if run:
                sid = len(segs) + 1
                segs[sid] = data.draw(holder_segment(sid, w, run, sb))
            rows.append(row)
            best.append(run)
            sids.append(sid)
        spans.append((lo, len(rows)))
    wants = data.draw(st.none() | st.lists(st.booleans(), min_size=nq, max_size=nq))
    routed = kernel.Routed(np.empty((0, 2), np.uint64), np.zeros(nq, np.int64),
                           np.array(rows, np.int64).reshape(-1, kernel.ROW_FIELDS),
                           np.empty(0, np.uint64), _router(SMALL, [], []).dir.flat())
    bounds = np.array([0, *(hi for _, hi in spans)], np.int64)  # spans tile the rows
    assert list(pairwise(bounds.tolist())) == spans
    got = kernel.assemble(kern(), routed, bounds, np.array(best, np.int64),
                          np.array(sids, np.uint64), segs, np.array(ks, np.int64),
                          None if wants is None else np.array(wants, np.int64))
    check_answers(*got, rows, spans, best, sids, segs, ks, wants)


def check_answers(res: kernel.I64Array, meta: U64Array, tops: U64Array, hspans: U64Array,
                  rows: list[list[int]], spans: list[tuple[int, int]], best: list[int],
                  sids: list[int], segs: dict[int, Segment], ks: list[int],
                  wants: list[bool] | None = None) -> None:
    """assemble's answers are the reference's: per query, blocks through the first
    short window, match_holders' metas and top k holders, and holders.spans' spans for
    the queries `wants` names (none where None)."""
    asked = wants if wants is not None else [False] * len(spans)
    for (lo, hi), k, want_spans, (total, start, tstart, ntop, sstart, nspans) in zip(
            spans, ks, asked, res.tolist(), strict=True):
        matched, want = [], 0
        for r in range(lo, hi):
            if sids[r]:
                matched.append((segs[sids[r]], best[r]))
            want += best[r]
            if best[r] < rows[r][kernel.LEN]:
                break
        assert total == want, "assemble: blocks"
        m, top = holders.match_holders(matched, k)
        assert meta[start : start + total].tolist() == m.tolist(), "assemble: metas"
        got = [(h, run) for h, run in tops[tstart : tstart + ntop].tolist()]
        assert got == (top or []), "assemble: top holders"
        got_spans = [(h, a, n) for h, a, n in hspans[sstart : sstart + nspans].tolist()]
        ref = holders.spans(holders.tables(matched)) if want_spans else []
        assert got_spans == ref, "assemble: spans"


# holder values at uint64's edges too: spans go by holder as unsigned
HOLDER_POOL = [0, 1, 2, 3, 7, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


@st.composite
def span_segment(draw: st.DrawFn, sid: int, w: int, sb: int, run: int, shape: str,
                 carry: int) -> Segment:
    """A window's segment of sb blocks, blocks [0, run) present, its holders shaped:
    "crowd" (up to 300 holders in the table, each holding block 0, then any blocks),
    "bands" (each holder one range of blocks, often to the window's end or from its
    start: runs across windows), "holes" (random masks, absent blocks past run), or
    "single" (one holder a block, no table: `carry` holds the window's first blocks, as
    the one before it ended)."""
    full = (1 << sb) - 1
    presence = (1 << run) - 1 | (draw(st.integers(0, full)) if shape == "holes" else full)
    if shape == "single":
        cut = draw(st.integers(0, sb))
        rest = draw(st.lists(st.sampled_from(HOLDER_POOL), min_size=sb - cut, max_size=sb - cut))
        meta = np.array([carry] * cut + rest, np.uint64)
        return Segment(sid, w, presence, 0, ids(sb, sid), meta)
    meta = np.array(draw(st.lists(st.sampled_from(HOLDER_POOL[:3]), min_size=sb, max_size=sb)),
                    np.uint64)
    if shape == "crowd":
        pool = draw(st.sets(st.integers(0, 2**64 - 1), min_size=1, max_size=300))
    else:
        pool = draw(st.sets(st.sampled_from(HOLDER_POOL) | st.integers(8, 40), max_size=12))
    xmeta = sorted(pool)
    xmask = []
    for _ in xmeta:
        if shape == "holes":
            mask = draw(st.integers(0, full))
        else:
            a = draw(st.sampled_from([0, 0, sb - 1]) | st.integers(0, sb - 1))
            b = draw(st.sampled_from([sb, sb]) | st.integers(a + 1, sb))
            mask = ((1 << b) - 1) ^ ((1 << a) - 1)
            if shape == "crowd":
                mask |= 1 | draw(st.integers(0, full))
        xmask.append(mask)
    return Segment(sid, w, presence, 0, ids(sb, sid), meta, np.array(xmeta, np.uint64),
                   np.array(xmask, np.uint64))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_assemble_spans_are_the_references_on_hard_windows(data: st.DataObject) -> None:
    """One query of many windows (up to 12 of 8 blocks, or 3 of 64), every window but
    the last full: its spans are holders.spans' (and brute force's) with hundreds of
    holders of one block, runs across window boundaries, holes, one holder a block
    (no tables), holders at uint64's edges; the metas and top holders stay the
    reference's."""
    sb = data.draw(st.sampled_from([8, 64]))
    nw = data.draw(st.integers(1, 12 if sb == 8 else 3))
    rows, best, sids, segs = [], [], [], {}
    carry = 0
    for w in range(nw):
        shape = data.draw(st.sampled_from(["crowd", "bands", "holes", "single"]))
        run = sb if w < nw - 1 else data.draw(st.integers(0, sb))
        row = [0] * kernel.ROW_FIELDS
        row[kernel.W], row[kernel.LEN] = w, sb
        sid = 0
        if run:
            sid = w + 1
            segs[sid] = data.draw(span_segment(sid, w, sb, run, shape, carry))
            carry = int(segs[sid].meta[sb - 1])
        rows.append(row)
        best.append(run)
        sids.append(sid)
    k = data.draw(st.integers(0, 5))
    routed = kernel.Routed(np.empty((0, 2), np.uint64), np.zeros(1, np.int64),
                           np.array(rows, np.int64).reshape(-1, kernel.ROW_FIELDS),
                           np.empty(0, np.uint64), _router(SMALL, [], []).dir.flat())
    got = kernel.assemble(kern(), routed, np.array([0, nw], np.int64), np.array(best, np.int64),
                          np.array(sids, np.uint64), segs, np.array([k], np.int64),
                          np.ones(1, np.int64))
    check_answers(*got, rows, [(0, nw)], best, sids, segs, [k], [True])
    res, hspans = got[0][0], got[3]
    matched = [(segs[s], b) for s, b in zip(sids, best, strict=True) if s]
    blocks = [{h for h, m in zip(t.holders.tolist(), t.masks.tolist(), strict=True)
               if m >> i & 1} for t in holders.tables(matched) for i in range(t.length)]
    assert [tuple(x) for x in hspans[res[kernel.SPANS] :].tolist()] == spans_of(blocks)


def test_assemble_and_match_refuse_a_bad_with_spans_by_name() -> None:
    k: Any = kern()  # called with arguments its protocol refuses
    rows = np.zeros((1, kernel.ROW_FIELDS), np.int64)
    rows[0, kernel.LEN] = 4
    args: list[Any] = [rows, np.array([[0, 1]], np.int64), np.zeros(1, np.int64),
                       np.zeros(1, np.uint64), {}, np.zeros(1, np.int64)]
    for with_spans in (None, np.zeros(1, np.int64), np.array([7], np.int64)):
        res, _, _, hspans = k.assemble(*args, with_spans)
        assert np.frombuffer(res, np.int64).tolist() == [0] * kernel.RES_FIELDS
        assert hspans == bytearray()
    cases: list[tuple[Any, type[Exception], str]] = [
        (np.zeros(1, np.uint64), TypeError, "with_spans must have dtype int64"),
        (np.zeros(1, bool), TypeError, "with_spans must have dtype int64"),
        ([1], TypeError, "with_spans must be a C-contiguous int64 array, got list"),
        (np.zeros((1, 1), np.int64), ValueError, "with_spans must be 1-dimensional"),
        (np.zeros(2, np.int64), ValueError, "with_spans has 2 entries for 1 queries"),
        (np.zeros(0, np.int64), ValueError, "with_spans has 0 entries for 1 queries"),
        (np.zeros(4, np.int64)[::2], TypeError, "with_spans must be a C-contiguous"),
    ]
    u = np.zeros(1, np.uint64)
    good: list[Any] = [np.ones((3, 2), np.uint64), np.array([3], np.int64), np.ones(1, np.uint64),
                       np.full(1, 5, np.uint64), u, u[:0], u[:0], u[:0], np.zeros(0, np.int64),
                       8, 1, 2, lambda s: {}, None, np.zeros(1, np.int64), True, None, None]
    for value, exc, words in cases:
        with pytest.raises(exc, match=words):
            k.assemble(*args, value)
        with pytest.raises(exc, match=words):
            k.match(*good, value)
    with pytest.raises(TypeError, match="6 or 7 arguments"):
        k.assemble(*args, None, None)
    with pytest.raises(TypeError, match="16 to 19 arguments"):
        k.match(*good, None, None)
    res_b, _, _, hspans, _ = k.match(*good, np.ones(1, np.int64))  # nothing matched: no span
    assert np.frombuffer(res_b, np.int64).tolist() == [0] * kernel.RES_FIELDS and not hspans
    empty = [np.empty((0, 2), np.uint64), np.zeros(0, np.int64), *good[2:14],
             np.zeros(0, np.int64), True, None, None]
    assert k.match(*empty, np.zeros(0, np.int64)) == (b"", bytearray(), bytearray(),
                                                      bytearray(), 0)
    with pytest.raises(ValueError, match="with_spans has 1 entries for 0 queries"):
        k.match(*empty, np.zeros(1, np.int64))


def test_verify_and_assemble_read_segments_whose_arrays_are_views() -> None:
    """A working copy's arrays may be strided views: read as they are, not refused."""
    k = kern()
    qids = ids(8, 3)
    rows = np.zeros((1, kernel.ROW_FIELDS), np.int64)
    rows[0, kernel.LEN], rows[0, kernel.FCOUNT] = 8, 1
    wide = np.repeat(qids, 2, axis=0)  # every row twice: [::2] is the query, strided
    meta = np.arange(16, dtype=np.uint64)
    seg = Segment(4, 0, 0xFF, 0, wide[::2], meta[::2])
    assert not seg.ids.flags.c_contiguous
    best, sid = k.verify(qids, np.zeros(1, np.int64), rows, np.array([4], np.uint64),
                         {4: seg}, 8)
    assert (best, sid) == ((8).to_bytes(8, "little"), (4).to_bytes(8, "little"))
    res, out, tops, hspans = k.assemble(rows, np.array([[0, 1]], np.int64),
                                        np.array([8], np.int64), np.array([4], np.uint64),
                                        {4: seg}, np.ones(1, np.int64), np.ones(1, np.int64))
    # blocks, starts, ntop; spans' start and count
    assert np.frombuffer(res, np.int64).tolist() == [8, 0, 0, 1, 0, 8]
    assert np.frombuffer(out, np.uint64).tolist() == meta[::2].tolist()
    assert np.frombuffer(tops, np.uint64).tolist() == [0, 1]  # holder 0 runs 1 block
    assert np.frombuffer(hspans, np.uint64).reshape(-1, 3).tolist() == [
        [2 * b, b, 1] for b in range(8)]  # one block each


# -- merge_order ----------------------------------------------------------------------------
EDGE_KEYS = st.sampled_from([0, 1, 2, 2**63, 2**64 - 2, 2**64 - 1]) | st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(EDGE_KEYS, max_size=40), max_size=6))
def test_delta_order_merge_is_the_references(steps: list[list[int]]) -> None:
    """The kernel's merge of appended rows (ties, the extremes of uint64, empty steps)
    gives the numpy reference's order and sorted keys, and both a stable argsort."""
    native_d, ref_d = _Delta(kern()), _Delta(None)
    for keys in steps:
        for key in keys:
            native_d.append(key, 1, 0)
            ref_d.append(key, 1, 0)
        got, want = native_d.order(), ref_d.order()
        assert got.tolist() == want.tolist()
        stable = np.argsort(native_d.keys[: native_d.n], kind="stable")
        assert got.tolist() == stable.tolist()
        assert native_d.sorted_keys().tolist() == native_d.keys[stable].tolist()


def test_merge_order_refuses_bad_arguments_by_name() -> None:
    k = kern()
    keys = np.array([3, 1, 2], np.uint64)
    assert [np.frombuffer(b, t).tolist() for b, t in zip(
        k.merge_order(keys, np.empty(0, np.int64), np.empty(0, np.uint64)),
        (np.int64, np.uint64), strict=True)] == [[1, 2, 0], [1, 2, 3]]
    with pytest.raises(TypeError, match="keys"):
        k.merge_order(keys.astype(np.int64), np.empty(0, np.int64), np.empty(0, np.uint64))
    with pytest.raises(TypeError, match="old_order"):
        k.merge_order(keys, np.empty(0, np.uint64), np.empty(0, np.uint64))
    with pytest.raises(ValueError, match="old_order and old_keys"):
        k.merge_order(keys, np.zeros(1, np.int64), np.empty(0, np.uint64))
    with pytest.raises(ValueError, match="at most"):
        k.merge_order(keys[:1], np.zeros(2, np.int64), np.zeros(2, np.uint64))
    with pytest.raises(TypeError, match="3 arguments"):
        k.merge_order(keys)


def test_verify_and_assemble_refuse_segs_that_are_not_a_dict() -> None:
    """Both read their segments from one argument, checked alike (segs_arg)."""
    assert K is not None
    with pytest.raises(TypeError, match="segs must be a dict of seg id -> Segment, got list"):
        K.verify(None, None, None, None, [], 64)
    with pytest.raises(TypeError, match="segs must be a dict of seg id -> Segment, got tuple"):
        K.assemble(None, None, None, None, (), None)
