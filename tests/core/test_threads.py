"""`SarpIndex.match_many` from several threads at once, no writes meanwhile (issue 25):
every thread's answers are the single-threaded answers, bit for bit.

The index is built single-threaded from a seeded random workload with hot shared
prefixes (a few system prompts every session starts with), multi-turn sessions,
branches from inside a history, retries (siblings one block apart), many holders
(several workers insert the same sequences, protocol 2) and removals; its
single-threaded answers are checked against the holder oracle first. Then 2-4 threads
run match batches (shuffled, each batch mixing tokens and caller ids, `holders` and
`with_ids`) against those answers. What the read path shares is made to churn: a
decoded-segment cache of a few segments (every batch evicts), a block map of one entry
a generation and a narrow `window_cap` (bound-and-verify rounds, each asking the block
map), the interpreter switching threads every microsecond, the match kernel and the
verifier releasing the GIL at every call.

The pieces the read path shares are also driven alone, where a race shows at once:
the block map's lookups (each moves what it finds: LRU) and the segment cache (a hit
moves to the recent end while another thread may be trimming).
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core import native
from sarpd.core.blockmap import BlockMap
from sarpd.core.ids import salt_ids, token_ids
from sarpd.core.index import SarpIndex
from sarpd.core.native import BlockMapLike
from sarpd.core.segcache import SegmentCache
from sarpd.core.segment import Segment
from sarpd.core.store import open_backend
from sarpd.errors import SarpError
from sarpd.model import IdArray, Insert, Match, MatchResult, Remove, RemoveResult, SeqSpec
from tests.core.test_index import DEFAULT, TINY, tokens
from tests.oracle import BT, HolderOracle

WORKER = 48  # a holder is its worker's word (meta >> 48)
GEOMETRIES = {  # test_index's, with 2 candidates a first round: hot windows take rounds
    "tiny": replace(TINY, window_cap=2),  # 8-block windows, a block map of ~4 blocks
    "default": replace(DEFAULT, window_cap=2, block_map_bytes=128),
}

Toks = tuple[int, ...]
Write = tuple[str, str, Toks, int]  # kind, ns, tokens, holder (remove: start << 16 | worker)
Answer = tuple[int, list[int], list[list[int]] | None, list[tuple[int, int]] | None]


def blocks(rng: random.Random, n: int) -> Toks:
    return tuple(rng.randrange(50_000) for _ in range(n * BT))


def workload(seed: int) -> tuple[list[Write], list[tuple[str, Toks]]]:
    """(writes, histories): writes ("insert" | "remove", ns, tokens, holder) in order,
    and every sequence written (what the matches ask, whole, cut and extended)."""
    rng = random.Random(seed)
    systems = [blocks(rng, rng.randrange(3, 30)) for _ in range(3)]  # hot shared prefixes
    writes: list[Write] = []
    histories: list[tuple[str, Toks]] = []
    for _ in range(40):  # sessions
        ns = rng.choice(["", "", "lora"])
        hist = rng.choice(systems) + blocks(rng, rng.randrange(0, 12))
        for _ in range(rng.randrange(1, 6)):  # turns
            for worker in rng.sample(range(6), rng.randrange(1, 4)):  # many holders
                writes.append(("insert", ns, hist, worker << WORKER))
            histories.append((ns, hist))
            if rng.random() < 0.3:  # a branch from inside the history
                cut = rng.randrange(len(hist) // BT + 1) * BT
                branch = hist[:cut] + blocks(rng, rng.randrange(1, 10))
                writes.append(("insert", ns, branch, rng.randrange(6) << WORKER))
                histories.append((ns, branch))
            if rng.random() < 0.15:  # a worker evicts the tail of a history
                start = rng.randrange(len(hist) // BT + 1)
                writes.append(("remove", ns, hist, start << 16 | rng.randrange(6)))
            hist = hist + blocks(rng, rng.randrange(1, 14))
    for ns, hist in rng.sample(histories, 3):  # retries: siblings one block apart, so
        for _ in range(30):  # that fingerprints tie past the cap (further rounds)
            sibling = hist + blocks(rng, 1)
            writes.append(("insert", ns, sibling, rng.randrange(6) << WORKER))
            histories.append((ns, sibling))
    return writes, histories


def build(ix: SarpIndex, writes: Sequence[Write], oracle: HolderOracle) -> None:
    for kind, ns, toks, arg in writes:
        if kind == "insert":
            [res] = ix.write_many([Insert(0, SeqSpec(ns, tokens=tokens(toks)), meta=arg,
                                          add_holder=True)])
            assert not isinstance(res, Exception), res
            oracle.insert(ns, toks, arg, add=True)
        else:
            start, worker = arg >> 16, (arg & 0xFFFF) << WORKER
            [res] = ix.write_many([Remove(0, seq=SeqSpec(ns, tokens=tokens(toks)),
                                          start=start, meta=worker)])
            assert isinstance(res, RemoveResult), res
            assert res.removed == oracle.remove(ns, toks, start, worker)


def requests(histories: Sequence[tuple[str, Toks]], seed: int) -> list[tuple[Match, str, Toks]]:
    """Every history whole, cut short and extended by a block nobody has; as tokens or
    as caller ids, some with holders and ids asked."""
    rng = random.Random(seed + 1)
    out: list[tuple[Match, str, Toks]] = []
    for ns, toks in histories:
        n = len(toks) // BT
        for t in (toks, toks[: rng.randrange(n + 1) * BT], toks + blocks(rng, 1)):
            if rng.random() < 0.5:
                seq = SeqSpec(ns, tokens=tokens(t))
            else:
                seq = SeqSpec(ns, hashes=salt_ids(ns, token_ids(ns, tokens(t), BT)))  # ext. form
            out.append((Match(len(out), seq, with_ids=rng.random() < 0.3,
                              holders=rng.choice([0, 0, 1, 4])), ns, t))
    return out


def answer(r: MatchResult | SarpError) -> Answer:
    assert isinstance(r, MatchResult), r
    return (r.blocks, np.asarray(r.meta).tolist(),
            None if r.ids is None else np.asarray(r.ids).tolist(),
            None if r.holders is None else [(int(h), int(n)) for h, n in r.holders])


def batched(reqs: Sequence[Match], seed: int) -> list[list[int]]:
    """The requests' indexes shuffled into batches of 1-24."""
    rng = random.Random(seed + 2)
    order = list(range(len(reqs)))
    rng.shuffle(order)
    out, at = [], 0
    while at < len(order):
        k = rng.randrange(1, 25)
        out.append(order[at : at + k])
        at += k
    return out


def on_threads(ix: SarpIndex, reqs: Sequence[Match], batches: Sequence[list[int]],
               threads: int, rounds: int) -> Iterator[tuple[int, Answer]]:
    """Every batch `rounds` times, spread over `threads` threads started together, the
    interpreter switching between them every microsecond: (request, answer) pairs."""
    got: list[list[tuple[int, Answer]]] = [[] for _ in range(threads)]

    def work(k: int) -> None:
        mine = [b for r in range(rounds) for b in batches[(k + r) % threads :: threads]]
        for b in mine:
            for i, res in zip(b, ix.match_many([reqs[i] for i in b]), strict=True):
                got[k].append((i, answer(res)))

    together(threads, work)
    for mine in got:
        yield from mine


@pytest.fixture
def gil_free() -> Iterator[None]:
    """The kernels release the GIL for any work, however little (by default only past
    a few thousand ids, which these small batches never reach)."""
    k = native.pick()
    hooks = [getattr(m, "_set_gil_free_min", None) for m in (k.match, k.verify)]
    was = [h(0) if h is not None else 0 for h in hooks]
    try:
        yield
    finally:
        for h, w in zip(hooks, was, strict=True):
            if h is not None:
                h(w)


@pytest.mark.usefixtures("gil_free")
@pytest.mark.parametrize(("geometry", "backend", "seed"), [
    ("tiny", "memory", 1), ("tiny", "rocksdb", 2), ("default", "rocksdb", 3),
    ("default", "memory", 4)])
@pytest.mark.parametrize("threads", [2, 4])
def test_match_many_on_threads_answers_as_one_thread(geometry: str, backend: str, seed: int,
                                                     threads: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="sarp-threads-"))
    ix = SarpIndex(open_backend(backend, root / "db", cache_bytes=1 << 22),
                   GEOMETRIES[geometry], None, sync=False)
    try:
        ix.recover()
        oracle = HolderOracle()
        writes, histories = workload(seed)
        build(ix, writes, oracle)
        if seed % 2:
            ix.fold()  # segments whole on the backend (else most are merged in memory)
        found = requests(histories, seed)
        reqs = [m for m, _, _ in found]
        one = [answer(r) for r in ix.match_many(reqs)]  # the single-threaded answers
        for (m, ns, t), (n, meta, _, top) in zip(found, one, strict=True):
            want_meta, want_top = oracle.match(ns, t, m.holders)
            assert (n, meta) == (len(want_meta), want_meta)
            assert top == (want_top if m.holders else None)
        assert sum(a[0] for a in one) > 0
        ix.store.cache_segments = 3  # every batch evicts: the cache churns between threads
        ix.store.forget_segments()
        rounds0, lookups0 = ix.activity.extra_rounds, map_lookups(ix)
        batches = batched(reqs, seed)
        seen = [0] * len(reqs)
        for i, got in on_threads(ix, reqs, batches, threads, rounds=2):
            assert got == one[i], (i, got, one[i])
            seen[i] += 1
        assert seen == [2] * len(reqs)
        # the shared paths ran: further rounds asking the block map, cache misses
        assert ix.activity.extra_rounds > rounds0 and map_lookups(ix) > lookups0
        assert ix.check().clean
    finally:
        ix.close()
        shutil.rmtree(root, ignore_errors=True)


def map_lookups(ix: SarpIndex) -> int:
    """The ids the block map was asked for so far."""
    assert ix.store.blockmap is not None
    st = ix.store.blockmap.stats()
    return st["hits"] + st["misses"]


# -- the shared pieces alone ----------------------------------------------------------------
def together(threads: int, work: Callable[[int], None]) -> None:
    """`work(k)` on `threads` threads started together, switching every microsecond."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(k: int) -> None:
        try:
            start.wait()
            work(k)
        except BaseException as exc:  # raised by the test thread
            errors.append(exc)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    finally:
        sys.setswitchinterval(before)
    if errors:
        raise errors[0]


MapMaker = Callable[[int, int], BlockMapLike]


def map_impls() -> list[object]:
    """The block maps a store may run: the reference and, when built, the native one."""
    k = native.pick().map
    return [pytest.param(BlockMap, id="reference"),
            pytest.param(k.BlockMap if k is not None else None, id="native",
                         marks=pytest.mark.skipif(k is None, reason="sarpd.core._cmap not built"))]


def map_of(impl: MapMaker, n: int, generation: int) -> tuple[BlockMapLike, IdArray]:
    """A block map holding n blocks (block i at head i, position i % 64), in frozen
    generations of `generation` entries."""
    rng = np.random.default_rng(n)
    ids = rng.integers(1, 2**63, (n, 2), dtype=np.uint64)
    bm = impl(1 << 30, generation)
    assert bm.add(ids, np.arange(n, dtype=np.uint64), np.arange(n) % 64) is None
    return bm, ids


def held(bm: BlockMapLike) -> int:
    """The entries the map really holds (its own count, `len`, must say the same): the
    reference's, counted in its generations; the native one's by its count."""
    if not isinstance(bm, BlockMap):
        return len(bm)
    return len(bm.young) + sum(int(g.alive.sum()) for g in bm.gens)


@pytest.mark.parametrize("impl", map_impls())
def test_block_map_lookups_on_threads_find_every_block(impl: MapMaker) -> None:
    """A lookup moves what it finds out of its frozen generation (LRU): lookups from
    four threads at once (a block now and then twice in one) find every block where
    it is and lose none (a lost entry is neither in the map nor spilled: present, not
    found)."""
    n = 512
    bm, ids = map_of(impl, n, 16)
    bad: list[int] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        for _ in range(500):
            sel = rng.integers(0, n, 6)
            heads, pos = bm.lookup(ids[sel])
            if heads.tolist() != sel.tolist() or pos.tolist() != (sel % 64).tolist():
                bad.append(k)

    together(4, work)
    assert not bad
    assert len(bm) == held(bm) == n
    heads, _ = bm.lookup(ids)
    assert heads.tolist() == list(range(n))


@pytest.mark.parametrize("impl", map_impls())
def test_a_block_asked_twice_in_one_lookup_leaves_its_generation_once(impl: MapMaker) -> None:
    """Several inserts after one parent in a batch ask the block map for it at once
    (`WriteTxn.locate`): the generation it leaves must count it out once, else the
    generation is dropped as empty while it still holds blocks, which are then neither
    in the map nor spilled as locator records."""
    bm, ids = map_of(impl, 8, 4)
    bm.lookup(ids[[0, 0]])
    assert len(bm) == held(bm) == 8
    bm.lookup(ids[[1]])
    bm.lookup(ids[[2, 2, 2]])
    assert len(bm) == held(bm) == 8
    assert bm.lookup(ids)[0].tolist() == list(range(8))


class _Slow(SegmentCache):
    """The reference cache yielding the interpreter after each hit: whatever another
    thread does to the cache between a hit and the next happens."""

    def hits(self, sids: Iterable[int]) -> tuple[dict[int, Segment], list[int]]:
        got: dict[int, Segment] = {}
        missing: list[int] = []
        for sid in sids:
            hit, miss = super().hits([sid])
            got.update(hit)
            missing += miss
            time.sleep(0)
        return got, missing


@pytest.mark.parametrize("slow", [True, False], ids=["reference-yielding", "the-index's"])
def test_the_segment_cache_on_threads_serves_every_segment(slow: bool) -> None:
    """Reads from four threads through a cache of 3 segments (every read evicts):
    every read gets its segments, the cache keeps its size; the reference cache
    yielding between hits, and the index's own (the native one where it is built)."""
    ix = SarpIndex(MemoryBackend(), IndexConfig())
    ix.recover()
    rng = np.random.default_rng(5)
    seqs = [rng.integers(1, 2**63, (64, 2), dtype=np.uint64) for _ in range(12)]
    ix.write_many([Insert(0, SeqSpec("", hashes=s), meta=i + 1) for i, s in enumerate(seqs)])
    ix.fold()
    store = ix.store
    sids = list(range(1, ix.counters.next_seg))
    want = store.read(sids)
    assert len(want) == 12
    store.segment_cache = _Slow(3) if slow else native.pick().segment_cache(3)

    def work(k: int) -> None:
        r = random.Random(k)
        for _ in range(400):
            asked = r.sample(sids[:5], 3)  # mostly hits, each read evicts
            got = store.read(asked)
            assert {s: int(g.meta[0]) for s, g in got.items()} == {
                s: int(want[s].meta[0]) for s in asked}

    together(4, work)
    assert len(store.cached_segments()) == 3
