"""The copies map (sarpd/core/copies.py) against the full walk of a window's copies.

Branchy engine-like streams on a hot window (a system prompt that every session
starts with, branches from inside sessions, re-stores by other holders, removals by
one holder and by every holder, refills of removed blocks, clears, inserts after a
parent), applied to an index whose writer answers from the map (every window indexed;
and with a tiny bound, so windows are dropped and rebuilt) and to one that always walks
(the reference: `max_rows=0` indexes nothing): the same answers, matches with holders,
counters, `check()` and byte-identical stores. Also after a reopen, a reload and
failed commits (enospc: not applied; fsync: applied, never acknowledged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.faulty import FaultyBackend
from backends.memory import MemoryBackend
from sarpd.core.copies import Copies
from sarpd.core.index import SarpIndex, WriteOp
from sarpd.core.segment import Segment
from sarpd.core.writer import WriteTxn
from sarpd.errors import SarpError, StorageError
from sarpd.model import Clear, Insert, Match, MatchResult, Remove, SeqSpec
from tests.core.test_write_batches import NS, TINY, ids

PROMPT = list(range(1, 6))  # the hot system prompt: window 0's head in every session


@dataclass(frozen=True)
class Stream:
    ops: list[WriteOp]
    cuts: list[int]  # batch boundaries
    chains: list[list[int]]


@st.composite
def hot_streams(draw: st.DrawFn) -> Stream:
    chains: list[list[int]] = [PROMPT]
    ops: list[WriteOp] = [Insert(0, SeqSpec(NS, hashes=ids(PROMPT)), meta=0, add_holder=True)]
    next_hash = 100
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["session", "session", "branch", "restore", "remove",
                                     "remove", "clear"]))
        worker = draw(st.integers(0, 5)) << 48
        if kind in ("session", "branch"):
            k = draw(st.integers(1, 12))
            new = list(range(next_hash, next_hash + k))
            next_hash += k
            base = PROMPT if kind == "session" else draw(st.sampled_from(chains))
            at = draw(st.integers(0, len(base) - 1))  # a branch from anywhere
            chains.append(base[: at + 1] + new)
            if draw(st.booleans()):  # after a parent
                ops.append(Insert(0, SeqSpec(NS, hashes=ids(new)), meta=worker,
                                  parent=ids([base[at]]), add_holder=True))
            else:  # the whole chain from its root
                ops.append(Insert(0, SeqSpec(NS, hashes=ids(chains[-1])), meta=worker,
                                  add_holder=draw(st.booleans())))
        elif kind == "restore":  # refills what was removed, adds a holder elsewhere
            chain = draw(st.sampled_from(chains))
            ops.append(Insert(0, SeqSpec(NS, hashes=ids(chain)), meta=worker,
                              add_holder=draw(st.booleans())))
        elif kind == "remove":
            chain = draw(st.sampled_from(chains))
            lo = draw(st.integers(0, len(chain) - 1))
            hi = draw(st.integers(lo + 1, len(chain)))
            who = None if draw(st.booleans()) else worker
            if draw(st.booleans()):
                ops.append(Remove(0, ns=NS, ids=ids(chain[lo:hi]), meta=who))
            else:  # by sequence, from a block on
                ops.append(Remove(0, seq=SeqSpec(NS, hashes=ids(chain[:hi])), start=lo,
                                  meta=who))
        else:
            ops.append(Clear(0, ns=NS, mask=0xFF << 48, value=worker))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(ops)), max_size=8))) | {len(ops)})
    return Stream(ops, cuts, chains)


def answer(r: object) -> object:
    return type(r).__name__ if isinstance(r, SarpError) else r


def new_index(copies: Copies, backend: MemoryBackend | FaultyBackend | None = None) -> SarpIndex:
    ix = SarpIndex(backend if backend is not None else MemoryBackend(), TINY, sync=False)
    ix.store.copies = copies
    return ix


def indexed() -> Copies:
    return Copies(TINY.segment_blocks, min_copies=0)


def walked() -> Copies:
    return Copies(TINY.segment_blocks, max_rows=0)  # indexes nothing: the reference walk


def run(ix: SarpIndex, stream: Stream) -> list[object]:
    out: list[object] = []
    start = 0
    for cut in stream.cuts:
        out += [answer(r) for r in ix.write_many(stream.ops[start:cut])]
        start = cut
    return out


def state(ix: SarpIndex, chains: list[list[int]]) -> object:
    got = ix.match_many([Match(0, SeqSpec(NS, hashes=ids(c)), holders=8) for c in chains])
    found = []
    for r in got:
        assert isinstance(r, MatchResult)
        found.append((r.blocks, r.meta.tolist(), r.holders))
    c = ix.counters
    return found, c.blocks, c.holdings, c.segments, ix.check().problems


def store_bytes(ix: SarpIndex) -> dict[bytes, bytes]:
    return dict(ix.backend.scan(b"", b"\xff"))


@settings(max_examples=120, deadline=None)
@given(hot_streams())
def test_the_map_answers_as_the_walk(stream: Stream) -> None:
    ref = new_index(walked())
    ref_out = run(ref, stream)
    assert ref.store.copies.answered == 0
    for copies in (indexed(), Copies(TINY.segment_blocks, min_copies=0, max_rows=6)):
        ix = new_index(copies)
        assert run(ix, stream) == ref_out
        assert state(ix, stream.chains) == state(ref, stream.chains)
        assert store_bytes(ix) == store_bytes(ref)
        assert copies.rows <= copies.max_rows


def holding(txn: WriteTxn, sids: list[int], o: int, want: list[int]) -> list[int]:
    out = []
    for sid in sids:
        c = txn.cache[sid]
        assert isinstance(c, Segment)
        if c.has_at(o, want):
            out.append(sid)
    return out


@settings(max_examples=60, deadline=None)
@given(hot_streams())
def test_the_map_lists_every_copy_the_walk_finds(stream: Stream) -> None:
    """Per block of every chain: the map's candidates that hold it are the walk's
    segments that hold it, in the walk's order."""
    ix = new_index(indexed())
    run(ix, stream)
    txn = WriteTxn(ix.store, ix.router)
    sb = TINY.segment_blocks
    for chain in stream.chains:
        q = ix.store.seq_ids(SeqSpec(NS, hashes=ids(chain)))
        for p in range(len(chain)):
            w, o = divmod(p, sb)
            head = int(q[w * sb, 0])

            want = q[p].tolist()
            walk = txn._walk(w, head)
            got = txn._window_segments_at(w, head, np.array([o]), q[p : p + 1, 0])
            assert holding(txn, got, o, want) == holding(txn, walk, o, want)
    assert ix.store.copies.answered > 0


def test_hot_window_is_indexed_past_min_copies_and_bounded() -> None:
    """Sessions sharing a prompt: the window is walked while it has few copies, then
    answered from the map; removals count as the walk's."""
    ix, ref = new_index(Copies(TINY.segment_blocks, min_copies=4)), new_index(walked())
    for k in range(12):
        chain = [*PROMPT[:3], 1000 + 10 * k, 1001 + 10 * k]
        for x in (ix, ref):
            x.write_many([Insert(0, SeqSpec(NS, hashes=ids(chain)), meta=k << 48)])
    assert ix.store.copies.windows == 0  # new sessions never walk
    ops: list[WriteOp] = [Remove(0, ns=NS, ids=ids([1000 + 10 * k]), meta=k << 48)
                          for k in range(12)]
    assert [answer(r) for r in ix.write_many(ops)] == [answer(r) for r in ref.write_many(ops)]
    assert ix.store.copies.windows == 1 and ix.store.copies.rows == 12
    assert ix.store.copies.answered == 11
    assert ix.stats()["copies_rows"] == 12
    assert state(ix, [PROMPT]) == state(ref, [PROMPT])


def test_an_open_transaction_drops_the_map() -> None:
    copies = indexed()
    ix = new_index(copies)
    for k in range(3):
        ix.write_many([Insert(0, SeqSpec(NS, hashes=ids([*PROMPT, 50 + k])), meta=k)])
    ix.write_many([Remove(0, ns=NS, ids=ids([50]), meta=0)])
    assert copies.windows == 1
    txn = WriteTxn(ix.store, ix.router)  # never commits
    txn.apply(Insert(0, SeqSpec(NS, hashes=ids([*PROMPT, 60])), meta=9))
    assert copies.rows == 4
    WriteTxn(ix.store, ix.router)  # the next one finds the map open
    assert copies.windows == 0 and copies.rows == 0


@pytest.mark.parametrize("mode", ["enospc", "fsync"])
@settings(max_examples=40, deadline=None)
@given(stream=hot_streams(), fail_at=st.integers(0, 7), reopen_at=st.integers(0, 7))
def test_exact_after_failed_commits_reloads_and_reopens(mode: str, stream: Stream,
                                                        fail_at: int, reopen_at: int) -> None:
    """Failed commits and a reopen, the map against the walk: the same answers, blocks
    and holdings, and a clean check. A reopened index re-routes its segments (recovery
    rebuilds the directory: a posting list's order may change), so a write after it may
    choose another of two equally good candidates and lay out one segment more or
    fewer: its segments and bytes are compared only when no write followed a reopen."""
    fast, slow = FaultyBackend(MemoryBackend()), FaultyBackend(MemoryBackend())
    ix, ref = new_index(indexed(), fast), new_index(walked(), slow)
    start = 0
    for i, cut in enumerate(stream.cuts):
        batch = stream.ops[start:cut]
        start = cut
        outs = []
        for x, b in ((ix, fast), (ref, slow)):
            b.set_mode(mode if i == fail_at else "")
            try:
                outs.append([answer(r) for r in x.write_many(batch)])
            except StorageError:
                outs.append(["failed"])
            b.set_mode("")
        assert outs[0] == outs[1]
        if i == reopen_at:  # a reopen: a new index over the same backend
            ix = new_index(ix.store.copies, fast)
            ix.recover()
            assert ix.store.copies.rows == 0
    got, want = state(ix, stream.chains), state(ref, stream.chains)
    if reopen_at < len(stream.cuts) - 1:  # a write followed the reopen
        assert isinstance(got, tuple) and isinstance(want, tuple)
        (found, blocks, holdings, _, problems) = got
        assert (found, blocks, holdings, problems) == (want[0], want[1], want[2], want[4])
        return
    assert got == want
    assert store_bytes(ix) == store_bytes(ref)
