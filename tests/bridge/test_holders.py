"""Holders through the bridge (protocol 2): several engines in ONE shared namespace,
each with its own bridge into one real sarpd. Every worker's run of every sequence
(`match ... holders`) equals what that engine really caches; an eviction by one
worker leaves the others' holdings; an engine restart (AllBlocksCleared) clears its
own worker's holdings only; engines that hash differently are seen and counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.registry import backend_names
from sarpd.bridge.stats import BridgeStats
from sarpd.client import SyncClient
from sarpd.events.mapping import CANARY_NS, Translator
from sarpd.events.schema import decode_batch
from tests.bridge.vllm_engine import (
    BridgeThread,
    FakeEngine,
    Req,
    Workload,
    as_u64,
    bridge_cfg,
    start_bridge,
)
from tests.daemon_helpers import SarpdProc
from tools.bench.vllm_publisher import Publisher, encode_batch, removed, stored

WORKERS = (1, 2, 5)


@pytest.fixture
def publishers() -> Iterator[list[Publisher]]:
    pubs = [Publisher() for _ in WORKERS]
    yield pubs
    for p in pubs:
        p.close()


def per_worker_runs(sarpd: SarpdProc, engine: FakeEngine, req: Req) -> dict[int, int]:
    with SyncClient(sarpd.socket) as c:
        got = c.match(hashes=[as_u64(h) for h in engine.hashes(req)], ns=req.ns(),
                      holders=len(WORKERS) + 1)
    return {meta >> 48: blocks for meta, blocks in got["holders"]}


def flush(bridges: list[BridgeThread], pubs: list[Publisher]) -> list[BridgeStats]:
    out = []
    for bt, pub in zip(bridges, pubs, strict=True):
        pub.flush()
        bt.wait_seq(pub.next_seq - 1)
        assert bt.bridge is not None
        out.append(bt.bridge.stats)
    return out


@pytest.mark.parametrize("sarpd_proc", backend_names(), indirect=True)
def test_a_shared_namespace_answers_per_worker(publishers: list[Publisher],
                                               sarpd_proc: SarpdProc, tmp_path: Path) -> None:
    engines = [FakeEngine(capacity=25 + 15 * i) for i in range(len(WORKERS))]
    bridges = [start_bridge(bridge_cfg(pub, sarpd_proc, tmp_path / f"w{w}.json", worker=w), pub)
               for w, pub in zip(WORKERS, publishers, strict=True)]
    wl = Workload(seed=5)
    try:
        for _ in range(60):  # every engine serves every request: shared prompts, evictions
            req = wl.next()
            for engine, pub in zip(engines, publishers, strict=True):
                pub.publish(engine.payload(engine.request(req)))
        stats = flush(bridges, publishers)
        assert all(e.evictions for e in engines)
        assert all(s.rejected == 0 and s.unknown_parent == 0 for s in stats)
        checked = 0
        for req in wl.seen:
            want = {w: e.expected(req) for w, e in zip(WORKERS, engines, strict=True)}
            assert per_worker_runs(sarpd_proc, engines[0], req) == {
                w: n for w, n in want.items() if n}
            checked += sum(want.values())
        assert checked > 0
        # an engine restart clears that worker's holdings, nobody else's
        publishers[1].publish(engines[1].payload(engines[1].reset()))
        flush(bridges, publishers)
        for req in wl.seen[-10:]:
            runs = per_worker_runs(sarpd_proc, engines[0], req)
            assert WORKERS[1] not in runs
            assert runs.get(WORKERS[0], 0) == engines[0].expected(req)
        assert sum(s.hash_checks for s in stats) > 0
        assert sum(s.hash_disagreements for s in stats) == 0  # they hash alike
    finally:
        for bt in bridges:
            bt.stop()


def test_engines_that_hash_differently_are_counted(publishers: list[Publisher],
                                                   sarpd_proc: SarpdProc,
                                                   tmp_path: Path) -> None:
    alike, other = FakeEngine(capacity=500), FakeEngine(capacity=500, seed=b"PYTHONHASHSEED=1")
    bridges = [start_bridge(bridge_cfg(pub, sarpd_proc, tmp_path / f"w{w}.json", worker=w), pub)
               for w, pub in zip(WORKERS[:2], publishers[:2], strict=True)]
    wl = Workload(seed=9)
    try:
        for _ in range(6):
            req = wl.next()
            publishers[0].publish(alike.payload(alike.request(req)))
        flush(bridges[:1], publishers[:1])
        for req in wl.seen:
            publishers[1].publish(other.payload(other.request(req)))
        second = flush(bridges[1:], publishers[1:2])[0]
        assert second.hash_checks > 0 and second.hash_disagreements == second.hash_checks
    finally:
        for bt in bridges:
            bt.stop()


def test_holders_translation() -> None:
    """Holders: other tiers share the namespace and a removal names its holder; the
    hash check is asked once per distinct first block; protocol 1 does neither."""

    def events(*evs: object) -> list[object]:
        return list(decode_batch(encode_batch(list(evs))).events)

    tr = Translator(worker=4)
    cpu_store, cpu_evict, gpu_store = events(
        stored([11, 12], None, list(range(32)), medium="CPU"), removed([11], medium="CPU"),
        stored([21], None, list(range(16))))
    t = tr.event(cpu_store)  # type: ignore[arg-type]
    assert t.kind == "stored" and t.ops[0].ns == ""  # type: ignore[union-attr]
    assert [type(op).__name__ for op in t.ops] == ["InsertOp", "CanaryOp"]
    assert t.ops[1].ns == CANARY_NS  # type: ignore[union-attr]
    rm = tr.event(cpu_evict).ops[0]  # type: ignore[arg-type]
    assert rm.meta == (4 << 48) | (1 << 40)  # type: ignore[union-attr]
    assert len(tr.event(gpu_store).ops) == 1  # type: ignore[arg-type]  # same first block
    old = Translator(worker=4, holders=False)
    assert old.event(cpu_store).reason == "tier"  # type: ignore[arg-type]
    assert old.event(gpu_store).ops[0].meta == 4 << 48  # type: ignore[arg-type, union-attr]
    assert len(old.event(gpu_store).ops) == 1  # type: ignore[arg-type]
