"""The fleet bench's `--bridge` transport: each engine's batches through the real vLLM
bridge into sarpd.

Per engine: a publisher speaking vLLM's current KV-event schema (msgspec structs,
tools/bench/vllm_schema.py) on its own ZMQ PUB and replay ROUTER sockets
(tools/bench/vllm_publisher.py), and a `VllmBridge` (sarpd/bridge/vllm.py, the code
`sarpctl bridge vllm` runs; holders on, worker id = engine, the fleet's shared
namespace) subscribed to it and connected to sarpd's socket. The bridges run in one
asyncio loop on a thread of their own (the driver's thread publishes and queries);
`fence` returns once every bridge has applied every batch published so far (its
`applied` sequence number, read in memory), so a query sees what it would see on the
direct path, and the time the bridges take is in the achieved rate.

Token ids: the trace has block hashes only; a store carries, per block, 16 tokens
derived from the block's content hash (`locals`), so that the same block has the
same tokens on every engine (the bridge's hash-agreement check then sees engines that
hash alike, as they do).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np

from sarpd.bridge.vllm import BridgeConfig, VllmBridge
from tools.bench import vllm_schema as vs
from tools.bench.fleet_model import Batch, Stored
from tools.bench.vllm_publisher import Publisher

FENCE_TIMEOUT_S = 120.0


def block_tokens(locals_: np.ndarray, block_size: int) -> list[int]:
    """`block_size` tokens per block, a function of the block's content hash only."""
    shifts = (np.arange(block_size, dtype=np.uint64) * np.uint64(4)) % np.uint64(48)
    toks = (np.asarray(locals_, np.uint64)[:, None] >> shifts[None, :]) & np.uint64(0xFFFF)
    return [int(t) for t in toks.reshape(-1)]


def events_of(batch: Batch, block_size: int) -> list[vs.KVCacheEvent]:
    """One engine batch as the events of vLLM's EventBatch."""
    events: list[vs.KVCacheEvent] = []
    for ev in batch.events:
        hashes = [int(h) for h in ev.hashes]
        if isinstance(ev, Stored):
            events.append(vs.block_stored(hashes, ev.parent,
                                          block_tokens(ev.locals, block_size), block_size))
        else:
            events.append(vs.block_removed(hashes))
    return events


def payload(batch: Batch, block_size: int) -> bytes:
    """One engine batch as the EventBatch vLLM would publish."""
    return vs.encode_events(events_of(batch, block_size))


class BridgeSink:
    """`EventSink` through a publisher and a bridge per engine (module doc)."""

    def __init__(self, sock: Path, workers: int, ns: str, root: Path,
                 block_size: int = 16, holders: bool = True) -> None:
        """`ns`: the bridges' namespace template (`{worker}` expands); `holders`:
        protocol 2 (False: a namespace per worker, protocol 1)."""
        self.block_size = block_size
        self.pubs = [Publisher() for _ in range(workers)]
        self.sent = [0] * workers  # batches published per engine (seq 0, 1, ...)
        self.bridges = [VllmBridge(BridgeConfig(
            endpoint=p.endpoint, replay=p.replay_endpoint, socket=str(sock), worker=w,
            ns=ns, state=root / f"bridge-w{w}.json", report_interval_s=0, holders=holders,
            block_size=block_size)) for w, p in enumerate(self.pubs)]
        self.loop = asyncio.new_event_loop()
        self._tasks: list[asyncio.Task[None]] = []
        self._thread = threading.Thread(target=self._run, name="fleet-bridges", daemon=True)
        self._thread.start()
        for p in self.pubs:
            if not p.subscribed.wait(30):
                raise RuntimeError("a bridge never subscribed to its engine's publisher")
        time.sleep(0.05)  # the subscriptions reach the PUB sockets' filters

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self._tasks = [asyncio.ensure_future(b.run()) for b in self.bridges]
            await asyncio.gather(*self._tasks)

        self.loop.run_until_complete(main())

    def send(self, batch: Batch) -> None:
        self.pubs[batch.worker].publish(payload(batch, self.block_size))
        self.sent[batch.worker] += 1

    def fence(self) -> None:
        """Every bridge has applied every batch its engine published so far."""
        deadline = time.monotonic() + FENCE_TIMEOUT_S
        for sent, bridge in zip(self.sent, self.bridges, strict=True):
            want = sent - 1
            while (bridge.applied if bridge.applied is not None else -1) < want:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"bridge of worker {bridge.cfg.worker} applied "
                                       f"{bridge.applied} of {want} batches")
                if not self._thread.is_alive():
                    raise RuntimeError("the bridges' thread ended")
                time.sleep(0.0002)

    def drain(self) -> None:
        self.fence()

    def close(self) -> None:
        for b in self.bridges:
            self.loop.call_soon_threadsafe(b.stop)
        self._thread.join(30)
        for p in self.pubs:
            p.close()
