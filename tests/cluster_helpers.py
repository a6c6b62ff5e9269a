"""Run a coroutine against a real NATS cluster's JetStream in a test (one connection
per call, closed after it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext

from sarpd.cluster import log
from tools.cluster.nats_local import NatsCluster


def in_cluster(cluster: NatsCluster, body: Callable[[JetStreamContext], Awaitable[None]],
               js_timeout_s: float = 2.0) -> None:
    """`body(js)` on a fresh connection to `cluster`; `js_timeout_s` is one JetStream
    API call's wait (sarpd.cluster.log.retrying retries transient failures)."""
    async def main() -> None:
        nc = await log.connect(cluster.urls)
        try:
            await body(nc.jetstream(timeout=js_timeout_s))
        finally:
            await nc.close()

    asyncio.run(main())
