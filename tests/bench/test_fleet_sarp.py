"""sarp in the fleet benchmark against the model: a small fleet (4 engines, caches
small enough to evict, shared system prompts, branches) into a REAL sarpd and into
SarpIndex in-process; every per-holder answer must equal the engines' true runs, also
across a kill -9 of sarpd (acknowledged writes kept, unacknowledged ones resent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.fleet_workload import WORKERS, drive, expected, final_check, small_timeline
from tests.daemon_helpers import Launcher, SarpdProc
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Batch, HolderMasks, Query, Timeline
from tools.bench.fleet_sarp import SarpDirect, SarpInProcess, id_bin, sarp_ops

CFG = FleetConfig(WORKERS, WORKERS)


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return small_timeline()


@pytest.fixture
def direct(sarpd_factory: Launcher) -> Iterator[tuple[SarpDirect, SarpdProc]]:
    proc = sarpd_factory()  # --sync always
    index = SarpDirect(CFG, socket=proc.socket)
    yield index, proc
    index.close()


def test_a_batch_becomes_inserts_after_a_parent_and_removes_of_one_holder(
        timeline: Timeline) -> None:
    batch = next(e for e in timeline.entries if isinstance(e, Batch) and len(e.events) == 2)
    removed, stored = batch.events
    (op1, f1), (op2, f2) = sarp_ops(batch, "fleet", 7 << 48)
    assert (op1, f1) == ("remove", {"ns": "fleet", "ids": id_bin(removed.hashes),
                                    "meta": 7 << 48})
    assert op2 == "insert" and f2["meta"] == 7 << 48 and f2["hashes"] == id_bin(stored.hashes)
    assert f2.get("parent") == getattr(stored, "parent", None)
    assert len(id_bin(stored.hashes)) == 16 * len(stored.hashes)


@pytest.mark.parametrize("bridge", [False, True], ids=["direct", "bridge"])
@pytest.mark.parametrize("per_worker", [False, True], ids=["shared-ns", "ns-per-worker"])
def test_sarpd_answers_every_holder_as_the_model(sarpd_factory: Launcher, tmp_path: Path,
                                                 timeline: Timeline, per_worker: bool,
                                                 bridge: bool) -> None:
    """Straight to sarpd, and through a real bridge per engine (fleet_bridge.py)."""
    proc = sarpd_factory()
    index = SarpDirect(CFG, per_worker=per_worker, socket=proc.socket, bridge=bridge)
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
    for b in batches[10:]:  # made while sarpd is down or recovering
        index.apply(b)
        masks.apply(b)
        a = index.query(seen[-1])  # once back: after the resent writes, so exact
        assert a is None or a == expected(masks.runs(seen[-1].hashes.tolist()))
    final_check(index, masks, seen)  # drain waits for sarpd, then everything was resent
    assert index.link.resent > 0 and index.link.losses >= 1
