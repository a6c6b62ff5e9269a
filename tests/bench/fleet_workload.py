"""Small fleet workloads for the fleet tests (shared system prompts, conversations that
grow turn by turn, branches from inside earlier turns, as `FleetRequest`s whose block
ids are prefix-chained: one id per distinct prefix), and a driver that checks an
index's every answer against the model."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from tools.bench.fleet_indexes import Answer, FleetIndex
from tools.bench.fleet_model import (
    Batch,
    FleetRequest,
    HolderMasks,
    Query,
    Timeline,
    build_timeline,
    ranked,
)

WORKERS = 4


class Prefixes:
    """A distinct id (and content hash) for every distinct block prefix."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def chain(self, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
        ids = []
        for i in range(len(blocks)):
            key = tuple(blocks[: i + 1])
            ids.append(self.ids.setdefault(key, len(self.ids) + 1))
        locals_ = [b * 7919 + 13 for b in blocks]
        return np.array(ids, dtype=np.uint64), np.array(locals_, dtype=np.uint64)


def fleet_requests(seed: int, n: int = 60, workers: int = 4, prompts: int = 3,
                   gap_ms: float = 5.0) -> list[FleetRequest]:
    """`n` requests: sessions start from one of `prompts` system prompts (2-5 blocks),
    grow by 1-4 blocks a turn, and sometimes branch from inside an earlier turn."""
    rng = random.Random(seed)
    pre = Prefixes()
    systems = [[1000 * (p + 1) + j for j in range(rng.randint(2, 5))] for p in range(prompts)]
    sessions: list[list[int]] = []
    out: list[FleetRequest] = []
    content = 1
    t = 0.0
    for i in range(n):
        roll = rng.random()
        if not sessions or roll < 0.25:
            sessions.append(list(rng.choice(systems)))
            s = len(sessions) - 1
        elif roll < 0.4:  # a branch: from inside a turn of another session
            base = rng.choice(sessions)
            sessions.append(base[: rng.randint(1, len(base))])
            s = len(sessions) - 1
        else:
            s = rng.randrange(len(sessions))
        blocks = sessions[s]
        for _ in range(rng.randint(1, 4)):
            blocks.append(content)
            content += 1
        hashes, locals_ = pre.chain(blocks)
        t += rng.choice([0.0, gap_ms, 2 * gap_ms])
        out.append(FleetRequest(i, t, s, s % workers, hashes, locals_, rng.randint(1, 6)))
    return out


def expected(truth: np.ndarray, k: int = WORKERS) -> Answer:
    return dict(ranked({w: int(r) for w, r in enumerate(truth.tolist())}, k))


def drive(index: FleetIndex, entries: Sequence[Query | Batch],
          masks: HolderMasks, recheck: list[Query], every: int = 5) -> int:
    """Replay `entries` unpaced; every query's answer must equal the model's, and every
    `every` batches the newest queries are asked again against the masks kept from the
    batches. Returns the queries checked."""
    checked = batches = 0
    index.prepare(entries)
    for e in entries:
        if isinstance(e, Query):
            assert index.query(e) == expected(e.truth), f"request {e.request}"
            recheck.append(e)
            checked += 1
            continue
        index.apply(e)
        masks.apply(e)
        batches += 1
        if batches % every == 0:
            for q in recheck[-3:]:
                assert index.query(q) == expected(masks.runs(q.hashes.tolist()))
                checked += 1
    return checked


def final_check(index: FleetIndex, masks: HolderMasks, queries: list[Query]) -> None:
    index.drain()
    for q in queries:
        assert index.query(q) == expected(masks.runs(q.hashes.tolist())), f"request {q.request}"


def small_timeline(seed: int = 3, n: int = 150, gpu_blocks: int = 14) -> Timeline:
    """4 engines whose caches evict, with prompts several of them hold at once."""
    tl = build_timeline(fleet_requests(seed, n=n, workers=WORKERS), WORKERS, gpu_blocks,
                        tpot_ms=4.0)
    assert tl.totals.removed_blocks > 0
    assert any((q.truth > 0).sum() > 1 for q in tl.queries())
    return tl
