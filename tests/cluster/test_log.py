"""The shard log on a real 3-node JetStream cluster (tools.cluster.nats_local): stream
settings, publish with dedup, in-order readers resumed at the caller's sequence, trims,
and nothing acknowledged lost when a node is SIGKILLed right after the acks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from nats.js import JetStreamContext

from sarpd.cluster import log
from sarpd.cluster.log import LogConfigError, LogGap, ShardReader
from sarpd.errors import Unavailable
from tests.cluster_helpers import in_cluster
from tools.cluster.nats_local import NatsCluster, local_cluster

JS_TIMEOUT_S = 1.0  # one JetStream API attempt (log.retrying retries transient failures)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with local_cluster(tmp_path, 3) as c:
        yield c


def run(cluster: NatsCluster, body: Callable[[JetStreamContext], Awaitable[None]]) -> None:
    in_cluster(cluster, body, JS_TIMEOUT_S)


async def read_all(js: JetStreamContext, shard: str, replica: str, start: int,
                   until: int) -> list[tuple[int, bytes]]:
    """Every entry from `start` to `until` via a fresh reader, acked as applied."""
    reader = await ShardReader.open(js, shard, replica, start)
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    while (not got or got[-1][0] < until) and time.monotonic() < deadline:
        batch = await reader.fetch(timeout_s=0.5)
        got += batch
        if batch:
            await reader.ack(batch[-1][0])
    await reader.close()
    return got


async def publish_many(js: JetStreamContext, shard: str, n: int,
                       tag: str) -> list[tuple[int, bytes]]:
    acked = []
    for i in range(n):
        payload = f"{tag}-{i}".encode()
        seq, dup = await log.publish(js, shard, payload, f"{tag}-{i}")
        assert not dup
        acked.append((seq, payload))
    return acked


def test_publish_gives_increasing_seqs_and_a_resend_is_a_duplicate(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        info = await log.ensure_stream(js, "s0", 3)
        assert info.config.num_replicas == 3 and info.config.duplicate_window == 300.0
        acked = await publish_many(js, "s0", 20, "w")
        seqs = [s for s, _ in acked]
        assert seqs == list(range(1, 21))
        assert await log.publish(js, "s0", b"w-4 again", "w-4") == (5, True)
        assert await log.publish(js, "s0", b"new", "w-new") == (21, False)
        assert await read_all(js, "s0", "r0", 1, 21) == [*acked, (21, b"new")]

    run(cluster, body)


def test_ensure_stream_is_idempotent_and_refuses_other_settings(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        first = await log.ensure_stream(js, "s1", 3)
        again = await log.ensure_stream(js, "s1", 3)
        assert first.config.name == again.config.name == "SARP_s1"
        assert again.config.subjects == ["sarp.log.s1"]
        with pytest.raises(LogConfigError, match="stream SARP_s1: num_replicas is 3, expected 1"):
            await log.ensure_stream(js, "s1", 1)
        await js.update_stream(log.stream_config("s1", 3), duplicate_window=5.0)
        with pytest.raises(LogConfigError, match=r"duplicate_window is 5\.0, expected 300\.0"):
            await log.ensure_stream(js, "s1", 3)

    run(cluster, body)


def test_names_and_limits_are_checked() -> None:
    with pytest.raises(LogConfigError, match=r"shard: 'a\.b' must be 1-64 of"):
        log.stream_name("a.b")
    with pytest.raises(LogConfigError, match="replica: 'r 1' must be"):
        log.durable_name("s", "r 1")
    with pytest.raises(LogConfigError, match=r"replicas: 6 must be an int in 1\.\.5"):
        log.stream_config("s", 6)
    assert log.durable_name("s0", "r1") == "SARP_s0_r1"


def test_what_counts_as_transient_and_the_retry_deadline() -> None:
    assert log.transient(nats.errors.TimeoutError())
    assert log.transient(TimeoutError())
    assert log.transient(nats.js.errors.ServiceUnavailableError())
    assert log.transient(nats.js.errors.APIError(code=409, err_code=log.DUPLICATE_IN_PROCESS))
    assert not log.transient(nats.js.errors.APIError(code=400, err_code=10058))
    assert not log.transient(ValueError("x"))
    calls: list[int] = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise nats.errors.NoRespondersError
        return 7

    async def broken() -> int:
        calls.append(1)
        raise ValueError("not transient")

    async def down() -> int:
        raise nats.errors.TimeoutError

    assert asyncio.run(log.retrying(flaky, "flaky", retry_s=5)) == 7 and len(calls) == 3
    with pytest.raises(ValueError, match="not transient"):
        asyncio.run(log.retrying(broken, "broken", retry_s=5))
    assert len(calls) == 4  # tried once
    with pytest.raises(Unavailable, match=r"down: JetStream did not answer within 0\.3s"):
        asyncio.run(log.retrying(down, "down", retry_s=0.3))


def test_a_publish_retry_horizon_must_stay_inside_the_window() -> None:
    async def body() -> None:
        js = JetStreamContext.__new__(JetStreamContext)  # never reached: checked first
        with pytest.raises(LogConfigError, match=r"retry_s: 300\.0 must be below"):
            await log.publish(js, "s", b"", "m", retry_s=log.DUPLICATE_WINDOW_S)
        with pytest.raises(LogConfigError, match=r"msg_id: '' must be 1\.\.256 bytes"):
            await log.publish(js, "s", b"", "")

    asyncio.run(body())


def test_a_reader_resumed_at_k_yields_k_on_and_nothing_before(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "s2", 3)
        acked = await publish_many(js, "s2", 10, "e")
        reader = await ShardReader.open(js, "s2", "r0", 4)
        got = await reader.fetch(timeout_s=2)
        while got[-1][0] < 10:
            got += await reader.fetch(timeout_s=2)
        assert got == acked[3:]
        assert await reader.fetch(timeout_s=0.2) == []  # nothing more, nothing again
        later = await publish_many(js, "s2", 3, "f")  # new entries arrive in order
        more = await reader.fetch(timeout_s=2)
        while len(more) < 3:
            more += await reader.fetch(timeout_s=2)
        assert more == later
        await reader.ack(7)
        again = await ShardReader.open(js, "s2", "r9", 5)
        got = []
        async for item in again.entries(timeout_s=0.5):  # leaving the loop loses nothing
            got.append(item)
            if len(got) == 2:
                break
        while len(got) < 9:
            got += await again.fetch(timeout_s=2)
        assert got == [*acked[4:], *later]
        await again.close()
        floor = 0
        for _ in range(50):  # acks are asynchronous: the consumer sees them shortly
            floor = (await js.consumer_info("SARP_s2", "SARP_s2_r0")).ack_floor.stream_seq
            if floor == 7:
                break
            await asyncio.sleep(0.05)
        assert floor == 7
        await reader.close()
        # the caller's number wins over the consumer's memory (acked up to 7)
        assert await read_all(js, "s2", "r0", 2, 13) == [*acked[1:], *later]
        assert await read_all(js, "s2", "r0", 13, 13) == [later[-1]]

    run(cluster, body)


def test_a_reader_says_how_far_behind_it_is_and_when_entries_were_stored(
        cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "s5", 3)
        before = time.time()
        acked = await publish_many(js, "s5", 10, "p")
        after = time.time()
        reader = await ShardReader.open(js, "s5", "r0", 1)
        got = await reader.fetch(timeout_s=2, batch=4)
        assert [s for s, _ in got] == [1, 2, 3, 4]
        assert reader.pending == 6  # 5..10 wait in the log
        stamps = [reader.stored_at(s) for s, _ in got]
        assert all(t is not None and before - 1 <= t <= after + 1 for t in stamps), stamps
        assert stamps == sorted(stamps)
        await reader.ack(4)
        assert reader.stored_at(4) is None  # acked: no longer held
        while reader.next_seq <= 10:
            await reader.fetch(timeout_s=2)
        assert reader.pending == 0
        assert await reader.fetch(timeout_s=0.2) == [] and reader.pending == 0
        assert reader.stored_at(99) is None and len(acked) == 10
        await reader.close()

    run(cluster, body)


def test_trim_below_purges_older_entries(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "s3", 3)
        acked = await publish_many(js, "s3", 6, "t")
        await log.trim_below(js, "s3", 1)  # nothing below 1
        assert (await js.stream_info("SARP_s3")).state.first_seq == 1
        await log.trim_below(js, "s3", 4)
        state = (await js.stream_info("SARP_s3")).state
        assert (state.first_seq, state.last_seq, state.messages) == (4, 6, 3)
        with pytest.raises(LogGap, match=r"starts at seq 2, the log was trimmed below 4"):
            await ShardReader.open(js, "s3", "r0", 2)
        assert await read_all(js, "s3", "r0", 4, 6) == acked[3:]
        with pytest.raises(LogConfigError, match="seq: 0 must be an int >= 1"):
            await log.trim_below(js, "s3", 0)
        # a trim above where a reader stands is a gap it reports, never skips
        more = await publish_many(js, "s3", 4, "g")  # seqs 7..10
        reader = await ShardReader.open(js, "s3", "r1", 7)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30  # a new consumer's leader: slow on a loaded host
        while len(got) < 2 and time.monotonic() < deadline:
            got += await reader.fetch(timeout_s=2, batch=2 - len(got))
        assert got == more[:2]
        await log.trim_below(js, "s3", 10)
        # the reader reports the gap, or (its pull answered before the purge took
        # effect on a loaded host) yields 9 and 10 in order: never a skip
        deadline = time.monotonic() + 30  # seq 10's delivery after a purge: slow when loaded
        seen: list[tuple[int, bytes]] = []
        try:
            while len(seen) < 2 and time.monotonic() < deadline:
                seen += await reader.fetch(timeout_s=2)
        except LogGap as gap:
            assert "replica r1 expected seq 9, the log gave 10" in str(gap) and not seen
        else:
            assert seen == more[2:]
        await reader.close()

    run(cluster, body)


def _stream_leader(js_info_leader: str | None, cluster: NatsCluster) -> int:
    names = [n.name for n in cluster.nodes]
    assert js_info_leader in names, js_info_leader
    return names.index(js_info_leader)


def test_a_node_killed_right_after_the_acks_loses_nothing(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "s4", 3)
        acked = await publish_many(js, "s4", 30, "k")
        info = await js.stream_info("SARP_s4")
        assert info.cluster is not None
        leader = _stream_leader(info.cluster.leader, cluster)
        cluster.kill(leader)  # the stream's leader, at once after the last PubAck
        # the surviving quorum has every acknowledged entry, in order
        assert await read_all(js, "s4", "r0", 1, 30) == acked
        more = await publish_many(js, "s4", 5, "q")  # writes go on with 2 of 3
        assert [s for s, _ in more] == list(range(31, 36))
        cluster.restart(leader)
        assert await read_all(js, "s4", "r1", 1, 35) == acked + more
        # the restarted node caught up: with another node down it is in the quorum
        for _ in range(100):
            info = await js.stream_info("SARP_s4")
            peers = [] if info.cluster is None else info.cluster.replicas or []
            if len(peers) == 2 and all(p.current for p in peers):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the restarted node never caught up: {peers}")
        other = next(i for i in range(3) if i != leader)
        cluster.kill(other)
        assert await read_all(js, "s4", "r2", 1, 35) == acked + more

    run(cluster, body)


def test_without_a_quorum_a_publish_is_unavailable(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "s5", 3)
        await publish_many(js, "s5", 2, "u")
        cluster.kill(1)
        cluster.kill(2)
        with pytest.raises(Unavailable, match=r"shard s5: publish 'u-x': JetStream did not"):
            await log.publish(js, "s5", b"x", "u-x", timeout_s=0.3, retry_s=1.0)

    run(cluster, body)
