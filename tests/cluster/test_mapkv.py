"""The shard map in the KV bucket (sarpd/cluster/mapkv.py), on a real nats-server: a map
is written once (a different one refused, the same one accepted); version 2's tables
are created once per key, the second writer getting the first's; a map read back
carries its tables; a replacement is refused when the map changed meanwhile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from sarpd.cluster import mapkv
from sarpd.cluster.log import LogConfigError
from sarpd.cluster.shardmap import ShardMap, Split
from tests.cluster_helpers import in_cluster
from tools.cluster.nats_local import NatsCluster, local_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    with local_cluster(tmp_path / "nats", 1) as c:
        yield c


def test_the_map_and_its_tables(cluster: NatsCluster) -> None:
    async def body(js: JetStreamContext) -> None:
        assert await mapkv.read_shard_map(js) is None
        v2 = ShardMap(("s0", "s1", "s2"), 2)
        await mapkv.write_shard_map(js, v2, 1)
        await mapkv.write_shard_map(js, v2, 1)  # the same map again: accepted
        with pytest.raises(LogConfigError, match="a shard map is fixed"):
            await mapkv.write_shard_map(js, ShardMap(("s0", "s1")), 1)
        assert await mapkv.record_placement(js, 7, 2) == 2
        assert await mapkv.record_placement(js, 7, 0) == 2  # the first placement stays
        assert await mapkv.record_placement(js, 4095, 1) == 1
        split = Split((5, 6), 1, frozenset({9, 10}), {"s0": 3, "s2": 4}, at=12)
        assert await mapkv.record_split(js, split, 3) == split
        other = Split((5, 6), 0, frozenset(), {}, at=99)  # the same head, later: loses
        assert await mapkv.record_split(js, other, 3) == split
        assert await mapkv.recorded_split(js, 6, 3) == split
        assert await mapkv.recorded_split(js, 7, 3) is None
        got = await mapkv.read_shard_map(js)
        assert got is not None and (got.names, got.rule) == (v2.names, "heads")
        assert got.placements == {7: 2, 4095: 1} and got.splits == {6: split}
        assert got.head_blocks == {5: 0, 6: 1}
        with pytest.raises(LogConfigError, match="changed meanwhile"):
            await mapkv.replace_shard_map(js, ShardMap(("s0",)), v2)
        await mapkv.replace_shard_map(js, v2, ShardMap(("s0", "s1", "s2"), 2, buckets=8192))
        again = await mapkv.read_shard_map(js)
        assert again is not None and again.buckets == 8192 and again.placements[4095] == 1

    in_cluster(cluster, body)
