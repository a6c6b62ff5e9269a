"""sarpd in cluster mode (`--cluster URL --shard S --replica-id R`): real sarpd replicas
on a real 3-node JetStream cluster. Writes on any replica's socket go through the
shard's log and answer with their `seq`; a connection's pipelined requests keep
PROTOCOL.md's order (a match after an insert sees it); every replica converges; a
replica killed with SIGKILL under writes restarts from its data and catches up
before it serves; every acknowledged insert then matches on every replica."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from sarpd.client import SyncClient
from sarpd.cluster import log
from sarpd.ctl.main import main as sarpctl
from sarpd.errors import Unavailable
from tests.daemon_helpers import Launcher, RawConn, SarpdProc, free_port, launcher, scrape
from tools.cluster.nats_local import NatsCluster, local_cluster

BT = 16


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsCluster]:
    with local_cluster(tmp_path / "nats", 3) as c:
        yield c


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with launcher(tmp_path / "replicas") as lau:
        yield lau


def replica(launch: Launcher, nats: NatsCluster, name: str) -> SarpdProc:
    return launch(extra_args=("--cluster", ",".join(nats.urls), "--shard", "s0",
                              "--replica-id", name, "--batch-window-ms", "0.2"))


def first_seq(nats: NatsCluster, shard: str) -> int:
    async def read() -> int:
        nc = await log.connect(nats.urls)
        try:
            info = await nc.jetstream(timeout=5).stream_info(log.stream_name(shard))
            return int(info.state.first_seq)
        finally:
            await nc.close()

    return asyncio.run(read())


def toks(seed: int, blocks: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, 2**32, blocks * BT)]


def converged(proc: SarpdProc, acked: list[tuple[list[int], int]], timeout: float = 20) -> None:
    """Every acknowledged insert matches in full on `proc` within `timeout`."""
    deadline = time.monotonic() + timeout
    with SyncClient(proc.socket) as c:
        for tokens, meta in acked:
            while True:
                got = c.match(tokens=tokens)
                if got["blocks"] == len(tokens) // BT:
                    assert list(got["meta"]) == [meta] * got["blocks"]
                    break
                assert time.monotonic() < deadline, (proc.socket, got["blocks"])
                time.sleep(0.05)


def test_writes_go_through_the_log_and_every_replica_converges(
        nats: NatsCluster, launch: Launcher) -> None:
    a, b = replica(launch, nats, "a"), replica(launch, nats, "b")
    acked: list[tuple[list[int], int]] = []
    with SyncClient(a.socket) as ca, SyncClient(b.socket) as cb:
        first = ca.insert(tokens=toks(1, 4), meta=1)
        assert (first["seq"], first["new_blocks"]) == (1, 4)
        second = cb.insert(tokens=toks(2, 3), meta=2)  # through the other replica
        assert (second["seq"], second["new_blocks"]) == (2, 3)
        acked += [(toks(1, 4), 1), (toks(2, 3), 2)]
        assert ca.hello()["backend"] == "rocksdb"
    with RawConn(a.socket) as raw:  # pipelined: the match must see the insert before it
        raw.send({"id": 1, "op": "insert", "tokens": toks(3, 5), "meta": 3})
        raw.send({"id": 2, "op": "match", "tokens": toks(3, 5)})
        raw.send({"id": 3, "op": "insert", "tokens": toks(3, 6), "meta": 3})
        raw.send({"id": 4, "op": "match", "tokens": toks(3, 6)})
        got = {m["id"]: m for m in (raw.recv() for _ in range(4))}
        assert got[1]["ok"] and got[1]["seq"] == 3 and got[3]["seq"] == 4
        assert got[2]["blocks"] == 5 and got[4]["blocks"] == 6
        acked.append((toks(3, 6), 3))
        bad = raw.call("insert", 9, tokens=toks(4, 2), meta=1, parent=b"\x07" * 16)
        assert bad["error"]["code"] == "unknown_parent"  # the entry's outcome everywhere
    for proc in (a, b):
        converged(proc, acked)
    for proc, name, took in ((a, "a", 4), (b, "b", 1)):  # applied from the log: once each
        stats = applied(proc, 5)
        clu = stats["cluster"]
        assert (clu["shard"], clu["replica"], clu["applied_seq"]) == ("s0", name, 5)
        assert clu["forwarded_writes"] == took and clu["failed"] == ""
        assert clu["applied_writes"] == {"inserts": 5, "removes": 0, "clears": 0}
        assert (stats["inserts"], stats["removes"], stats["clears"]) == (5, 0, 0)
        out = CliRunner().invoke(sarpctl, ["--socket", str(proc.socket), "status"])
        assert out.exit_code == 0 and "inserts 5" in out.output, out.output
    with SyncClient(b.socket) as cb:
        assert cb.remove(tokens=toks(2, 3), start=2)["removed"] == 1
        assert cb.clear(ns="other")["removed"] == 0
    for proc in (a, b):
        stats = applied(proc, 7)
        assert (stats["inserts"], stats["removes"], stats["clears"]) == (5, 1, 1)


def applied(proc: SarpdProc, seq: int, timeout: float = 20) -> dict[str, Any]:
    """`proc`'s stats once it applied the log up to `seq`."""
    deadline = time.monotonic() + timeout
    with SyncClient(proc.socket) as c:
        while True:
            stats = c.stats()
            if stats["cluster"]["applied_seq"] >= seq:
                return stats
            assert time.monotonic() < deadline, stats["cluster"]
            time.sleep(0.05)


def test_a_replica_killed_under_writes_catches_up_before_it_serves(
        nats: NatsCluster, launch: Launcher) -> None:
    a, b = replica(launch, nats, "a"), replica(launch, nats, "b")
    acked: list[tuple[list[int], int]] = []
    with SyncClient(a.socket) as ca:
        for i in range(10):
            ca.insert(tokens=toks(100 + i, 2 + i % 3), meta=500 + i)
            acked.append((toks(100 + i, 2 + i % 3), 500 + i))
        b.kill()  # SIGKILL while the log moves on
        for i in range(10, 40):
            ca.insert(tokens=toks(100 + i, 2 + i % 3), meta=500 + i)
            acked.append((toks(100 + i, 2 + i % 3), 500 + i))
    b.start()  # ready only once it applied what the log held at its start
    with SyncClient(b.socket) as cb:
        for tokens, _ in acked:
            assert cb.match(tokens=tokens)["blocks"] == len(tokens) // BT
        assert cb.stats()["blocks"] >= sum(len(t) // BT for t, _ in acked)
    converged(a, acked)


def test_after_seq_gives_read_your_writes_across_replicas(
        nats: NatsCluster, launch: Launcher) -> None:
    """A match on replica b with the seq a write got from replica a sees that write,
    every time; a seq the log never reaches is `unavailable` after the wait; another
    shard's entry in the map is not waited for."""
    a, b = replica(launch, nats, "a"), replica(launch, nats, "b")
    with SyncClient(a.socket) as ca, RawConn(b.socket) as rb:
        for i in range(25):
            tokens = toks(200 + i, 1 + i % 4)
            seq = ca.insert(tokens=tokens, meta=i)["seq"]
            got = rb.call("match", i, tokens=tokens, after_seq={"s0": seq})
            assert got["ok"] and got["blocks"] == len(tokens) // BT, (i, got)
        t0 = time.monotonic()
        late = rb.call("match", 99, tokens=toks(200, 1), after_seq={"s0": 10**6},
                       after_seq_wait_ms=300)
        assert late["error"]["code"] == "unavailable" and "not 1000000" in late["error"]["message"]
        assert 0.25 < time.monotonic() - t0 < 5
        other = rb.call("match", 100, tokens=toks(200, 1), after_seq={"s9": 10**6})
        assert other["ok"] and other["blocks"] == 1


def test_a_single_node_ignores_after_seq(launch: Launcher) -> None:
    single = launch()  # no --cluster: nothing to wait for
    with RawConn(single.socket) as raw:
        assert raw.call("insert", 1, tokens=toks(1, 2), meta=4)["ok"]
        got = raw.call("match", 2, tokens=toks(1, 2), after_seq={"s0": 10**6})
        assert got["ok"] and got["blocks"] == 2 and "seq" not in raw.call(
            "insert", 3, tokens=toks(2, 1), meta=1)


def test_a_new_replica_starts_from_a_published_checkpoint(
        nats: NatsCluster, launch: Launcher) -> None:
    """Replicas publish checkpoints (here every 0.5 s) and the log is trimmed below the
    older kept one; a new replica on an empty data directory starts from the newest,
    replays only what came after it, and answers every acknowledged insert."""
    config = {"cluster": {"checkpoint_interval_s": 0.5, "checkpoint_keep": 2}}
    port = free_port()
    a = launch(config=config, extra_args=("--cluster", ",".join(nats.urls), "--shard", "s0",
                                          "--replica-id", "a", "--metrics-port", str(port)))
    acked: list[tuple[list[int], int]] = []
    with SyncClient(a.socket) as ca:
        for round_ in range(3):
            for i in range(10):
                tokens = toks(1000 + 10 * round_ + i, 2)
                ca.insert(tokens=tokens, meta=round_)
                acked.append((tokens, round_))
            time.sleep(1.2)  # a checkpoint after each round
    deadline = time.monotonic() + 30
    while "checkpoint at seq 30 published" not in a.log():
        assert time.monotonic() < deadline, a.log()[-3000:]
        time.sleep(0.1)
    assert first_seq(nats, "s0") > 1  # trimmed below the older kept checkpoint
    c = replica(launch, nats, "c")  # empty data directory
    assert "started from the checkpoint at seq 30" in c.log()
    converged(c, acked)
    with SyncClient(c.socket) as cc:
        assert cc.stats()["cluster"]["applied_seq"] == 30
    got = scrape(port)  # a's metrics: caught up, 30 entries applied, a checkpoint at 30
    lab = '{replica="a",shard="s0"}'
    assert got[f"sarpd_cluster_applied_seq{lab}"] == 30
    assert got[f"sarpd_cluster_lag_seqs{lab}"] == 0 and got[f"sarpd_cluster_lag_seconds{lab}"] == 0
    assert got[f"sarpd_cluster_applied_entries_total{lab}"] == 30
    assert got[f"sarpd_cluster_apply_delay_seconds_count{lab}"] == 30
    assert got[f"sarpd_cluster_checkpoint_seq{lab}"] == 30
    assert 0 <= got[f"sarpd_cluster_checkpoint_age_seconds{lab}"] < 60


def caught_up(proc: SarpdProc, acked: list[tuple[list[int], int]], timeout: float = 60) -> None:
    """`converged`, through a re-bootstrap: `unavailable` answers meanwhile are waited out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            converged(proc, acked, timeout=max(1.0, deadline - time.monotonic()))
            return
        except (Unavailable, OSError):
            assert time.monotonic() < deadline, proc.log()[-3000:]
            time.sleep(0.2)


def test_a_replica_the_log_moved_past_starts_again_from_a_checkpoint(
        nats: NatsCluster, launch: Launcher) -> None:
    """Replica b is silent longer than trim_grace_s while a writes and publishes
    checkpoints, so the log is trimmed past b's applied sequence. b then sets its data
    aside and starts from the newest checkpoint: when restarted after a SIGKILL, and
    while it runs (SIGSTOP, SIGCONT). Every acknowledged insert matches on b after."""
    config = {"cluster": {"checkpoint_interval_s": 0.3, "checkpoint_keep": 2,
                          "trim_grace_s": 2.0}}
    a, b = (launch(config=config, extra_args=(
        "--cluster", ",".join(nats.urls), "--shard", "s0", "--replica-id", name,
        "--batch-window-ms", "0.2")) for name in ("a", "b"))
    acked: list[tuple[list[int], int]] = []

    def write_past(seq_floor: int, start: int) -> int:
        """Insert on a until the log is trimmed above `seq_floor`; the next seed."""
        i, deadline = start, time.monotonic() + 60
        with SyncClient(a.socket) as ca:
            while first_seq(nats, "s0") <= seq_floor:
                assert time.monotonic() < deadline, a.log()[-3000:]
                for _ in range(5):
                    ca.insert(tokens=toks(3000 + i, 2), meta=i)
                    acked.append((toks(3000 + i, 2), i))
                    i += 1
                time.sleep(0.3)
        return i

    with SyncClient(a.socket) as ca:
        for i in range(10):
            ca.insert(tokens=toks(3000 + i, 2), meta=i)
            acked.append((toks(3000 + i, 2), i))
    converged(b, acked)
    b.kill()
    nxt = write_past(11, 10)  # b needs 11 next: gone
    b.start()
    assert "starting again from the newest checkpoint" in b.log()
    assert list((b.data_dir / "stale").iterdir())  # the old data, set aside
    converged(b, acked)
    with SyncClient(b.socket) as cb:
        seen = cb.stats()["cluster"]["applied_seq"]
    b.send_signal(signal.SIGSTOP)  # b runs, but says nothing (cut off)
    try:
        write_past(seen + 1, nxt)
    finally:
        b.send_signal(signal.SIGCONT)
    caught_up(b, acked)
    assert b.log().count("starting again from the newest checkpoint") == 2
    with SyncClient(b.socket) as cb:
        st = cb.stats()["cluster"]
        assert st["failed"] == "" and st["lag_seqs"] == 0 and st["applied_seq"] >= len(acked)
