"""A replica's link to its cluster: the NATS connection, its shard's stream, the
applier (`Replica`), and the catch-up a start does before it serves."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nats.aio.client import Client as NATS

from sarpd.cluster import log
from sarpd.cluster.replica import Replica, ReplicaIndex, Runner
from sarpd.config import ClusterConfig
from sarpd.protocol.requests import Limits

logger = logging.getLogger("sarpd.cluster.node")

JS_TIMEOUT_S = 5.0  # one JetStream API call (log.retrying retries transient failures)


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
