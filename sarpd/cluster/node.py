"""A replica's link to its cluster: the NATS connection, its shard's stream, the
applier (`Replica`), the catch-up a start does before it serves, and the shard map
(`write_shard_map`, `read_shard_map`)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig

from sarpd.cluster import log, route
from sarpd.cluster.log import LogConfigError
from sarpd.cluster.replica import Replica, ReplicaIndex, Runner
from sarpd.config import ClusterConfig
from sarpd.protocol.requests import Limits

logger = logging.getLogger("sarpd.cluster.node")

JS_TIMEOUT_S = 5.0  # one JetStream API call (log.retrying retries transient failures)


async def write_shard_map(js: JetStreamContext, names: list[str], replicas: int) -> None:
    """Store the cluster's shard map (`route.SHARD_BUCKET` / `SHARD_KEY`: the ordered
    shard names clients route by). Written once, by whoever creates the cluster: a
    different map over an existing one is refused (it would move every sequence)."""
    route.check_map(names)
    try:
        kv = await js.key_value(route.SHARD_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        kv = await js.create_key_value(KeyValueConfig(bucket=route.SHARD_BUCKET, history=1,
                                                      replicas=replicas))
    try:
        have = await kv.get(route.SHARD_KEY)
    except nats.js.errors.KeyNotFoundError:
        await kv.create(route.SHARD_KEY, json.dumps(names).encode())
        return
    old = json.loads(have.value or b"null")
    if old != names:
        raise LogConfigError(f"shard map: the cluster has {old}, not {names} (a shard map "
                             "is fixed: changing it would move sequences between shards)")


async def read_shard_map(js: JetStreamContext) -> list[str] | None:
    """The cluster's shard map, or None when none was written."""
    try:
        kv = await js.key_value(route.SHARD_BUCKET)
        entry = await kv.get(route.SHARD_KEY)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    return route.check_map(json.loads(entry.value or b"null"))


@dataclass(slots=True)
class ClusterNode:
    nc: NATS
    replica: Replica

    @classmethod
    async def start(cls, cfg: ClusterConfig, index: ReplicaIndex, limits: Limits,
                    run: Runner[object]) -> ClusterNode:
        """Connect, make sure the shard's stream exists, start applying from the
        index's `applied_seq + 1`, and return once the replica applied everything the
        stream held when it started (a restarted or new replica serves caught up)."""
        nc = await log.connect(list(cfg.urls), name=f"sarpd-{cfg.shard}-{cfg.replica_id}")
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT_S)
            names = await read_shard_map(js)
            if names is not None and cfg.shard not in names:
                raise LogConfigError(f"shard {cfg.shard}: not in the cluster's shard map "
                                     f"{names}")
            info = await log.ensure_stream(js, cfg.shard, cfg.stream_replicas)
            replica = Replica(index, js, cfg.shard, cfg.replica_id, limits, run)
            await replica.start()
            t0, last = time.monotonic(), info.state.last_seq
            logger.info("shard %s: replica %s at seq %d, the log at %d: catching up",
                        cfg.shard, cfg.replica_id, replica.applied_seq, last)
            await replica.wait_applied(last, cfg.catch_up_timeout_s)
            logger.info("shard %s: caught up to seq %d in %.2f s", cfg.shard, last,
                        time.monotonic() - t0)
        except BaseException:
            await nc.close()
            raise
        return cls(nc, replica)

    async def stop(self) -> None:
        await self.replica.stop()
        await self.nc.close()
