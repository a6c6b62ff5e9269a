"""The vLLM bridge end to end: a real ZMQ publisher speaking vLLM's schema, the
bridge, a real sarpd; the index must end exactly as a brute-force model of the
engine's cache says (`vllm_engine.FakeEngine`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from sarpd.bridge.state import nsmap_path
from sarpd.client import SyncClient
from tests.bridge.vllm_engine import (
    WORKER,
    BridgeThread,
    FakeEngine,
    Workload,
    bridge_cfg,
    check_index,
    publish_requests,
    start_bridge,
)
from tests.daemon_helpers import Launcher, RawConn, SarpdProc
from tools.bench.vllm_publisher import Publisher, encode_batch, stored


@pytest.mark.parametrize(
    ("array_like", "int_hashes"), [(True, False), (False, True)], ids=["array-bytes", "map-int"]
)
def test_stream_matches_engine_model(
    array_like: bool, int_hashes: bool, publisher: Publisher, sarpd_proc: SarpdProc,
    tmp_path: Path,
) -> None:  # fmt: skip
    engine = FakeEngine(capacity=120, int_hashes=int_hashes)
    wl = Workload(seed=7 if array_like else 8)
    bt = start_bridge(bridge_cfg(publisher, sarpd_proc, tmp_path / "pos.json",
                                 report_interval_s=0.1), publisher)
    try:
        publish_requests(publisher, engine, wl, 60, array_like=array_like, lose_every=9)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        assert engine.evictions > 0
        assert check_index(sarpd_proc, engine, wl.seen) > 0

        publisher.publish(encode_batch(engine.reset(), array_like=array_like))  # AllBlocksCleared
        publish_requests(publisher, engine, wl, 20, array_like=array_like, lose_every=7)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        check_index(sarpd_proc, engine, wl.seen)

        publisher.restart()  # the engine restarts: empty cache, sequence from 0
        engine.cache.clear()
        publish_requests(publisher, engine, wl, 15, array_like=array_like)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        assert check_index(sarpd_proc, engine, wl.seen) > 0
        stats = bt.bridge.stats if bt.bridge else None
        assert stats is not None
        # one replay may fill several gaps: it returns everything buffered after the first
        assert stats.gaps >= 1 and stats.replays >= stats.gaps + 1 and stats.duplicates > 0
        assert stats.restarts == 1 and stats.events["cleared"] >= 2
        assert stats.dropped == 0 and stats.unknown_parent == 0 and stats.rejected == 0
        assert stats.events["stored"] > 0 and stats.events["removed"] > 0
        # the bridge reports its counters to sarpd: they show in sarpd's stats
        deadline, seen = time.monotonic() + 10, {}
        while time.monotonic() < deadline:
            with SyncClient(sarpd_proc.socket) as c:
                seen = c.stats().get("reports", {}).get(f"bridge-vllm-w{WORKER}", {})
            if seen.get("events_stored") == stats.events["stored"]:
                break
            time.sleep(0.1)
        assert seen.get("events_stored") == stats.events["stored"], seen
        assert seen["restarts"] == 1 and seen["gaps"] == stats.gaps and "lag_s" in seen
    finally:
        bt.stop()
    saved = json.loads((tmp_path / "pos.json").read_text())
    assert saved["last_seq"] == publisher.next_seq - 1
    assert set(saved["namespaces"]) >= {"", "lora=sql", "salt=tenant7"}


def test_survives_sarpd_and_bridge_restarts(
    publisher: Publisher, sarpd_factory: Launcher, tmp_path: Path
) -> None:
    # a block map of ~60 blocks: most parents and removals take the locator records the
    # map spills (issue 24), across the kill too
    sarpd = sarpd_factory(config={"index": {"block_map_bytes": 2048}})
    engine = FakeEngine(capacity=200)
    wl = Workload(seed=11)
    state = tmp_path / "pos.json"
    bt = start_bridge(bridge_cfg(publisher, sarpd, state), publisher)
    try:
        publish_requests(publisher, engine, wl, 30, array_like=True)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        publish_requests(publisher, engine, wl, 40, array_like=True)
        sarpd.kill()  # SIGKILL with requests in flight
        publish_requests(publisher, engine, wl, 10, array_like=True)
        time.sleep(0.2)
        sarpd.start()
        publish_requests(publisher, engine, wl, 10, array_like=True)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        assert bt.bridge is not None and bt.bridge.stats.reconnects >= 1
    finally:
        bt.stop()
    check_index(sarpd, engine, wl.seen)

    # the bridge restarts cleanly: what it missed comes back through the replay
    # socket, and the namespaces of salted blocks from the map it saved on stopping
    assert nsmap_path(state).exists()
    for crash in (False, True):
        publish_requests(publisher, engine, wl, 15, array_like=True)
        publisher.flush()
        if crash:  # as after a crash: the position survives, the map does not
            nsmap_path(state).unlink()
        publisher.subscribed.clear()
        bt = start_bridge(bridge_cfg(publisher, sarpd, state), publisher)
        try:
            assert bt.bridge is not None and bt.bridge.translator.trust_map is not crash
            bt.wait_seq(publisher.next_seq - 1)
            stats = bt.bridge.stats
            assert stats.dropped == 0 and stats.replays == 1
            # after a crash, continuations of salted sequences find their namespace
            # by trying the others (re-routed); after a clean stop they need not
            assert stats.unknown_parent == 0
            assert (stats.retries > 0) is crash  # re-routes re-send, nothing else does
        finally:
            bt.stop()
        check_index(sarpd, engine, wl.seen)
    with SyncClient(sarpd.socket) as c:  # the block map's fallback ran (since the restart)
        assert c.stats()["block_map_spilled"] > 0


def test_unknown_parent_bad_payloads_and_filters(
    publisher: Publisher, sarpd_proc: SarpdProc, tmp_path: Path
) -> None:
    cfg = bridge_cfg(publisher, sarpd_proc, tmp_path / "pos.json", ns="m/w{worker}/{medium}")
    bt = start_bridge(cfg, publisher)
    toks = list(range(32))
    try:
        publisher.publish(encode_batch([stored([11, 12], 999, toks)]))  # parent never seen
        publisher.publish(b"\xc1 not msgpack")
        publisher.publish(encode_batch([{"type": "KVFutureEvent", "x": 1}]))
        publisher.publish(encode_batch([stored([21], None, toks[:16], group_idx=1)]))
        publisher.publish(
            encode_batch(
                [stored([31, 32], None, toks, medium="CPU", future_field=[1, 2])], array_like=False
            )
        )
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        assert bt.bridge is not None
        stats = bt.bridge.stats
        assert (stats.unknown_parent, stats.dropped, stats.events["ignored"]) == (1, 1, 2)
    finally:
        bt.stop()
    with SyncClient(sarpd_proc.socket) as c:
        assert c.match(hashes=[11, 12], ns="m/w3/gpu")["blocks"] == 0
        assert c.match(hashes=[21], ns="m/w3/gpu")["blocks"] == 0
        cpu = c.match(hashes=[31, 32], ns="m/w3/cpu")
        assert cpu["blocks"] == 2 and cpu["meta"] == [(3 << 48) | (1 << 40)] * 2


def test_backs_off_while_sarpd_answers_busy(
    publisher: Publisher, sarpd_factory: Launcher, tmp_path: Path
) -> None:
    """sarpd at max_connections answers `busy` and closes: the bridge backs off and
    retries until a connection frees up, then applies everything."""
    sarpd = sarpd_factory(config={"server": {"max_connections": 1}})
    engine = FakeEngine(capacity=100)
    wl = Workload(seed=5)
    hog = RawConn(sarpd.socket)  # takes the only connection
    assert hog.call("ping")["ok"]
    bt = BridgeThread(bridge_cfg(publisher, sarpd, tmp_path / "pos.json"))
    bt_started = threading.Thread(target=bt.start)
    bt_started.start()
    try:
        assert publisher.subscribed.wait(10)
        time.sleep(0.5)  # a few refused attempts
        assert not bt.ready.is_set()
        hog.close()
        bt_started.join(30)
        publish_requests(publisher, engine, wl, 10, array_like=True)
        publisher.flush()
        bt.wait_seq(publisher.next_seq - 1)
        assert bt.bridge is not None and bt.bridge.stats.busy >= 1
    finally:
        bt.stop()
    check_index(sarpd, engine, wl.seen)


def test_gap_beyond_the_replay_buffer_and_restart_without_replay(
    sarpd_proc: SarpdProc, tmp_path: Path
) -> None:
    """Batches the engine no longer buffers are counted as dropped, never waited for;
    without a replay socket an engine restart still clears the worker's blocks."""
    pub = Publisher(buffer_steps=2)
    try:
        bt = start_bridge(bridge_cfg(pub, sarpd_proc, tmp_path / "a.json"), pub)
        try:
            pub.publish(encode_batch([stored([1], None, [0] * 16)]))  # seq 0
            for h in range(2, 7):  # seq 1..5 (hashes 2..6) lost
                pub.publish(encode_batch([stored([h], None, [0] * 16)]), lost=True)
            pub.publish(encode_batch([stored([9], None, [0] * 16)]))  # seq 6 -> gap
            # the replay finds only the last two batches buffered, seq 5 and 6
            pub.flush()
            bt.wait_seq(6)
            assert bt.bridge is not None
            stats = bt.bridge.stats
            assert (stats.gaps, stats.dropped, stats.replays) == (1, 4, 2)
        finally:
            bt.stop()
        with SyncClient(sarpd_proc.socket) as c:
            present = [h for h in range(1, 10) if c.match(hashes=[h])["blocks"]]
        assert present == [1, 6, 9]
    finally:
        pub.close()

    pub = Publisher()
    try:
        cfg = bridge_cfg(pub, sarpd_proc, tmp_path / "b.json", replay=None, worker=4)
        bt = start_bridge(cfg, pub)
        try:
            pub.publish(encode_batch([stored([41, 42], None, [0] * 32)]))
            pub.publish(encode_batch([stored([43], 42, [0] * 16)]))
            pub.flush()
            bt.wait_seq(1)
            pub.restart()
            pub.publish(encode_batch([stored([50], None, [0] * 16)]))  # seq 0 again
            pub.flush()
            bt.wait_seq(0)
            assert bt.bridge is not None and bt.bridge.stats.restarts == 1
        finally:
            bt.stop()
        with SyncClient(sarpd_proc.socket) as c:
            assert c.match(hashes=[41, 42, 43])["blocks"] == 0  # worker 4 cleared
            assert c.match(hashes=[50])["meta"] == [4 << 48]
            assert c.match(hashes=[1])["meta"] == [WORKER << 48]  # worker 3 untouched
    finally:
        pub.close()


@pytest.mark.slow
def test_soak_with_sarpd_kills_bridge_restarts_and_gaps(
    publisher: Publisher, sarpd_factory: Launcher, tmp_path: Path
) -> None:
    """Long run (slow, ~1 min): 1,500 requests in rounds; in each round sarpd is
    killed or the bridge restarted, and some batches are lost on the PUB socket.
    The index must end exactly as the engine's cache, in sarpd's default
    configuration: hundreds of conversations over four prompts make more than
    `window_cap` (4) segment copies tie for one window, which exact matching
    (bound-and-verify) resolves by reading further rounds."""
    sarpd = sarpd_factory()
    engine = FakeEngine(capacity=400, int_hashes=True)
    wl = Workload(seed=99)
    state = tmp_path / "pos.json"
    for rnd in range(10):
        bt = start_bridge(bridge_cfg(publisher, sarpd, state), publisher)
        try:
            publish_requests(publisher, engine, wl, 100, array_like=rnd % 2 == 0, lose_every=13)
            if rnd % 3 == 1:
                sarpd.kill()
                time.sleep(0.1)
                sarpd.start()
            if rnd == 5:
                publisher.publish(encode_batch(engine.reset()))
            publish_requests(publisher, engine, wl, 50, array_like=True)
            publisher.flush()
            bt.wait_seq(publisher.next_seq - 1, timeout=300)
            assert bt.bridge is not None and bt.bridge.stats.unknown_parent == 0
        finally:
            bt.stop()
        publisher.subscribed.clear()
    assert check_index(sarpd, engine, wl.seen) > 0
