"""The write path over whole batches (sarpd/core/writer.py with sarpd/core/_cwrite.c):
random engine-like event streams (stores after a parent, branches from the middle of
a chain, re-stores of a chain by another holder, removals by holder and of every
holder), applied

- one operation per write batch and in batches: the same answer to every operation
  and the same matches afterwards (the batch's prefetch routes inserts after a
  parent before earlier operations of the batch moved them);
- with the native kernels and the references (`native.pick(reference=True)`):
  byte-identical stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core import native
from sarpd.core.index import SarpIndex, WriteOp
from sarpd.core.native import Kernels
from sarpd.core.writer import Prefetched, WriteTxn
from sarpd.errors import SarpError
from sarpd.model import Insert, Match, MatchResult, Remove, SeqSpec

TINY = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=2,
                   prune_max_pred=1, window_cap=2)
NS = "w"


def ids(hashes: list[int]) -> np.ndarray:
    out = np.zeros((len(hashes), 2), dtype=np.uint64)
    out[:, 0] = hashes
    return out


@dataclass(frozen=True)
class Stream:
    ops: list[WriteOp]
    cuts: list[int]  # batch boundaries
    chains: list[list[int]]  # every chain stored, from its root


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    chains: list[list[int]] = []
    ops: list[WriteOp] = []
    next_hash = 1
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["store", "store", "store", "restore", "remove"]))
        worker = draw(st.integers(0, 3))
        if kind == "store" or not chains:
            k = draw(st.integers(1, 10))
            new = list(range(next_hash, next_hash + k))
            next_hash += k
            parent = None
            if chains and draw(st.booleans()):
                base = draw(st.sampled_from(chains))
                at = draw(st.integers(0, len(base) - 1))  # a branch from anywhere
                parent = base[at]
                chains.append(base[: at + 1] + new)
            else:
                chains.append(new)
            ops.append(Insert(0, SeqSpec(NS, hashes=ids(new)), meta=worker << 48,
                              parent=None if parent is None else ids([parent]),
                              add_holder=True))
        elif kind == "restore":  # another holder stores a chain again, from its root
            chain = draw(st.sampled_from(chains))
            ops.append(Insert(0, SeqSpec(NS, hashes=ids(chain)), meta=worker << 48,
                              add_holder=True))
        else:
            chain = draw(st.sampled_from(chains))
            lo = draw(st.integers(0, len(chain) - 1))
            hi = draw(st.integers(lo + 1, len(chain)))
            who = None if draw(st.booleans()) else worker << 48
            ops.append(Remove(0, ns=NS, ids=ids(chain[lo:hi]), meta=who))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(ops)), max_size=6))) | {len(ops)})
    return Stream(ops, cuts, chains)


def answer(r: object) -> object:
    return type(r).__name__ if isinstance(r, SarpError) else r


def replay(stream: Stream, cuts: list[int], kernels: Kernels | None = None
           ) -> tuple[SarpIndex, list[object]]:
    ix = SarpIndex(MemoryBackend(), TINY, sync=False, kernels=kernels)
    out: list[object] = []
    start = 0
    for cut in cuts:
        out += [answer(r) for r in ix.write_many(stream.ops[start:cut])]
        start = cut
    return ix, out


def matches(ix: SarpIndex, chains: list[list[int]]) -> list[tuple[int, list[int], object]]:
    got = ix.match_many([Match(0, SeqSpec(NS, hashes=ids(c)), holders=8) for c in chains])
    out = []
    for r in got:
        assert isinstance(r, MatchResult)
        out.append((r.blocks, r.meta.tolist(), r.holders))
    return out


@settings(max_examples=120, deadline=None)
@given(streams())
def test_batches_answer_as_one_operation_at_a_time(stream: Stream) -> None:
    single, one_by_one = replay(stream, list(range(1, len(stream.ops) + 1)))
    batched, in_batches = replay(stream, stream.cuts)
    assert in_batches == one_by_one
    assert matches(batched, stream.chains) == matches(single, stream.chains)
    assert batched.counters.blocks == single.counters.blocks
    assert batched.counters.holdings == single.counters.holdings
    assert batched.check().problems == [] and single.check().problems == []


@settings(max_examples=80, deadline=None)
@given(streams())
def test_the_native_path_writes_what_the_reference_writes(stream: Stream) -> None:
    fast, fast_out = replay(stream, stream.cuts)
    ref, ref_out = replay(stream, stream.cuts, native.pick(reference=True))
    assert fast_out == ref_out
    assert dict(fast.backend.scan(b"", b"\xff")) == dict(ref.backend.scan(b"", b"\xff"))


def fresh_windows_checked(stream: Stream) -> list[int]:
    """Replay `stream` with `WriteTxn._fresh` checked: wherever it says a window is fresh
    (the insert skips `_best` there), `_best`, routed by the same prefetch, must find no
    candidate. Returns the windows taken as fresh."""
    fresh, taken = WriteTxn._fresh, []

    def checked(txn: WriteTxn, w: int, qw: np.ndarray, routed: Prefetched | None) -> bool:
        got = fresh(txn, w, qw, routed)
        if got:
            taken.append(w)
            assert txn._best(w, qw, None, routed) == (None, 0)
        return got

    WriteTxn._fresh = checked  # type: ignore[method-assign]
    try:
        replay(stream, stream.cuts)
    finally:
        WriteTxn._fresh = fresh  # type: ignore[method-assign]
    return taken


@settings(max_examples=80, deadline=None)
@given(streams())
def test_a_window_taken_as_fresh_is_one_best_finds_nothing_in(stream: Stream) -> None:
    fresh_windows_checked(stream)


def test_a_new_chain_is_all_fresh_windows_and_a_restore_none() -> None:
    """A chain of 20 blocks into an empty index: its 3 windows (8 blocks each) are
    fresh; the same chain again by another holder: none is."""
    chain = list(range(1, 21))
    ops: list[WriteOp] = [Insert(0, SeqSpec(NS, hashes=ids(chain)), meta=1, add_holder=True),
                          Insert(0, SeqSpec(NS, hashes=ids(chain)), meta=2, add_holder=True)]
    assert fresh_windows_checked(Stream(ops, [1, 2], [chain])) == [0, 1, 2]
