"""The router (sarpd/core/router.py): the deepest routing point of each window (one
routine for batches and single windows), pruned and refined points, siblings, and
the ranking of candidates past `window_cap`. Segments are read through a loader
over a plain dict: the router reads nothing else."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from sarpd.config import IndexConfig
from sarpd.core.ids import token_ids
from sarpd.core.router import Router
from sarpd.core.segment import Loader, Segment
from sarpd.model import IdArray

# 8-block windows, base points at 0 and 4, refinement down to single blocks
TINY = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=2,
                   prune_max_pred=1, window_cap=64)


def ids(n: int, seed: int) -> IdArray:
    toks = np.random.default_rng(seed).integers(0, 1 << 30, 16 * n).astype(np.uint32)
    return token_ids("", toks, 16)


class World:
    """Segments by id, and a router that registers them as the write path does."""

    def __init__(self, cfg: IndexConfig = TINY) -> None:
        self.router = Router(cfg)
        self.segs: dict[int, Segment] = {}
        self.loads: list[list[int]] = []

    def load(self, sids: Iterable[int]) -> Mapping[int, Segment | None]:
        wanted = list(sids)
        self.loads.append(wanted)
        return {s: self.segs.get(s) for s in wanted}

    def add(self, window: int, blocks: IdArray, fresh_from: int) -> int:
        sid = len(self.segs) + 1
        seg = self.segs[sid] = Segment(sid, window, (1 << len(blocks)) - 1, 0,
                                       blocks, np.zeros(len(blocks), np.uint64))
        loader: Loader = self.load
        self.router.register(seg, loader, old_n=0, fresh_from=fresh_from)
        return sid


def test_new_content_is_routed_at_its_head_only() -> None:
    w = World()
    q = ids(8, 1)
    a = w.add(0, q, 0)
    assert w.router.dir.entries == 1  # base point 4 pruned: its predecessor lists one
    assert w.router.deepest([q]) == [[0]]
    assert w.router.route_window(q, 0) == [a]
    assert w.router.deepest([q[:1]]) == [[0]]
    assert w.router.deepest([ids(8, 2)]) == [[]]  # unknown content: no hit


def test_deepest_point_with_pruned_points_and_a_branch() -> None:
    w = World()
    q = ids(8, 1)
    a = w.add(0, q, 0)
    branch = np.concatenate([q[:5], ids(3, 9)])
    b = w.add(0, branch, 5)  # a copy of a's head, then its own blocks
    # the head lists two now: point 4 is no longer pruned, and lists a (a sibling) too
    assert sorted(w.router.dir.posting(int(q[4, 0]))[0].tolist()) == [a, b]
    assert w.loads == [[a]]  # the sibling was read through the loader
    assert w.router.deepest([q, branch, q[:4]]) == [[4], [4], [0]]
    assert sorted(w.router.route_window(q, 0)) == [a, b]
    diverged = np.concatenate([q[:3], ids(5, 7)])  # leaves both before point 4
    assert w.router.deepest([diverged]) == [[0]]


def first_rounds(w: World, qs: list[np.ndarray]) -> list[list[list[int]]]:
    """Per query, per window: the first-round candidates of its plan."""
    return [[p.first for p in plans] for plans in w.router.plan_many(qs)]


def test_windows_are_contiguous_from_the_first() -> None:
    w = World()
    q = ids(24, 3)
    a0 = w.add(0, q[:8], 0)
    a1 = w.add(1, q[8:16], 0)
    a2 = w.add(2, q[16:24], 0)
    assert w.router.deepest([q]) == [[0, 0, 0]]
    assert first_rounds(w, [q]) == [[[a0], [a1], [a2]]]
    gap = q.copy()
    gap[8:16] = ids(8, 4)  # window 1 unknown: window 2 cannot extend the match
    assert w.router.deepest([gap]) == [[0]]
    assert first_rounds(w, [gap, q[:8]]) == [[[a0]], [[a0]]]


def test_plan_many_and_route_window_agree() -> None:
    w = World()
    base = ids(16, 5)
    for seed in range(6):  # branches off a shared prefix: refined and base points
        cut = 2 + seed
        w.add(0, np.concatenate([base[:cut], ids(8 - cut, 10 + seed)]), cut)
    qs = [base[:8], base[:3], np.concatenate([base[:6], ids(2, 99)])]
    many = first_rounds(w, qs)
    for q, per_window in zip(qs, many, strict=True):
        assert per_window == [w.router.route_window(q[:8], 0)]


def test_a_long_posting_list_is_refined() -> None:
    w = World()
    head = ids(1, 6)
    sids = [w.add(0, np.concatenate([head, ids(7, 20 + i)]), 1) for i in range(3)]
    # the head's list reached refine_threshold + 1 = 3: a point 2 blocks deeper splits
    # it, and lists every segment under the head at its own block there
    for sid in sids:
        assert w.router.dir.has(int(w.segs[sid].ids[2, 0]), sid)
    first = w.segs[sids[0]].ids  # pruned at 4 (it was alone): the refined point routes it
    assert w.router.deepest([first]) == [[2]]
    assert w.router.route_window(first, 0) == [sids[0]]  # one candidate instead of three
    third = w.segs[sids[2]].ids  # listed at base point 4 (its predecessor lists two)
    assert w.router.deepest([third]) == [[4]]


def test_ranking_reads_the_strongest_candidates_only() -> None:
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=50,
                      prune_max_pred=1, window_cap=2)
    w = World(cfg)
    head = ids(1, 7)
    sids = [w.add(0, np.concatenate([head, ids(7, 40 + i)]), 1) for i in range(6)]
    target = w.segs[sids[3]].ids
    near = np.concatenate([target[:4], ids(4, 77)])  # agrees on 3 blocks after the head
    w.add(0, near, 4)
    ranked = w.router.plan_at(target, 0, 0).first
    assert len(ranked) == 2 and ranked[0] == sids[3]  # full agreement first
    assert w.router.plan_at(target, 0, 0).first == ranked  # the same ranking again
    assert len(w.router.dir.posting(int(head[0, 0]))[0]) == 7
