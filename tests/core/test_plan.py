"""Bound-and-verify rounds (sarpd/core/plan.py): which unread candidates a window reads
next, given the best run verified so far."""

from __future__ import annotations

import numpy as np

from sarpd.core.plan import WindowPlan, held
from sarpd.core.routing import filter_at, fingerprints
from tests.core.test_routing import _differs_at, ids

QW = ids(64, seed=9)  # the query's window; its filter at offset 16 is QF
QF = filter_at(fingerprints(QW, 64), 16)


def plan(agreements: list[int], first: list[int], length: int = 64, offset: int = 16,
         chunk: int = 2, first_bound: int | None = None) -> WindowPlan:
    """Candidates 1, 2, ... whose agreement with the query is `agreements[i]`; the
    first round's weakest bound defaults to the window (nothing settled by it)."""
    filts = [QF if a >= 16 else _differs_at(QF, a) for a in agreements]
    segs = np.arange(1, len(agreements) + 1, dtype=np.uint64)
    return WindowPlan(0, length, offset, first, segs.size,
                      held(segs, np.array(filts, dtype=np.uint64)), QW[:length], 64, chunk,
                      length if first_bound is None else first_bound)


def test_no_round_when_the_first_round_read_everything() -> None:
    p = plan([16, 16], first=[2, 1])
    assert p.more(0) == []


def test_more_reads_only_candidates_whose_bound_beats_the_run() -> None:
    # bounds: 16 + 1 + agreement, or the window (64) for full agreement
    p = plan([16, 3, 16, 9, 0, 16, 12], first=[7, 6])
    assert p.more(40) == [3, 1]  # only the full agreements can pass 40: newest first
    assert p.more(40) == []  # the rest is bounded by 16 + 1 + 9 = 26 at most
    assert p.rounds == 2


def test_rounds_double_and_go_strongest_first() -> None:
    p = plan([16] * 9, first=[9, 8], chunk=2)
    assert p.more(10) == [7, 6]
    assert p.more(10) == [5, 4, 3, 2]
    assert p.more(10) == [1]
    assert p.more(10) == []
    assert p.rounds == 4


def test_lower_floor_reaches_weaker_candidates_and_a_full_run_stops() -> None:
    p = plan([16, 3, 9, 16], first=[4], chunk=1)
    assert p.more(25) == [1]  # bound 64; candidate 3 (bound 26) beats 25 too but ranks after
    assert p.more(25) == [3]  # a round of 2: only candidate 3 is left above 25
    assert p.more(0) == [2]  # bound 20
    assert plan([16, 16], first=[2]).more(64) == []  # the window is full: nothing beats it


def test_offer_keeps_the_first_of_equal_runs() -> None:
    p = plan([16, 16], first=[1, 2])
    p.offer(1, 30)
    p.offer(2, 30)
    p.offer(3, 29)
    assert (p.best, p.best_sid) == (30, 1)
    p.offer(3, 31)
    assert (p.best, p.best_sid) == (31, 3)


def test_the_first_rounds_weakest_bound_settles_without_computing_the_rest() -> None:
    p = plan([16, 3, 9, 16], first=[4, 1], first_bound=30)
    assert p.open(29) and not p.open(30)  # nothing unread can beat the weakest read
    assert p.more(30) == [] and p._rest is None  # no bound of the rest was computed


def test_settle_and_an_empty_round_close_the_plan() -> None:
    p = plan([16, 3, 9, 16], first=[4])
    p.settle()
    assert not p.open(0) and p.more(0) == []
    q = plan([3, 3, 3], first=[3])
    assert q.more(40) == [] and q.settled and not q.open(0)  # bounds 20: none beats 40
