"""The fleet's indexes against the model: a small fleet (4 engines, caches small enough
to evict, shared system prompts, branches) into a real sarpd, in-process sarp,
Dynamo's radix tree (when the wheel is here) and a real redis-server (when it is);
every query's per-holder answer must equal the engines' true runs, also across a
kill -9 of sarpd."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.bench.fleet_workload import fleet_requests
from tests.daemon_helpers import Launcher, SarpdProc
from tools.bench.fleet_indexes import (
    Answer,
    DynamoRadix,
    FleetConfig,
    FleetIndex,
    RedisLlmd,
    dynamo_available,
    pod_runs,
)
from tools.bench.fleet_model import Batch, HolderMasks, Query, Timeline, build_timeline, ranked
from tools.bench.fleet_sarp import SarpDirect, SarpInProcess

WORKERS = 4
CFG = FleetConfig(WORKERS, WORKERS)
needs_dynamo = pytest.mark.skipif(not dynamo_available(), reason="ai-dynamo-runtime not installed")
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None and
                                 not Path("/usr/bin/redis-server").exists(),
                                 reason="redis-server not installed")


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    tl = build_timeline(fleet_requests(3, n=150, workers=WORKERS), WORKERS, 14, tpot_ms=4.0)
    assert tl.totals.removed_blocks > 0  # the caches evict
    shared = [q for q in tl.queries() if (q.truth > 0).sum() > 1]
    assert shared  # prompts held by several engines at once
    return tl


def expected(truth: np.ndarray, k: int = WORKERS) -> Answer:
    return dict(ranked({w: int(r) for w, r in enumerate(truth.tolist())}, k))


def drive(index: FleetIndex, entries: tuple[Query | Batch, ...] | list[Query | Batch],
          masks: HolderMasks, recheck: list[Query], every: int = 5) -> int:
    """Replay `entries` unpaced; every query's answer must equal the model's, and every
    `every` batches the newest queries are asked again against the masks kept from the
    batches. Returns the queries checked."""
    checked = batches = 0
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


@pytest.fixture
def direct(sarpd_factory: Launcher) -> Iterator[tuple[SarpDirect, SarpdProc]]:
    proc = sarpd_factory()
    index = SarpDirect(CFG, socket=proc.socket)
    yield index, proc
    index.close()


@pytest.mark.parametrize("per_worker", [False, True], ids=["shared-ns", "ns-per-worker"])
def test_sarpd_answers_every_holder_as_the_model(sarpd_factory: Launcher, tmp_path: Path,
                                                 timeline: Timeline, per_worker: bool) -> None:
    proc = sarpd_factory()
    index = SarpDirect(CFG, per_worker=per_worker, socket=proc.socket)
    index.open(tmp_path)
    try:
        masks, seen = HolderMasks(WORKERS), list[Query]()
        assert drive(index, timeline.entries, masks, seen) > timeline.totals.requests
        final_check(index, masks, seen)
    finally:
        index.close()


@pytest.mark.parametrize("per_worker", [False, True], ids=["shared-ns", "ns-per-worker"])
def test_in_process_sarp_answers_as_the_model(tmp_path: Path, timeline: Timeline,
                                              per_worker: bool) -> None:
    index = SarpInProcess(CFG, per_worker)
    index.open(tmp_path)
    try:
        masks, seen = HolderMasks(WORKERS), list[Query]()
        drive(index, timeline.entries, masks, seen)
        index.crash()  # closed without a snapshot and reopened: the same answers
        rec = index.recovery()
        assert rec is not None and rec.ready_s > 0
        final_check(index, masks, seen)
    finally:
        index.close()


@needs_dynamo
def test_dynamo_radix_answers_as_the_model(tmp_path: Path, timeline: Timeline) -> None:
    index = DynamoRadix(CFG)
    index.open(tmp_path)
    masks, seen = HolderMasks(WORKERS), list[Query]()
    drive(index, timeline.entries, masks, seen)
    final_check(index, masks, seen)
    index.close()


@needs_redis
def test_redis_llmd_answers_as_the_model(tmp_path: Path, timeline: Timeline) -> None:
    index = RedisLlmd(CFG)
    index.open(tmp_path)
    try:
        masks, seen = HolderMasks(WORKERS), list[Query]()
        drive(index, timeline.entries, masks, seen)
        final_check(index, masks, seen)
    finally:
        index.close()


def test_pod_runs_stop_where_no_pod_holds_the_prefix() -> None:
    assert pod_runs([[b"1", b"2"], [b"2"], [b"1", b"2"], []]) == {1: 1, 2: 3}
    assert pod_runs([[b"3"], [b"1"], [b"1"]]) == {3: 1}
    assert pod_runs([[], [b"1"]]) == {}


def test_kill_9_keeps_every_acknowledged_event(tmp_path: Path, timeline: Timeline,
                                               direct: tuple[SarpDirect, SarpdProc]) -> None:
    index, proc = direct
    index.open(tmp_path)
    half = len(timeline.entries) // 2
    masks, seen = HolderMasks(WORKERS), list[Query]()
    drive(index, timeline.entries[:half], masks, seen)
    index.drain()  # every batch so far acknowledged (sync always)
    proc.kill()
    proc.start()  # the same data dir and socket; ready
    final_check(index, masks, seen)  # the link reconnects: nothing was lost
    drive(index, timeline.entries[half:], masks, seen)
    final_check(index, masks, seen)
    assert index.link.losses == 1 and index.link.resent == 0


def test_kill_9_with_writes_in_flight_resends_them(tmp_path: Path, timeline: Timeline,
                                                   direct: tuple[SarpDirect, SarpdProc]) -> None:
    index, proc = direct
    index.open(tmp_path)
    third = len(timeline.entries) // 3
    masks, seen = HolderMasks(WORKERS), list[Query]()
    drive(index, timeline.entries[:third], masks, seen)
    batches = [e for e in timeline.entries[third:] if isinstance(e, Batch)]
    for b in batches[:10]:  # pipelined, not waited for
        index.apply(b)
        masks.apply(b)
    proc.kill()
    proc.start(wait=False)
    answered = 0
    for b in batches[10:]:  # made while sarpd is down or recovering
        index.apply(b)
        masks.apply(b)
        a = index.query(seen[-1])  # once back: after the resent writes, so exact
        if a is not None:
            assert a == expected(masks.runs(seen[-1].hashes.tolist()))
            answered += 1
    final_check(index, masks, seen)  # drain waits for sarpd, then everything was resent
    assert index.link.resent > 0 and index.link.losses >= 1
