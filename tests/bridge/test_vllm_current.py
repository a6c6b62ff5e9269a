"""The bridge against today's vLLM: a publisher that encodes vLLM's current schema with
msgspec (tools.bench.vllm_schema: the batch an array, tagged event maps, typed
per-block extra keys, session ids, lookahead tokens, a data-parallel rank) and
replays in both framings, the bridge, a real sarpd. Covers replay of the batches
sent before the bridge started, the counters of batches that are lost anyway,
REMOTE and STORAGE events, partial-block stores and lookahead hashing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sarpd.bridge.stats import BridgeStats
from sarpd.client import SyncClient
from tests.bridge.vllm_engine import (
    WORKER,
    BridgeThread,
    FakeEngine,
    Workload,
    as_u64,
    bridge_cfg,
    check_index,
    publish_requests,
    start_bridge,
)
from tests.daemon_helpers import SarpdProc
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import Publisher

STORAGE_META = (WORKER << 48) | (2 << 40)


def stats_of(bt: BridgeThread) -> BridgeStats:
    assert bt.bridge is not None
    return bt.bridge.stats


def run_to_end(bt: BridgeThread, pub: Publisher) -> BridgeStats:
    pub.flush()
    bt.wait_seq(pub.next_seq - 1)
    return stats_of(bt)


@pytest.mark.parametrize(
    ("int_hashes", "lookahead"), [(False, False), (True, True)], ids=["bytes", "int-lookahead"]
)
def test_current_schema_stream_matches_engine_model(
    int_hashes: bool, lookahead: bool, publisher: Publisher, sarpd_proc: SarpdProc,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Lost batches come back through the 4-frame replay; typed extra keys put LoRA
    and salted sequences in their namespaces; session ids change nothing; with
    lookahead hashing the index is exact for a router that hashes the same way."""
    engine = FakeEngine(capacity=120, int_hashes=int_hashes, schema="current",
                        lookahead=lookahead, rank=2)  # fmt: skip
    wl = Workload(seed=21 if lookahead else 22)
    bt = start_bridge(bridge_cfg(publisher, sarpd_proc, tmp_path / "pos.json"), publisher)
    try:
        publish_requests(publisher, engine, wl, 50, lose_every=7)
        publisher.publish(engine.payload(engine.reset()))
        publish_requests(publisher, engine, wl, 20, lose_every=6)
        stats = run_to_end(bt, publisher)
    finally:
        bt.stop()
    assert engine.evictions > 0 and check_index(sarpd_proc, engine, wl.seen) > 0
    assert stats.gaps >= 1 and stats.replays >= stats.gaps + 1
    assert (stats.dropped, stats.replay_failures, stats.replay_malformed) == (0, 0, 0)
    assert stats.events["ignored"] == 0 and stats.unknown_parent == 0 and stats.rejected == 0
    assert (stats.lookahead > 0) is lookahead
    if lookahead:  # a router that hashes without the successor token finds nothing
        plain = FakeEngine(capacity=1, int_hashes=int_hashes)
        with SyncClient(sarpd_proc.socket) as c:
            hits = [c.match(hashes=[as_u64(h) for h in plain.hashes(r)], ns=r.ns())["blocks"]
                    for r in wl.seen]  # fmt: skip
        assert sum(hits) == 0


@pytest.mark.parametrize("framing", ["topic", "plain"])
def test_replays_batches_sent_before_the_bridge_started(
    framing: str, sarpd_proc: SarpdProc, tmp_path: Path
) -> None:
    """An engine that ran before its bridge: the bridge's first replay (from 0) brings
    every buffered batch, in vLLM's current 4-frame framing and in the older one."""
    pub = Publisher(replay=framing)
    engine = FakeEngine(capacity=150, schema="current", rank=0)
    wl = Workload(seed=31)
    try:
        publish_requests(pub, engine, wl, 30)
        pub.flush()
        bt = start_bridge(bridge_cfg(pub, sarpd_proc, tmp_path / "pos.json"), pub)
        try:
            bt.wait_seq(pub.next_seq - 1)
            publish_requests(pub, engine, wl, 10)
            stats = run_to_end(bt, pub)
        finally:
            bt.stop()
    finally:
        pub.close()
    assert check_index(sarpd_proc, engine, wl.seen) > 0
    assert pub.replay_requests == [0]
    assert (stats.replays, stats.gaps, stats.dropped) == (1, 0, 0)
    assert (stats.replay_failures, stats.replay_malformed, stats.unknown_parent) == (0, 0, 0)


def _root_store(h: int) -> bytes:
    return vs.encode_events([vs.block_stored([h], None, [0] * 16)])


@pytest.mark.parametrize(
    ("pub_kw", "cfg_kw", "want", "present"),
    [
        # the replay socket never answers: both tries time out, 5 batches lost
        ({"replay": "mute"}, {"replay_timeout_s": 0.3},
         {"replay_failures": 2, "gaps": 1, "dropped_by": {"unreplayed": 5}}, [999]),
        # it answers with neither framing: every reply skipped and counted (5 at the
        # start, 6 when seq 5 shows the gap)
        ({"replay": "broken"}, {},
         {"replay_malformed": 11, "gaps": 1, "dropped_by": {"unreplayed": 5}}, [999]),
        # its buffer moved on: the 3 oldest batches are gone
        ({"buffer_steps": 2}, {},
         {"replay_failures": 0, "gaps": 0, "dropped_by": {"unreplayed": 3}}, [103, 104, 999]),
        # no replay socket at all
        ({}, {"replay": None}, {"replays": 0, "gaps": 1, "dropped_by": {"no_replay": 5}}, [999]),
    ],
    ids=["mute", "malformed", "buffer-moved-on", "no-replay"],
)  # fmt: skip
def test_batches_lost_before_the_bridge_started_are_counted(
    pub_kw: dict[str, Any], cfg_kw: dict[str, Any], want: dict[str, Any], present: list[int],
    sarpd_proc: SarpdProc, tmp_path: Path,
) -> None:  # fmt: skip
    """Five batches sent before the bridge started that no replay returns are counted
    as dropped, with their reason, never lost silently; the stream then goes on."""
    pub = Publisher(**pub_kw)
    try:
        for h in range(100, 105):  # seq 0..4
            pub.publish(_root_store(h))
        pub.flush()
        bt = start_bridge(bridge_cfg(pub, sarpd_proc, tmp_path / "pos.json", **cfg_kw), pub)
        try:
            pub.publish(_root_store(999))  # seq 5
            stats = run_to_end(bt, pub)
        finally:
            bt.stop()
    finally:
        pub.close()
    assert stats.dropped == sum(want["dropped_by"].values())
    assert {k: getattr(stats, k) for k in want} == want
    assert stats.flat()[f"dropped_{next(iter(want['dropped_by']))}"] == stats.dropped
    with SyncClient(sarpd_proc.socket) as c:
        assert [h for h in (*range(100, 105), 999) if c.match(hashes=[h])["blocks"]] == present


def test_storage_tier_remote_locality_and_ownership(
    publisher: Publisher, sarpd_proc: SarpdProc, tmp_path: Path
) -> None:
    """With a namespace per tier: STORAGE lands in the storage tier (2) and in the
    namespace of its tier instance; REMOTE stores and removes touch nothing."""
    cfg = bridge_cfg(publisher, sarpd_proc, tmp_path / "pos.json", ns="w{worker}/{medium}")
    toks = [0] * 32
    events = [
        vs.block_stored([1, 2], None, toks),
        vs.block_stored([1, 2], None, toks, medium="STORAGE", locality="LOCAL", ownership="fs0"),
        vs.block_stored([3], None, toks[:16], medium="STORAGE", locality="REMOTE",
                        ownership="obj"),
        vs.block_stored([4], None, toks[:16], locality="REMOTE"),
        vs.block_stored([5], None, toks[:16], medium="CPU"),
        vs.block_removed([2], medium="STORAGE", locality="LOCAL", ownership="fs0"),
        vs.block_removed([1], medium="STORAGE", locality="REMOTE", ownership="obj"),
    ]  # fmt: skip
    bt = start_bridge(cfg, publisher)
    try:
        publisher.publish(vs.encode_events(events, rank=1))
        stats = run_to_end(bt, publisher)
    finally:
        bt.stop()
    assert stats.ignored_by == {"remote": 3} and stats.events["stored"] == 3
    with SyncClient(sarpd_proc.socket) as c:
        gpu = c.match(hashes=[1, 2], ns="w3/gpu")
        assert gpu["blocks"] == 2 and gpu["meta"] == [WORKER << 48] * 2
        disk = c.match(hashes=[1, 2], ns="w3/disk:fs0")  # block 2 evicted from fs0 only
        assert disk["blocks"] == 1 and disk["meta"] == [STORAGE_META]
        assert c.match(hashes=[5], ns="w3/cpu")["meta"] == [(WORKER << 48) | (1 << 40)]
        for ns in ("w3/gpu", "w3/disk", "w3/disk:obj", "w3/other"):
            assert c.match(hashes=[3], ns=ns)["blocks"] == 0
            assert c.match(hashes=[4], ns=ns)["blocks"] == 0


def test_partial_block_stores_are_not_indexed_as_whole_blocks(
    publisher: Publisher, sarpd_proc: SarpdProc, tmp_path: Path
) -> None:
    """An engine with 64-token blocks and 16-token hash blocks publishes partial
    entries (block_size 16): they are not whole positions, so they are skipped."""
    cfg = bridge_cfg(publisher, sarpd_proc, tmp_path / "pos.json", block_size=64)
    events = [
        vs.block_stored([8], None, [0] * 16, 16),  # a 16-token prompt: a root partial
        vs.block_stored([1, 2], None, [0] * 128, 64),
        vs.block_stored([9], 2, [0] * 16, 16),  # 16 tokens into block 3
    ]
    bt = start_bridge(cfg, publisher)
    try:
        publisher.publish(vs.encode_events(events))
        stats = run_to_end(bt, publisher)
    finally:
        bt.stop()
    assert stats.ignored_by == {"partial": 2} and stats.events["stored"] == 1
    with SyncClient(sarpd_proc.socket) as c:
        assert c.match(hashes=[1, 2, 9])["blocks"] == 2
        assert c.match(hashes=[8])["blocks"] == 0
