"""`SyncClient.cluster(URL)` / `Client.cluster(URL)` (sarpd/client/cluster.py `ClusterClient`)
against a real cluster on loopback (tools.cluster.local: 3 NATS nodes, 2 shards of 2
sarpd replicas): today's methods over NATS; sequences spread over both shards and
each lives on one; a client reads its own writes on any replica (after_seq); an
insert after a parent and a removal by ids reach the chain's shard; replicas answer
alike; with one replica of a shard killed, the other answers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sarpd.client import SyncClient
from sarpd.client.fields import tokens_bin
from sarpd.cluster import route
from sarpd.errors import UnknownParent
from tools.cluster.local import LocalCluster, local_sarp_cluster

BT = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_sarp_cluster(tmp_path_factory.mktemp("cl"), nats_nodes=3, replicas=2,
                            shards=2) as c:
        yield c


def toks(seed: int, blocks: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, 2**32, blocks * BT)]


def test_today_s_methods_over_the_whole_cluster(cluster: LocalCluster) -> None:
    assert cluster.nats is not None
    with SyncClient.cluster(",".join(cluster.nats.urls)) as c:
        assert c.hello()["block_tokens"] == BT and c.ping() == {}
        seqs = [toks(i, 2 + i % 3) for i in range(24)]
        for i, s in enumerate(seqs):
            got = c.insert(tokens=s, meta=i)
            assert got["new_blocks"] == len(s) // BT and got["seq"] >= 1
            hit = c.match(tokens=s)  # its own write, whichever replica answers
            assert hit["blocks"] == len(s) // BT and hit["meta"] == [i] * (len(s) // BT)
        held = {p.shard: 0 for p in cluster.procs}
        for p in cluster.procs:  # every sequence on exactly one shard, on both replicas
            with SyncClient(p.socket) as local:
                here = [local.match(tokens=s)["blocks"] > 0 for s in seqs]
            held[p.shard] = sum(here)
            assert here == [c.shard_for(tokens=s) == p.shard for s in seqs]  # where it said
        assert held["s0"] + held["s1"] == 24 and min(held.values()) > 0
        parent = c.match(tokens=seqs[0], with_ids=True)["ids"][-1]
        after = c.insert(tokens=toks(99, 2), meta=7, parent=parent)  # broadcast, one takes it
        assert after["new_blocks"] == 2
        with pytest.raises(UnknownParent):
            c.insert(tokens=toks(98, 1), meta=7, parent=b"\x05" * 16)
        ids = c.match(tokens=seqs[1], with_ids=True)["ids"]
        assert c.remove(ids=ids[-1:])["removed"] == 1  # by bare id: every shard, summed
        assert c.match(tokens=seqs[1])["blocks"] == len(seqs[1]) // BT - 1
        assert c.clear("", mask=0, value=0)["removed"] > 0
        assert all(c.match(tokens=s)["blocks"] == 0 for s in seqs[:4])


def test_a_shard_answers_with_one_replica_down(cluster: LocalCluster) -> None:
    assert cluster.nats is not None
    victim = next(i for i, p in enumerate(cluster.procs) if p.shard == "s0")
    with SyncClient.cluster(cluster.nats.urls, timeout=10) as c:
        cluster.kill(victim)
        try:
            for i in range(12):
                s = toks(500 + i, 2)
                assert c.insert(tokens=s, meta=i)["new_blocks"] == 2
                assert c.match(tokens=s)["blocks"] == 2
        finally:
            cluster.restart(victim)  # catches up before it serves again
        lives = [route.target("match", {"ns": "", "tokens": tokens_bin(toks(500 + i, 2))},
                              cluster.shard_names, BT) for i in range(12)]
        assert "s0" in lives
        with SyncClient(cluster.procs[victim].socket) as back:  # caught up when it serves
            for i, shard in enumerate(lives):
                assert back.match(tokens=toks(500 + i, 2))["blocks"] == (2 if shard == "s0"
                                                                         else 0)
