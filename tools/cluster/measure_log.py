"""A short measurement of the shard log on a local 3-node cluster (no assertion on
speed anywhere): sequential publish latency to the PubAck and the rate of reading and
acking the entries back, for a stream of 3 replicas against 1 replica in the same run
and cluster (the ratio is the cost of replication with `sync_interval: always`).

    nice -n 19 python -m tools.cluster.measure_log [N]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nats.js import JetStreamContext

from sarpd.cluster import log
from tools.cluster.nats_local import local_cluster

PAYLOAD = b"x" * 200  # about one insert of a 64-block sequence by hashes, in msgpack


@dataclass(frozen=True, slots=True)
class Figures:
    replicas: int
    publish_us_p50: float
    publish_us_p99: float
    read_per_s: float


async def measure(js: JetStreamContext, replicas: int, n: int) -> Figures:
    shard = f"measure{replicas}"
    await log.ensure_stream(js, shard, replicas)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        await log.publish(js, shard, PAYLOAD, f"{shard}-{i}")
        lat.append(time.perf_counter() - t)
    lat.sort()
    t = time.perf_counter()
    reader = await log.ShardReader.open(js, shard, "measure", 1)
    got = 0
    while got < n:
        batch = await reader.fetch(timeout_s=2)
        got += len(batch)
        if batch:
            await reader.ack(batch[-1][0])
    read_s = time.perf_counter() - t
    await reader.close()
    return Figures(replicas, statistics.median(lat) * 1e6, lat[int(0.99 * (n - 1))] * 1e6,
                   n / read_s)


async def run(urls: list[str], n: int) -> list[Figures]:
    nc = await log.connect(urls)
    try:
        js = nc.jetstream(timeout=2)
        return [await measure(js, r, n) for r in (1, 3)]
    finally:
        await nc.close()


def report(figs: list[Figures], n: int) -> list[str]:
    base, r3 = figs
    lines = [f"R{f.replicas}: publish p50 {f.publish_us_p50:.0f} us, p99 {f.publish_us_p99:.0f}"
             f" us; read+ack {f.read_per_s:.0f} entries/s ({n} entries)" for f in figs]
    lines.append(f"R3 vs R1 (same run): publish p50 x{r3.publish_us_p50 / base.publish_us_p50:.2f}"
                 f", p99 x{r3.publish_us_p99 / base.publish_us_p99:.2f}, read rate "
                 f"x{r3.read_per_s / base.read_per_s:.2f}")
    return lines


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 300
    with tempfile.TemporaryDirectory() as d, local_cluster(Path(d), 3) as cluster:
        figs = asyncio.run(run(cluster.urls, n))
    print("\n".join(report(figs, n)))
    print(f"reproduce: nice -n 19 python -m tools.cluster.measure_log {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
