"""Kills of every kind under load (issue 15), real processes on loopback: 3 NATS nodes,
one shard of 2 sarpd replicas, writers and a matcher through `SyncClient.cluster`.

1. one NATS node SIGKILLed under load: writes go on (the quorum holds), nothing
   acknowledged is lost; the node rejoins;
2. a sarpd replica SIGKILLed under load: the other answers; it restarts from its data
   and catches up before it serves;
3. a majority of NATS nodes SIGKILLed: a write answers `unavailable` (never
   acknowledged and lost), matches keep answering from the replicas; writes resume
   once the quorum is back.
After it all, every acknowledged insert matches in full, with its meta, on every
replica (of its shard).

Under both rules: block0 (one shard, sequences apart), and heads (issue 27: two shards,
every sequence after one hot prompt, so its shard splits it mid-run and writes go to
both shards' logs, acknowledged when both took them).

`make test` runs one round of kills 1 and 2 with 1.5 s of load before each. The long
run repeats them (a different NATS node and replica each round):

    SARP_CLUSTER_ROUNDS=10 SARP_CLUSTER_LOAD_S=10 .venv/bin/pytest -q \
        tests/daemon/test_cluster_failures.py
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sarpd.client import SyncClient
from sarpd.errors import SarpError, Unavailable
from tools.cluster.local import LocalCluster, local_sarp_cluster

BT = 16
ROUNDS = int(os.environ.get("SARP_CLUSTER_ROUNDS", "1"))  # rounds of kills 1 and 2
LOAD_S = float(os.environ.get("SARP_CLUSTER_LOAD_S", "1.5"))  # load before each kill


PROMPT = [int(t) for t in np.random.default_rng(7).integers(0, 2**32, 3 * BT)]


def toks(k: int, i: int, prompt: bool = False) -> list[int]:
    rng = np.random.default_rng(k * 100_003 + i)
    return (PROMPT if prompt else []) + [int(t) for t in rng.integers(0, 2**32, (1 + i % 3) * BT)]


class Load:
    """Writer threads (each its own cluster client) recording what was acknowledged."""

    def __init__(self, urls: list[str], writers: int = 2, prompt: bool = False) -> None:
        self.urls, self.stop, self.prompt = urls, threading.Event(), prompt
        self.acked: list[tuple[list[int], int, float]] = []  # tokens, meta, when
        self.unavailable = 0
        self.errors: list[str] = []  # anything else a write answered (a bug)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._write, args=(k,), daemon=True)
                        for k in range(writers)]

    def _write(self, k: int) -> None:
        with SyncClient.cluster(self.urls, timeout=30) as c:
            i = 0
            while not self.stop.is_set():
                tokens, meta = toks(k, i, self.prompt), k * 1_000_000 + i
                try:
                    c.insert(tokens=tokens, meta=meta)
                    with self.lock:
                        self.acked.append((tokens, meta, time.monotonic()))
                except Unavailable:
                    with self.lock:
                        self.unavailable += 1
                except SarpError as exc:
                    with self.lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                i += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def acked_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for *_, at in self.acked if at > t)


def wait_for_acks(load: Load, since: float, timeout_s: float = 30.0) -> None:
    """Writes acknowledged after `since` (a leader election takes up to ~8 s here)."""
    while load.acked_since(since) < 3:
        assert not load.errors, load.errors
        assert time.monotonic() - since < timeout_s, "no write acknowledged after the kill"
        time.sleep(0.1)


def all_acked_everywhere(lc: LocalCluster, acked: list[tuple[list[int], int, float]]) -> None:
    """Every acknowledged insert, in full on every replica of its shard (through the
    cluster, and on each replica's socket); its own blocks with its meta (a shared
    prompt's keep their first writer's)."""
    assert lc.nats is not None
    deadline = time.monotonic() + 60
    with SyncClient.cluster(lc.nats.urls, timeout=30) as cc:  # a new client: it wrote
        where = [cc.shard_for(tokens=tokens) for tokens, _, _ in acked]  # nothing, so a
        for tokens, meta, _ in acked:  # replica that has not applied the newest may answer
            while (got := cc.match(tokens=tokens))["blocks"] != len(tokens) // BT:
                assert time.monotonic() < deadline, got["blocks"]
                time.sleep(0.05)
            assert got["meta"][-1] == meta
    deadline = time.monotonic() + 60
    for p in lc.procs:
        with SyncClient(p.socket) as c:
            for (tokens, meta, _), shard in zip(acked, where, strict=True):
                if shard != p.shard:
                    continue
                while (got := c.match(tokens=tokens))["blocks"] != len(tokens) // BT:
                    assert time.monotonic() < deadline, (p.shard, p.name, got["blocks"],
                                                         c.stats().get("cluster"))
                    time.sleep(0.05)
                own = (len(tokens) - (len(PROMPT) if len(tokens) > len(PROMPT) and
                                      tokens[: len(PROMPT)] == PROMPT else 0)) // BT
                assert got["meta"][-own:] == [meta] * own


@pytest.mark.timeout(300 + ROUNDS * (60 + 4 * LOAD_S))
@pytest.mark.parametrize("rule", ["block0", "heads"])
def test_kills_of_every_kind_lose_nothing_acknowledged(tmp_path: Path, rule: str) -> None:
    cfg = tmp_path / "replica.toml"
    cfg.write_text("[cluster]\npublish_retry_s = 12.0\nwrite_timeout_s = 30.0\n")
    heads = rule == "heads"
    with local_sarp_cluster(tmp_path / "cl", nats_nodes=3, replicas=2, shards=2 if heads else 1,
                            config=cfg, rule=rule) as lc:
        assert lc.nats is not None
        urls = lc.nats.urls
        with Load(urls, prompt=heads) as load:
            for r in range(ROUNDS):
                time.sleep(LOAD_S)
                t_kill = time.monotonic()
                lc.nats.kill(r % 3)  # 1. one NATS node of three
                wait_for_acks(load, t_kill)  # writes go on (after a leader election)
                lc.nats.restart(r % 3)
                time.sleep(LOAD_S)
                t_kill = time.monotonic()
                lc.kill(r % 2)  # 2. a sarpd replica
                wait_for_acks(load, t_kill)  # the other replica takes them
                lc.restart(r % 2)
            time.sleep(1.0)
        acked = list(load.acked)
        assert len(acked) > 20 and not load.errors, load.errors
        all_acked_everywhere(lc, acked)
        if heads:  # the hot prompt was split while the kills went on
            with SyncClient.cluster(urls, timeout=30) as c:
                assert c.cluster_status()["splits"] >= 1
        # 3. a majority of NATS nodes: no quorum
        with SyncClient.cluster(urls, timeout=30) as c:
            lc.nats.kill(1)
            lc.nats.kill(2)
            t0 = time.monotonic()
            try:
                # an acknowledged sequence extended: its shard is placed already (a new
                # bucket's placement would wait on the bucket the whole 30 s instead)
                c.insert(tokens=acked[-1][0] + toks(9, 9), meta=9)
                raise AssertionError("a write was acknowledged without a quorum")
            except SarpError as exc:
                assert isinstance(exc, Unavailable), exc
            assert time.monotonic() - t0 < 40
            for tokens, _, _ in acked[:20]:  # matches keep answering
                assert c.match(tokens=tokens)["blocks"] == len(tokens) // BT
            lc.nats.restart(1, wait=False)
            lc.nats.restart(2)
            deadline = time.monotonic() + 60
            while True:  # writes resume once the quorum is back
                try:
                    c.insert(tokens=toks(9, 10), meta=10)
                    break
                except Unavailable:
                    assert time.monotonic() < deadline
            acked.append((toks(9, 10), 10, time.monotonic()))
        all_acked_everywhere(lc, acked)
