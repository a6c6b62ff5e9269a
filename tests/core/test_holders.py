"""The holders of a match (sarpd/core/holders.py) against a brute-force model: runs
from position 0, each block's answer, the top K; random windows of random holder
sets, with hot holders that hold everything and holes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import holders as H
from sarpd.core.segment import Segment
from tests.oracle import spans_of


def build(sets: list[set[int]], sid: int) -> Segment:
    """A segment whose block i has holders sets[i] (all present, non-empty)."""
    n = len(sets)
    seg = Segment(sid, 0, (1 << n) - 1, 0, np.zeros((n, 2), np.uint64),
                  np.array([max(s) for s in sets], np.uint64))  # any holder may be first
    for i, s in enumerate(sets):
        for h in sorted(s - {max(s)}):
            assert seg.add_holder(i, h)
    return seg


Ranked = list[tuple[int, int]]


def brute(blocks: list[set[int]], k: int) -> tuple[dict[int, int], list[int], Ranked]:
    everyone = set().union(*blocks) if blocks else set()
    run = {}
    for h in everyone:
        r = 0
        while r < len(blocks) and h in blocks[r]:
            r += 1
        run[h] = r
    meta = [min(b, key=lambda h: (-run[h], h)) for b in blocks]
    ranked = sorted(((h, r) for h, r in run.items() if r > 0), key=lambda x: (-x[1], x[0]))
    return run, meta, ranked[:k]


holder_sets = st.sets(st.integers(0, 12), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(windows=st.lists(st.lists(holder_sets, min_size=1, max_size=64), min_size=1, max_size=4),
       hot=st.booleans(), k=st.integers(1, 20))
def test_runs_meta_and_top_equal_the_model(windows: list[list[set[int]]], hot: bool,
                                           k: int) -> None:
    # every window but the last is full (64 blocks), as in a match
    full = [w + [set(w[-1])] * (64 - len(w)) for w in windows[:-1]]
    windows = [*full, windows[-1]]
    if hot:  # one holder of everything (a system prompt every worker holds)
        windows = [[s | {99} for s in w] for w in windows]
    segs = [(build(w, i + 1), len(w)) for i, w in enumerate(windows)]
    blocks = [s for w in windows for s in w]
    run, meta, ranked = brute(blocks, k)
    tabs = H.tables(segs)
    holders, runs = H.runs(tabs)
    got = dict(zip(holders.tolist(), runs.tolist(), strict=True))
    assert {h: r for h, r in got.items() if r} == {h: r for h, r in run.items() if r}
    assert H.block_meta(tabs, holders, runs).tolist() == meta
    assert H.top(holders, runs, k) == ranked
    assert H.single_holder(segs) == all(len(s) == 1 for s in blocks)
    assert H.spans(tabs) == spans_of(blocks)


def test_spans_by_hand() -> None:
    """Runs that start past 0, holes, and a run across a window boundary."""
    w0 = [{1}] * 62 + [{1, 2}, {2, 3}]
    w1 = [{2, 3}, {3}, {2}]
    tabs = H.tables([(build(w0, 1), 64), (build(w1, 2), 3)])
    assert H.spans(tabs) == [(1, 0, 63), (2, 62, 3), (2, 66, 1), (3, 63, 3)]


def test_a_partial_last_window_and_absent_blocks_past_it() -> None:
    seg = build([{1, 2}, {1, 2}, {2}, {1}], 5)
    seg.presence = 0b0111  # block 3 absent: the match stops before it
    tabs = H.tables([(seg, 3)])
    holders, runs = H.runs(tabs)
    assert dict(zip(holders.tolist(), runs.tolist(), strict=True)) == {1: 2, 2: 3}
    assert H.block_meta(tabs, holders, runs).tolist() == [2, 2, 2]
    assert H.top(holders, runs, 1) == [(2, 3)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(windows=st.lists(st.lists(holder_sets, min_size=1, max_size=64), min_size=1, max_size=3),
       k=st.integers(0, 5), single=st.booleans())
def test_match_holders_is_the_model_with_or_without_tables(
        windows: list[list[set[int]]], k: int, single: bool) -> None:
    """The one-holder-a-block shortcut answers what the general path answers."""
    full = [w + [set(w[-1])] * (64 - len(w)) for w in windows[:-1]]
    windows = [*full, windows[-1]]
    if single:
        windows = [[{min(s)} for s in w] for w in windows]
    segs = [(build(w, i + 1), len(w)) for i, w in enumerate(windows)]
    _, meta, ranked = brute([s for w in windows for s in w], k)
    got_meta, got_top = H.match_holders(segs, k)
    assert got_meta.tolist() == meta
    assert got_top == (ranked if k else None)
