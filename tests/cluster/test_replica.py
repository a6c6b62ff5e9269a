"""Replicas of a shard (sarpd/cluster/replica.py) on a real 3-node JetStream cluster,
each over its own real RocksDB index: writes go through the log and come back with
their result and seq; every replica that applied the same prefix answers alike; a
resend is applied once; a stopped replica and a new one from a checkpoint catch up;
waiting past a timeout is `unavailable`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from nats.js import JetStreamContext

from sarpd.cluster import entry, log
from sarpd.cluster.replica import Applied, Replica
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.store import data_paths, open_backend
from sarpd.errors import Unavailable, UnknownParent
from sarpd.model import (
    Clear,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Remove,
    RemoveResult,
    SeqSpec,
)
from sarpd.protocol.requests import Limits
from tests.cluster_helpers import in_cluster
from tools.cluster.nats_local import NatsCluster, local_cluster

T = TypeVar("T")
BT = 16
LIMITS = Limits(block_tokens=BT, max_sequence_tokens=1 << 16)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with local_cluster(tmp_path_factory.mktemp("nats"), 3) as c:
        yield c


class Node:
    """One replica's index and its worker thread (the server's role in sarpd)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.pool = ThreadPoolExecutor(1)
        self.index = self.open()

    def open(self) -> SarpIndex:
        backend_dir, snaps = data_paths(self.data, "rocksdb")
        snaps.mkdir(parents=True, exist_ok=True)
        ix = SarpIndex(open_backend("rocksdb", backend_dir, cache_bytes=8 << 20),
                       IndexConfig(block_tokens=BT), snaps, sync=True)
        ix.recover()
        return ix

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def replica(self, js: JetStreamContext, shard: str, name: str) -> Replica:
        return Replica(self.index, js, shard, name, LIMITS, self.run)

    async def answers(self, queries: list[np.ndarray],
                      ns: str = "") -> list[tuple[int, list[int]]]:
        reqs = [Match(i, SeqSpec(ns, tokens=q)) for i, q in enumerate(queries)]
        res = await self.run(lambda: self.index.match_many(reqs))
        out = []
        for r in res:
            assert isinstance(r, MatchResult)
            out.append((r.blocks, r.meta.tolist()))
        return out

    def close(self) -> None:
        self.index.close()
        self.pool.shutdown()


def tokens(rng: np.random.Generator, blocks: int) -> np.ndarray:
    return rng.integers(0, 2**32, blocks * BT, dtype=np.uint64).astype(np.uint32)


def insert(toks: np.ndarray, meta: int, **kw: Any) -> Insert:
    return Insert(0, SeqSpec("", tokens=toks), meta=np.full(len(toks) // BT, meta, np.uint64),
                  **kw)


async def until_applied(replicas: list[Replica], seq: int) -> None:
    for r in replicas:
        await r.wait_applied(seq, timeout_s=20)


def test_replicas_answer_alike_and_writes_carry_their_seq(cluster: NatsCluster,
                                                          tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    prompt = tokens(rng, 6)
    sessions = [np.concatenate([prompt, tokens(rng, 1 + i % 5)]) for i in range(12)]

    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "rep1", 3)
        nodes = [Node(tmp_path / f"n{i}") for i in range(3)]
        reps = [n.replica(js, "rep1", f"r{i}") for i, n in enumerate(nodes)]
        for r in reps:
            await r.start()
        try:
            got: list[Applied] = []
            for i, s in enumerate(sessions):  # writes through different replicas
                got.append(await reps[i % 3].write(insert(s, i + 1)))
            assert [a.seq for a in got] == list(range(1, 13))
            first = got[0].result
            assert isinstance(first, InsertResult) and first.new_blocks == len(sessions[0]) // BT
            later = got[1].result  # shares the 6-block prompt with the first
            assert isinstance(later, InsertResult) and later.matched_blocks == 6
            bad = await reps[1].write(insert(tokens(rng, 2), 9,
                                             parent=np.array([[7, 7]], np.uint64)))
            assert isinstance(bad.result, UnknownParent)  # every replica's answer
            rem = await reps[2].write(Remove(0, seq=SeqSpec("", tokens=sessions[3]), start=6))
            assert isinstance(rem.result, RemoveResult) and rem.result.removed == 4
            other = Insert(0, SeqSpec("other", tokens=prompt), meta=5)
            assert isinstance((await reps[0].write(other)).result, InsertResult)
            clr = await reps[0].write(Clear(0, ns="other"))
            assert clr.seq == 16
            await until_applied(reps, 16)
            queries = [*sessions, prompt, tokens(rng, 3)]
            want = await nodes[0].answers(queries)
            for n in nodes[1:]:
                assert await n.answers(queries) == want
            assert want[3] == (6, [1] * 6)  # the removal took the blocks past the prompt
            for n in nodes:
                assert n.index.applied_seq == 16
                assert await n.answers([prompt], ns="other") == [(0, [])]  # cleared
            blocks = nodes[0].index.counters.blocks
            for r in reps:  # each counts every entry once, whoever took the write
                assert r.applied_writes == {"inserts": 14, "removes": 1, "clears": 1}
                assert r.entries_applied == 16 and r.size.blocks == blocks > 0
        finally:
            for r in reps:
                await r.stop()
            for n in nodes:
                n.close()

    in_cluster(cluster, body)


def test_a_resend_is_applied_once_and_a_wait_times_out(cluster: NatsCluster,
                                                       tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    s = tokens(rng, 3)

    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "rep2", 3)
        node = Node(tmp_path / "n")
        rep = node.replica(js, "rep2", "r0")
        await rep.start()
        try:
            one = await rep.write(insert(s, 1), msg_id="client-7:42")
            again = await rep.write(insert(s, 1), msg_id="client-7:42")  # a lost PubAck
            assert (again.seq, again.duplicate, one.duplicate) == (one.seq, True, False)
            assert again.result == one.result  # the first application's answer
            other = await rep.write(insert(s, 2), msg_id="client-7:43")
            assert other.seq == one.seq + 1 and not other.duplicate
            assert isinstance(other.result, InsertResult) and other.result.new_blocks == 0
            assert node.index.applied_seq == other.seq  # two entries, no more
            with pytest.raises(Unavailable, match=r"applied seq 2, not 99, within 0.2 s"):
                await rep.wait_applied(99, timeout_s=0.2)
            await rep.stop()
            # restarted (its answers by seq are gone), it takes a resend of the first
            rep = node.replica(js, "rep2", "r0")
            await rep.start()
            late = await rep.write(insert(s, 1), msg_id="client-7:42")
            assert (late.seq, late.duplicate) == (one.seq, True)
            assert late.result == InsertResult(3, 0, 3)  # all there, nothing new
            assert node.index.applied_seq == other.seq
        finally:
            await rep.stop()
            node.close()

    in_cluster(cluster, body)


def test_a_stopped_replica_and_a_new_one_from_a_checkpoint_catch_up(
        cluster: NatsCluster, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    seqs = [tokens(rng, 2 + i % 4) for i in range(30)]

    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "rep3", 3)
        a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
        ra, rb = a.replica(js, "rep3", "a"), b.replica(js, "rep3", "b")
        await ra.start()
        await rb.start()
        for i in range(10):
            await ra.write(insert(seqs[i], i))
        await until_applied([rb], 10)
        await rb.stop()  # b goes down, its index closed; a keeps writing
        b.close()
        for i in range(10, 20):
            await ra.write(insert(seqs[i], i))
        ckpt = await a.run(lambda: a.index.checkpoint(tmp_path / "ckpt"))
        assert ckpt.applied_seq == 20
        for i in range(20, 30):
            await ra.write(insert(seqs[i], i))
        b = Node(tmp_path / "b")  # restarted: replays from its applied seq + 1
        assert b.index.applied_seq == 10
        c = Node(tmp_path / "ckpt")  # new: from the checkpoint, replays from 21
        assert c.index.applied_seq == 20
        rb, rc = b.replica(js, "rep3", "b"), c.replica(js, "rep3", "c")
        await rb.start()
        await rc.start()
        try:
            await until_applied([rb, rc], 30)
            want = await a.answers(seqs)
            assert want == [(len(q) // BT, [i] * (len(q) // BT)) for i, q in enumerate(seqs)]
            assert await b.answers(seqs) == want and await c.answers(seqs) == want
        finally:
            for r in (ra, rb, rc):
                await r.stop()
            for n in (a, b, c):
                n.close()

    in_cluster(cluster, body)


class Gate:
    """A runner that holds each write batch until released (the worker thread busy)."""

    def __init__(self, node: Node) -> None:
        self.node, self.open = node, asyncio.Event()

    async def run(self, fn: Callable[[], T]) -> T:
        await self.open.wait()
        return await self.node.run(fn)


def test_a_replica_says_how_far_behind_it_is(cluster: NatsCluster, tmp_path: Path) -> None:
    """lag_seqs counts what the log holds past the applied sequence, lag_s how long ago
    the oldest of it was stored; observe gets one apply delay per entry."""
    rng = np.random.default_rng(6)

    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "rep4", 3)
        node = Node(tmp_path / "n")
        gate = Gate(node)
        delays: list[float] = []
        rep = Replica(node.index, js, "rep4", "r0", LIMITS, gate.run, observe=delays.extend)
        assert (rep.lag_seqs, rep.lag_s(0.0), rep.entries_applied) == (0, 0.0, 0)
        for i in range(20):
            await log.publish(js, "rep4", entry.encode(insert(tokens(rng, 2), i), LIMITS),
                              f"w{i}")
        await asyncio.sleep(0.3)
        await rep.start()
        try:
            for _ in range(100):  # the applier pulled a run and waits at the gate
                if rep.lag_seqs == 20 and rep.lag_s(time.time()) > 0:
                    break
                await asyncio.sleep(0.02)
            assert rep.lag_seqs == 20 and rep.applied_seq == 0
            assert rep.lag_s(time.time()) >= 0.3
            gate.open.set()
            await rep.wait_applied(20, timeout_s=20)
            assert (rep.lag_seqs, rep.lag_s(time.time()), rep.entries_applied) == (0, 0.0, 20)
            assert len(delays) == 20 and min(delays) >= 0.3 and max(delays) < 30
        finally:
            await rep.stop()
            node.close()

    in_cluster(cluster, body)


def test_a_log_trimmed_past_a_running_replica_halts_it(cluster: NatsCluster,
                                                       tmp_path: Path) -> None:
    """Entries the replica still needs are purged while it applies: it stops applying
    (halted, failed says why) rather than skip them, and waits answer unavailable."""
    rng = np.random.default_rng(7)

    async def body(js: JetStreamContext) -> None:
        await log.ensure_stream(js, "rep5", 3)

        async def put(i: int) -> None:
            await log.publish(js, "rep5", entry.encode(insert(tokens(rng, 2), i), LIMITS),
                              f"t{i}")

        for i in range(5):
            await put(i)
        node = Node(tmp_path / "n")
        gate = Gate(node)
        rep = Replica(node.index, js, "rep5", "r0", LIMITS, gate.run)
        await rep.start()
        try:
            for _ in range(100):  # entries 1-5 pulled, held at the gate
                if rep.lag_seqs == 5:
                    break
                await asyncio.sleep(0.02)
            for i in range(5, 12):
                await put(i)
            await log.trim_below(js, "rep5", 10)  # 6-9 gone before the replica read them
            gate.open.set()
            await asyncio.wait_for(rep.halted.wait(), timeout=20)
            assert rep.applied_seq == 5 and "trimmed below 10" in rep.failed
            with pytest.raises(Unavailable, match="stopped applying"):
                await rep.wait_applied(12, timeout_s=5)
        finally:
            await rep.stop()
            node.close()

    in_cluster(cluster, body)
