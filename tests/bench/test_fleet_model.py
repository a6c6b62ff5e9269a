"""The fleet's engine model against a brute-force copy of vLLM's BlockPool, and the
timeline's truth against per-worker sets rebuilt from its own events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.bench.fleet_workload import fleet_requests
from tools.bench.fleet_model import (
    Batch,
    Engine,
    FleetRequest,
    Query,
    Removed,
    Stored,
    build_timeline,
    load_requests,
)


@dataclass
class Block:
    hash: int | None = None
    ref: int = 0


@dataclass
class BrutePool:
    """vLLM v1's BlockPool, literally: G block objects, a free list (head = next to
    allocate), a hash -> block map; freeing appends a request's blocks tail first."""

    g: int
    tpot: float
    blocks: list[Block] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    cached: dict[int, int] = field(default_factory=dict)
    running: list[tuple[float, int, list[int]]] = field(default_factory=list)
    clock: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.blocks = [Block() for _ in range(self.g)]
        self.free = list(range(self.g))

    def _finish(self, upto: float | None) -> bool:
        self.running.sort()
        if not self.running or (upto is not None and self.running[0][0] > upto):
            return False
        _, _, ids = self.running.pop(0)
        for b in reversed(ids):
            self.blocks[b].ref -= 1
            if self.blocks[b].ref == 0:
                self.free.append(b)
        return True

    def serve(self, req: FleetRequest) -> tuple[float, list[int], list[int], int | None]:
        """(admission time, evicted hashes, stored hashes, parent)."""
        hashes = req.hashes[: self.g].tolist()
        t = max(req.t_ms, self.clock)
        while self._finish(t):
            pass
        k = 0
        while k < len(hashes) and hashes[k] in self.cached:
            k += 1
        hit_ids = [self.cached[h] for h in hashes[:k]]
        while len(hashes) - k > len(self.free) - sum(self.blocks[b].ref == 0 for b in hit_ids):
            self.running.sort()
            t = max(t, self.running[0][0])
            self._finish(None)
        self.clock = t
        for b in hit_ids:
            if self.blocks[b].ref == 0:
                self.free.remove(b)
            self.blocks[b].ref += 1
        evicted, new_ids = [], []
        for h in hashes[k:]:
            b = self.free.pop(0)
            old = self.blocks[b].hash
            if old is not None:
                del self.cached[old]
                evicted.append(old)
            self.blocks[b] = Block(h, 1)
            self.cached[h] = b
            new_ids.append(b)
        self.running.append((t + max(req.output_tokens, 1) * self.tpot, self.n, hit_ids + new_ids))
        self.n += 1
        return t, evicted, hashes[k:], hashes[k - 1] if k and k < len(hashes) else None

    def in_use(self) -> int:
        return sum(b.ref > 0 for b in self.blocks)


def _split(batch: Batch | None) -> tuple[list[int], list[int], int | None]:
    if batch is None:
        return [], [], None
    removed = [h for e in batch.events if isinstance(e, Removed) for h in e.hashes.tolist()]
    stored = [e for e in batch.events if isinstance(e, Stored)]
    if not stored:
        return removed, [], None
    return removed, stored[0].hashes.tolist(), stored[0].parent


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("g", [6, 11, 40])
def test_engine_matches_brute_force_block_pool(seed: int, g: int) -> None:
    reqs = [r for r in fleet_requests(seed, n=80, workers=1) if r.worker == 0]
    engine, brute = Engine(0, g, tpot_ms=3.0), BrutePool(g, 3.0)
    evictions = 0
    for r in reqs:
        batch = engine.serve(r)
        t, evicted, stored, parent = brute.serve(r)
        assert _split(batch) == (evicted, stored, parent)
        if batch is not None:
            assert batch.t_ms == t
        assert engine.cached() == set(brute.cached)
        assert engine.in_use == brute.in_use()
        evictions += len(evicted)
    if g < 40:
        assert evictions  # the small caches do evict


def _req(i: int, t: float, hashes: list[int], out: int = 1) -> FleetRequest:
    h = np.array(hashes, dtype=np.uint64)
    return FleetRequest(i, t, 0, 0, h, h + np.uint64(100), out)


def test_eviction_order_is_lru_of_free_blocks_tail_first() -> None:
    e = Engine(0, 4, tpot_ms=1.0)
    e.serve(_req(0, 0.0, [1, 2]))  # holds 1, 2 until t=1
    e.serve(_req(1, 2.0, [3, 4]))  # 1, 2 freed (2 first); holds 3, 4 until t=3
    batch = e.serve(_req(2, 5.0, [5, 6, 7]))  # free queue: 2, 1, 4, 3
    assert batch is not None
    assert [ev.hashes.tolist() for ev in batch.events] == [[2, 1, 4], [5, 6, 7]]
    assert isinstance(batch.events[1], Stored) and batch.events[1].parent is None
    assert e.cached() == {3, 5, 6, 7}


def test_a_hit_takes_a_free_block_out_of_the_eviction_queue() -> None:
    e = Engine(0, 4, tpot_ms=1.0)
    e.serve(_req(0, 0.0, [1, 2]))
    e.serve(_req(1, 2.0, [3, 4]))  # free queue after t=3: 2, 1, 4, 3
    batch = e.serve(_req(2, 5.0, [1, 8, 9]))  # hits 1: evicts 2 and 4, not 1
    assert batch is not None
    removed, stored = batch.events
    assert removed.hashes.tolist() == [2, 4]
    assert isinstance(stored, Stored) and stored.parent == 1 and stored.hashes.tolist() == [8, 9]


def test_blocks_in_use_are_never_evicted_a_request_waits_for_them() -> None:
    e = Engine(0, 4, tpot_ms=10.0)
    e.serve(_req(0, 0.0, [1, 2, 3], out=5))  # in use until t=50
    batch = e.serve(_req(1, 1.0, [7, 8]))  # needs 2, 1 free: waits until t=50
    assert batch is not None and batch.t_ms == 50.0
    assert batch.events[0].hashes.tolist() == [3]  # tail of the finished request first
    later = e.serve(_req(2, 2.0, [9]))  # FIFO: admitted after the waiting one
    assert later is not None and later.t_ms == 50.0


def test_a_request_that_hits_everything_makes_no_events() -> None:
    e = Engine(0, 8)
    e.serve(_req(0, 0.0, [1, 2, 3]))
    assert e.serve(_req(1, 1.0, [1, 2])) is None


@pytest.mark.parametrize("seed", range(4))
def test_timeline_truth_equals_the_workers_caches_at_each_query(seed: int) -> None:
    reqs = fleet_requests(seed, n=120, workers=4)
    tl = build_timeline(reqs, 4, 12, tpot_ms=4.0)
    held: list[set[int]] = [set() for _ in range(4)]
    seen, last = set(), -1.0
    for e in tl.entries:
        assert e.t_ms >= last
        last = e.t_ms
        if isinstance(e, Query):
            runs = []
            for w in range(4):
                r = 0
                while r < len(e.hashes) and int(e.hashes[r]) in held[w]:
                    r += 1
                runs.append(r)
            assert e.truth.tolist() == runs
            seen.add(e.request)
        else:
            for ev in e.events:
                (held[e.worker].update if isinstance(ev, Stored) else
                 held[e.worker].difference_update)(ev.hashes.tolist())
    assert seen == set(range(len(reqs)))
    engines = [Engine(w, 12, 4.0) for w in range(4)]
    for r in sorted(reqs, key=lambda r: (r.t_ms, r.index)):
        engines[r.worker].serve(r)
    assert [e.cached() for e in engines] == held
    t = tl.totals
    assert t.block_ops == t.query_blocks + t.stored_blocks + t.removed_blocks
    assert t.query_blocks == sum(len(r.hashes) for r in reqs)
    assert t.removed_blocks > 0 and sum(q.truth.max() > 0 for q in tl.queries()) > 0


def test_a_query_comes_before_its_own_events() -> None:
    tl = build_timeline(fleet_requests(1, n=40, workers=2), 2, 16)
    query_at: dict[int, int] = {}
    batches = 0
    for i, e in enumerate(tl.entries):
        if isinstance(e, Query):
            query_at[e.request] = i
        else:
            assert query_at[e.request] < i
            batches += 1
    assert batches == tl.totals.batches > 0


def test_load_requests_reads_a_mooncake_trace(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 5, "input_length": 70, "output_length": 4, "hash_ids": [1, 2, 3]},
            {"timestamp": 9, "input_length": 40, "output_length": 2, "hash_ids": [7, 8]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs = load_requests(path, workers=2, trace_block_tokens=32)
    assert [len(r.hashes) for r in reqs] == [2, 4, 2]  # 40 // 16, 70 // 16
    assert [r.t_ms for r in reqs] == [0.0, 5.0, 9.0]
    assert [r.output_tokens for r in reqs] == [3, 4, 2]
    assert [r.worker for r in reqs] == [0, 0, 1]  # row 2 continues row 1's session
    assert reqs[1].hashes[:2].tolist() == reqs[0].hashes.tolist()
    assert reqs[1].locals[:2].tolist() == reqs[0].locals.tolist()
    assert not set(reqs[2].hashes.tolist()) & set(reqs[0].hashes.tolist())
    coarse = load_requests(path, workers=2, trace_block_tokens=32, block_tokens=32)
    assert [len(r.hashes) for r in coarse] == [1, 2, 1]
    assert coarse[1].hashes[0] == coarse[0].hashes[0]
    assert load_requests(path, workers=2, trace_block_tokens=32, limit=2)[-1].index == 1
    with pytest.raises(ValueError, match="multiple of 16"):
        load_requests(path, workers=2, trace_block_tokens=32, block_tokens=24)
