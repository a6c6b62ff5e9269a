"""Cluster mode (issue 15): the writes a replica's socket receives go to its shard's log.

A write (insert, remove, clear) is not run by the batcher: the replica publishes it to
the log and answers once it applied it (`sarpd.cluster.replica.Replica.write`), with
the result every replica had and the entry's `seq`. PROTOCOL.md's order still holds
per connection:

- a write waits until every earlier request of its connection is done: its earlier
  writes applied and answered, its requests in the batcher answered; so writes of
  one connection enter the log in the order sent, after what they must follow;
- any request after a write of its connection waits until that write is applied and
  answered, then goes its normal way, so it sees the write;
- a match carrying `after_seq` with this shard's sequence S waits until the replica
  applied S (at most its `after_seq_wait_ms`, else `unavailable`): a client that got
  S from another replica of the shard sees that write here too.

Requests of different connections are not ordered against each other (as in the
batcher). A connection's forwarded writes count in its in-flight requests, so
`max_inflight_per_conn` bounds them too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from sarpd.cluster.node import ClusterNode
from sarpd.errors import Internal, SarpError
from sarpd.model import Clear, Insert, Match, Remove, Request
from sarpd.protocol.wire import encode_error, encode_result

if TYPE_CHECKING:
    from sarpd.daemon.server import Connection, Server

log = logging.getLogger("sarpd.daemon.forward")

WRITES = (Insert, Remove, Clear)


class Forwarder:
    def __init__(self, server: Server, node: ClusterNode, write_timeout_s: float) -> None:
        self._server, self.node, self.replica = server, node, node.replica
        self._timeout = write_timeout_s
        # per connection: its last forwarded write, done once applied and answered
        self._last: dict[Connection, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.forwarded = 0

    def takes(self, conn: Connection, req: Request) -> bool:
        """Whether the forwarder takes `req` now: a write, or any request that must
        wait for a write of its connection (it is handed back to the server then)."""
        last = self._last.get(conn)
        pending = last is not None and not last.done()
        if isinstance(req, WRITES):
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._last[conn] = done
            conn.inflight += 1
            self._spawn(self._write(conn, req, last if pending else None, done))
            return True
        if pending:
            assert last is not None
            self._spawn(self._after(conn, req, last))
            return True
        if isinstance(req, Match) and req.after_seq:
            want = max((seq for shard, seq in req.after_seq if shard == self.replica.shard),
                       default=0)
            if want > self.replica.applied_seq:
                self._spawn(self._after_seq(conn, req, want))
                return True
        owner = self.replica.owner
        if isinstance(req, Match) and owner is not None:
            moved = owner.fence(req)  # rule heads: a route older than this shard's splits
            if moved is not None:
                self._server.reject(conn, req, moved)
                return True
        return False

    async def _after_seq(self, conn: Connection, req: Match, want: int) -> None:
        """A match that must see this shard's log up to `want` (PROTOCOL.md
        `after_seq`): it waits, then goes its normal way; past its wait, `unavailable`."""
        try:
            await self.replica.wait_applied(want, req.after_seq_wait_ms / 1000)
        except SarpError as exc:
            if not conn.closed:
                self._server.reject(conn, req, exc)
            return
        if not conn.closed:
            self._server.submit(conn, req)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after(self, conn: Connection, req: Request, last: asyncio.Future[None]) -> None:
        await asyncio.wait([last])
        if not conn.closed:
            self._server.submit(conn, req)  # its normal way now (or behind a newer write)

    async def _write(self, conn: Connection, req: Insert | Remove | Clear,
                     last: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        try:
            if last is not None:
                await asyncio.wait([last])
            while conn.batched:  # its earlier requests in the batcher are answered first
                await conn.batch_idle.wait()
            frame = await self._apply(req, conn.write_id)
            if not conn.closed:
                conn.send(frame)
            conn.answered(1)
        finally:
            done.set_result(None)
            if self._last.get(conn) is done:
                del self._last[conn]

    async def _apply(self, req: Insert | Remove | Clear, write_id: str | None) -> bytes:
        block_tokens = self._server.config.index.block_tokens
        try:
            applied = await self.replica.write(req, msg_id=write_id, timeout_s=self._timeout)
        except SarpError as exc:
            self._record(req, exc)
            return encode_error(req.id, exc)
        except Exception as exc:
            log.exception("forwarding request %d failed", req.id)
            err = Internal(f"forwarding the write to the log failed: {exc!r}")
            self._record(req, err)
            return encode_error(req.id, err)
        self.forwarded += 1
        self._record(req, applied.result)
        if isinstance(applied.result, SarpError):
            return encode_error(req.id, applied.result)
        return encode_result(req.id, applied.result, block_tokens=block_tokens, seq=applied.seq)

    def _record(self, req: Request, result: object) -> None:
        try:
            self._server.metrics.record_batch([req], [result])
        except Exception:  # metrics never cost an answer
            log.exception("metrics of a forwarded write failed")

    def stats(self) -> dict[str, object]:
        """What `stats` and the metrics say of this replica (cluster mode; safe from
        any thread: plain reads). The lag, applied and checkpoint figures:
        sarpd.cluster.replica and sarpd.cluster.node. `applied_writes` (the inserts,
        removes and clears applied from the log) is what the service's own counters of
        those add (sarpd.daemon.service); `forwarded_writes`, the writes this replica
        took, are among them, not added to them."""
        r, now = self.replica, time.time()
        ckpt = self.node.checkpoint
        return {"shard": r.shard, "replica": r.replica_id, "applied_seq": r.applied_seq,
                "lag_seqs": r.lag_seqs, "lag_s": r.lag_s(now),
                "entries_applied": r.entries_applied, "applied_writes": dict(r.applied_writes),
                "forwarded_writes": self.forwarded, "writes_in_flight": len(self._tasks),
                "checkpoint_seq": None if ckpt is None else ckpt.seq,
                "checkpoint_age_s": self.node.checkpoint_age_s(now), "failed": r.failed}

    async def stop(self) -> None:
        """Wait for the writes in flight (they end by answer or by timeout)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))
