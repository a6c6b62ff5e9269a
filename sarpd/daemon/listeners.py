"""The indexer API's event listeners: one ZMQ subscriber per registered worker, inside
sarpd, applying the engine's KV events to the index through the server's batcher.

A listener connects a SUB socket to the worker's endpoint (``pending`` until then,
``active`` once connected; ``failed`` with `last_error` when its loop died) and takes
each message ``[topic, seq (8 bytes, big-endian), payload]`` in order:

- after a restart of sarpd (a watermark saved), the batches past the watermark are
  asked from the worker's replay endpoint at once (vLLM's ROUTER: ``[b"", start]``
  in, ``[b"", topic, seq, payload]`` per buffered batch out, then seq -1), so the
  index catches up without waiting for the engine's next batch;
- the first message after a registration: if its `seq` is past 0, the batches
  before it are asked for first (as Dynamo's indexer does: a late registration);
- a later gap is replayed the same way; a `seq` at or below the watermark is a
  duplicate (skipped) inside the last replay's window, else the engine restarted:
  its blocks are cleared before the new stream is taken (`sarpd.events.sequence`,
  the bridge's rule too);
- each batch is decoded (`sarpd.events.schema`, token ids kept), translated
  (`sarpd.indexer.ingest`) and submitted on the listener's own `LocalConn` (its
  requests take effect in order); the watermark moves once they are answered.

Without a replay endpoint a gap is logged and counted, as Dynamo's indexer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from sarpd.daemon.local import LocalConn
from sarpd.errors import SarpError
from sarpd.events.endpoints import check_endpoint
from sarpd.events.schema import EventDecodeError, decode_batch, decode_replay, decode_seq
from sarpd.events.sequence import Stream
from sarpd.indexer.ingest import Ingest
from sarpd.indexer.workers import Worker

__all__ = ["Listener"]

log = logging.getLogger("sarpd.daemon.listeners")
REPLAY_TIMEOUT_S = 5.0
RETRIED = ("busy", "unavailable")  # the server could not take it now: submitted again
RETRIES = 20
RETRY_PAUSE_S = 0.05  # times the attempt: ~10 s in all before the listener fails


@dataclass
class Listener:
    worker: Worker
    ingest: Ingest
    conn: LocalConn
    ctx: zmq.asyncio.Context
    stream: Stream = field(default_factory=Stream)  # the watermark, the last replay
    on_applied: Callable[[Worker, int], None] | None = None
    status: str = "pending"
    last_error: str | None = None
    counts: Counter[str] = field(default_factory=Counter)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self.status = "paused"

    async def _run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            assert self.worker.endpoint is not None
            sub.connect(check_endpoint(self.worker.endpoint, "endpoint"))
            self.status = "active"
            if self.stream.last is not None and self.worker.replay_endpoint:
                await self._replay(self.stream.expected)  # a restart: what came meanwhile
            while True:
                frames = await sub.recv_multipart()
                await self._take(frames)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop's end is said and shown in /workers
            self.status, self.last_error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("listener %s: stopped", self._name)
        finally:
            sub.close(linger=0)

    @property
    def _name(self) -> str:
        w = self.worker
        return f"{w.model}/{w.group} instance {w.instance_id} rank {w.dp_rank}"

    async def _take(self, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise EventDecodeError(f"message: {len(frames)} frames, expected 3")
            seq = decode_seq(frames[1])
        except EventDecodeError as exc:
            log.warning("listener %s: dropped a message: %s", self._name, exc)
            self.counts["malformed"] += 1
            return
        stream, last = self.stream, self.stream.last
        verdict = stream.verdict(seq)  # sarpd.events.sequence: the bridge's rule too
        if verdict == "duplicate":
            self.counts["duplicates"] += 1
            return
        if verdict == "restart":
            log.warning("listener %s: sequence went back from %s to %d: engine restarted",
                        self._name, last, seq)
            self.counts["restarts"] += 1
            await self._apply_ops([self.ingest.clear(self.worker, self.conn.next_id)])
            stream.restarted()
            if seq > 0 and self.worker.replay_endpoint:
                await self._replay(0)
        elif verdict == "gap":
            self.counts["gaps"] += 1
            if self.worker.replay_endpoint:
                await self._replay(stream.expected)
        if stream.seen(seq):  # the replay brought it
            self.counts["duplicates"] += 1
            return
        await self._apply(seq, frames[2])

    async def _replay(self, start: int) -> None:
        assert self.worker.replay_endpoint is not None
        self.counts["replays"] += 1
        first: int | None = None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(check_endpoint(self.worker.replay_endpoint, "replay_endpoint"))
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await dealer.poll(int(REPLAY_TIMEOUT_S * 1000)):
                    self.counts["replay_timeouts"] += 1
                    log.warning("listener %s: replay from %d: no answer in %.0f s",
                                self._name, start, REPLAY_TIMEOUT_S)
                    return
                try:
                    reply = decode_replay(await dealer.recv_multipart())
                except EventDecodeError as exc:
                    self.counts["replay_malformed"] += 1
                    log.warning("listener %s: replay: skipped a reply: %s", self._name, exc)
                    continue
                if reply.end:
                    return
                if not self.stream.seen(reply.seq):
                    first = reply.seq if first is None else first
                    await self._apply(reply.seq, reply.payload)
        finally:
            dealer.close(linger=0)
            self.stream.replay_done(first)

    async def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload, tokens=True)
        except EventDecodeError as exc:
            log.warning("listener %s: dropped batch %d: %s", self._name, seq, exc)
            self.counts["undecodable"] += 1
        else:
            self.counts["batches"] += 1
            await self._apply_ops(self.ingest.batch(self.worker, batch, self.conn.next_id))
        lost = self.stream.taken(seq)
        if lost:
            self.counts["lost_batches"] += lost
            log.warning("listener %s: lost batches %d..%d", self._name, seq - lost, seq - 1)
        if self.on_applied is not None:
            self.on_applied(self.worker, seq)

    async def _apply_ops(self, ops: list[Any]) -> None:
        """Submit a batch's requests in order; from the first one the server could not
        take now (`busy`, `unavailable`: a full queue, a failed sync) on, all of them
        again after a pause (set operations, applied again in order: the same end), so
        that the watermark never passes a batch that was not applied. Refused ones
        (e.g. `unknown_parent`) are counted and skipped."""
        for attempt in range(RETRIES + 1):
            if not ops:
                return
            answers = await asyncio.gather(*(self.conn.submit(op) for op in ops),
                                           return_exceptions=True)
            again = next((i for i, a in enumerate(answers) if isinstance(a, SarpError)
                          and a.code in RETRIED), None)
            for a in answers[:again]:
                if isinstance(a, SarpError):
                    self.counts[f"refused_{a.code}"] += 1
                elif isinstance(a, BaseException):
                    raise a
            if again is None:
                return
            if attempt == RETRIES:
                raise answers[again]  # type: ignore[misc]  # the listener fails: shown
            self.counts["retries"] += 1
            ops = ops[again:]
            await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
