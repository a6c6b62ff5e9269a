"""The asyncio side of sarpd: a Protocol server on a Unix socket and the batcher.

Every connection has its own sans-I/O `Decoder`; decoded requests of all connections
go into one queue (sarpd.daemon.batching: reads of connections with nothing queued
in a lane of their own; a batch's writes bounded by `batch_max_blocks`). The batcher
waits up to `batch_window_ms` after the oldest queued request (or until `batch_max`
are queued), then runs `Service.run_batch` in a single
worker thread, so batches run one at a time and in order, and writes each response
to its connection (connections that are gone are skipped). The same worker thread
runs recovery and the periodic snapshot, so they never overlap a batch.

Bounds: `max_connections` (one `busy` error, then close), `max_inflight_per_conn`
(reading from a connection pauses while it has that many unanswered requests),
`max_queue` / `max_queue_bytes` (requests queued for the batcher over all
connections, and their decoded arrays; past either a request is answered `busy` at
once, except into an empty queue), `max_buffered_bytes` (unfinished messages over
all connections: the connection whose bytes pass it gets one `busy` and is closed),
a client that does not read its responses (the transport's pause_writing pauses
reading from it too; past `max_write_buffer` bytes of unsent responses it is
disconnected), and frames over `max_frame_size` or bytes that are not msgpack (one
error with id 0, then close). Nothing a client does affects another client.

Access (sarpd.daemon.access): the peer's SO_PEERCRED is checked against the allowlist when
it connects, and every request against the namespace binding when one is set.
Metrics (sarpd.daemon.metrics) are counted once per batch, before its answers are
sent, and the batch's latencies (each request from decoded to its answer written: the
time of decoding rides in the queue with the request) right after; they read the
server's gauges, the service's reports and the index's activity through the server
(`gauges`, `reported`, `activity`), which owns none of them but the gauges.

Unexpected exceptions: `Service.run_batch` turns them into ``internal`` answers (the
one place for request execution; it never raises); `Connection.data_received` closes
a connection whose decoder failed (the one place for decoding), `_encode` answers
``internal`` for a result that cannot be encoded (the one place for encoding).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar, cast

import numpy as np

from sarpd.config import ServerConfig
from sarpd.core import Activity
from sarpd.daemon.access import PeerCred, Policy, peer_cred
from sarpd.daemon.batching import BatchQueue
from sarpd.daemon.metrics import Metrics, op_name
from sarpd.daemon.service import Service, kind_of
from sarpd.daemon.syncer import Syncer
from sarpd.errors import Busy, ConfigError, FrameError, Internal, SarpError, Unavailable
from sarpd.model import Request
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    Limits,
    StreamError,
    encode_error,
    encode_result,
)

log = logging.getLogger("sarpd.daemon.server")

T = TypeVar("T")


class Connection(asyncio.Protocol):
    """One client. Owns its decoder; the server owns the queue."""

    write_id: str | None = None  # a NATS request's write id (sarpd.daemon.nats_front)
    trusted = False  # sarpd's own parts (sarpd.daemon.local): no access policy applies

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = Decoder(server.limits)
        self.inflight = 0
        self.batched = 0  # requests of this connection in the batcher, unanswered
        self.batch_idle = asyncio.Event()  # set while `batched` is 0 (cluster mode waits)
        self.batch_idle.set()
        self.closed = False
        self._write_paused = False
        self._read_paused = False
        self._dead: SarpError | None = None  # a fatal stream error, answered last
        self.peer = "?"
        self.cred: PeerCred | None = None
        self.buffered = 0  # this connection's share of server.buffered

    # -- asyncio callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = f"conn#{self.server.next_conn_number()}"
        policy = self.server.policy
        self.cred = peer_cred(transport.get_extra_info("socket"), groups=policy.needs_groups)
        if self.cred is not None:
            self.peer += f" ({self.cred})"
        refused = policy.admit(self.cred)
        if refused is not None:
            log.warning("%s: refused: %s", self.peer, refused.message)
            self.fatal(refused)
        elif not self.server.admit(self):
            limit = self.server.config.max_connections
            self.fatal(Busy(f"connections: server is at max_connections ({limit}); retry later"))

    def data_received(self, data: bytes) -> None:
        if self.closed or self._dead is not None:
            return
        fatal: SarpError | None = None
        try:
            items = self.decoder.feed(data)
        except StreamError as exc:  # requests before the bad bytes are still answered
            log.info("%s: closing after bad stream: %s", self.peer, exc.message)
            items, fatal = exc.decoded, exc
        except FrameError as exc:
            log.info("%s: closing after bad stream: %s", self.peer, exc.message)
            items, fatal = [], exc
        except Exception as exc:  # a decoder bug costs this connection, nothing else
            log.exception("%s: decoder failed", self.peer)
            items, fatal = [], Internal(f"decoder failed: {exc!r}")
        self._take(items)
        if fatal is None:
            fatal = self._account_buffered()
        if fatal is not None:
            self.fatal(fatal)

    def _account_buffered(self) -> SarpError | None:
        """Track the bytes of this connection's unfinished message in the server's
        total; a `Busy` if that total is past max_buffered_bytes and this connection
        holds some of it."""
        server = self.server
        now = self.decoder.buffered
        server.buffered += now - self.buffered
        self.buffered = now
        limit = server.config.max_buffered_bytes
        if now and server.buffered > limit:
            return Busy(
                f"buffers: {server.buffered} bytes of unfinished messages over all "
                f"connections exceeds max_buffered_bytes ({limit}); retry later"
            )
        return None

    def _take(self, items: list[Request | BadMessage]) -> None:
        received = time.monotonic()  # decoded: once per read, not per request
        for item in items:
            if isinstance(item, BadMessage):
                self.send(encode_error(item.id, item.error))
            else:
                self.server.submit(self, item, received)
        self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.buffered -= self.buffered
        self.buffered = 0
        self.server.forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # -- used by the server ------------------------------------------------------

    def send(self, data: bytes) -> None:
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            return
        transport.write(data)
        limit = self.server.config.max_write_buffer
        if transport.get_write_buffer_size() > limit:
            log.warning(
                "%s: disconnected: %d bytes of unsent responses exceeds max_write_buffer (%d); "
                "the client does not read its responses",
                self.peer, transport.get_write_buffer_size(), limit,
            )
            transport.abort()
            self.closed = True

    def fatal(self, exc: SarpError) -> None:
        """Stop reading; once the requests already queued are answered, send one error
        response with id 0 and close (buffered data is flushed first)."""
        self._dead = exc
        self._update_reading()
        if self.inflight <= 0:
            self.send(encode_error(0, exc))
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def answered(self, n: int) -> None:
        self.inflight -= n
        if self._dead is not None and self.inflight <= 0:
            self.fatal(self._dead)
        else:
            self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.closed or self.transport.is_closing():
            return
        limit = self.server.config.max_inflight_per_conn
        want_pause = self._write_paused or self.inflight >= limit or self._dead is not None
        if want_pause and not self._read_paused:
            self.transport.pause_reading()
            self._read_paused = True
        elif not want_pause and self._read_paused:
            self.transport.resume_reading()
            self._read_paused = False


# (conn, request, its `request_bytes` counted once, when it was decoded: time.monotonic())
Queued = tuple[Connection, Request, int, float]


class WriteRouter(Protocol):
    """Cluster mode's hook (sarpd.daemon.forward.Forwarder): takes a connection's
    writes, and what must wait for them, before they reach the batcher."""

    def takes(self, conn: Connection, req: Request) -> bool: ...

    def stats(self) -> dict[str, object]: ...

    async def stop(self) -> None: ...


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.limits = Limits.from_config(config)
        self.policy = Policy.from_config(config)
        self.metrics = Metrics(self)  # reads gauges(), reported(), activity()
        self.service: Service | None = None
        self.forwarder: WriteRouter | None = None  # cluster mode: writes go to the log
        self.status = "starting"
        self.stopping = False
        self.suspended = False  # `suspend`: no new requests until `set_ready`
        self.conns: set[Connection] = set()
        self.queue: BatchQueue[Connection] = BatchQueue(config.batch_max_blocks,
                                                       config.index.block_tokens)
        self.buffered = 0  # bytes of unfinished messages over all connections
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="sarpd-worker")
        # held by whatever runs on the worker (`run_exclusive`), or by `answer_now` on
        # the loop's thread: the index is used by one of them at a time
        self.exclusive = threading.Lock()
        # the worker's helpers for a batch's matches (`worker_threads`; Service._match)
        threads = config.match_threads
        self.match_pool = (ThreadPoolExecutor(threads - 1, thread_name_prefix="sarpd-match")
                           if threads > 1 else None)
        self._conn_number = 0
        self._first_at = 0.0
        self._busy = False
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._srv: asyncio.AbstractServer | None = None
        self._batcher: asyncio.Task[None] | None = None
        # group commit (sarpd/daemon/syncer.py): with sync "always", answers wait for a
        # shared sync, in batch order; the newest batch's delivery is this task
        self.syncer: Syncer | None = None
        self._delivering: asyncio.Task[None] | None = None
        self._socket_ino: int | None = None

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket (mode and group set right after bind) and start batching."""
        path = self.config.socket
        check_socket_path(path)
        loop = asyncio.get_running_loop()
        self._srv = await loop.create_unix_server(lambda: Connection(self), str(path), backlog=512)
        try:
            os.chmod(path, self.config.socket_mode)
            if self.config.socket_group is not None:
                shutil.chown(path, group=self.config.socket_group)
        except (OSError, LookupError) as exc:
            self._srv.close()
            raise ConfigError(
                f"socket {path}: cannot set mode {self.config.socket_mode:o} / group "
                f"{self.config.socket_group!r}: {exc}"
            ) from exc
        self._socket_ino = os.stat(path).st_ino
        self._batcher = asyncio.create_task(self._batch_loop(), name="sarpd-batcher")
        log.info("listening on %s", path)

    def set_ready(self, service: Service) -> None:
        """Serve `service` (build it with ``extra_stats=server.extra_stats``)."""
        self.service = service
        self.status = "ready"
        self.suspended = False

    async def suspend(self, why: str) -> None:
        """Stop serving the current service, keeping the socket and the connections:
        requests from now on answer `unavailable` (`why`); those already queued are
        answered first. `set_ready` serves again (cluster mode's re-bootstrap)."""
        self.status = why
        self.suspended = True
        await self._drain()
        self.service = None

    async def _drain(self) -> None:
        """Return once every queued request is answered (new ones are refused)."""
        self._full.set()
        while self.queue or self._busy:
            self._idle.clear()
            await self._idle.wait()
        if self._delivering is not None:  # answers waiting for their sync
            with contextlib.suppress(Exception):  # `_deliver` logged it
                await self._delivering

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run `fn` in the worker thread, between batches."""
        return await asyncio.get_running_loop().run_in_executor(self.executor,
                                                                self._exclusively, fn)

    def _exclusively(self, fn: Callable[[], T]) -> T:
        with self.exclusive:
            return fn()

    def answer_now(self, req: Request) -> object | None:
        """Answer a read (a `match`) on the loop's thread, now, when nothing is queued or
        running: a caller that waits for each answer (an HTTP query) skips the hops to
        the worker and back. None: not now (busy, or not serving): `submit` it. The
        match runs while the loop waits (tens of microseconds, as a batch's own
        Python would); the worker cannot start meanwhile (`exclusive`)."""
        service = self.service
        if (service is None or self.stopping or self.suspended or self.queue or self._busy
                or kind_of(req) != "read"):
            return None
        if not self.exclusive.acquire(blocking=False):
            return None
        received = time.monotonic()
        try:
            results = service.run_batch([(0, req)])  # never raises
        finally:
            self.exclusive.release()
        self.metrics.record_batch([req], results)
        self.metrics.record_latency([req], [received], time.monotonic())
        return results[0]

    async def stop(self) -> None:
        """Stop accepting, answer every request already received, close connections,
        remove the socket. New requests that arrive meanwhile get `unavailable`."""
        self.stopping = True
        self.status = "shutting down"
        if self._srv is not None:
            self._srv.close()
        await self._drain()
        for conn in list(self.conns):
            conn.close()
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        self.remove_socket()

    def remove_socket(self) -> None:
        path = self.config.socket
        with contextlib.suppress(OSError):
            if self._socket_ino is not None and os.stat(path).st_ino == self._socket_ino:
                path.unlink()

    # -- connections ---------------------------------------------------------------

    def next_conn_number(self) -> int:
        self._conn_number += 1
        return self._conn_number

    def admit(self, conn: Connection) -> bool:
        if self.stopping or len(self.conns) >= self.config.max_connections:
            return False
        self.conns.add(conn)
        return True

    def forget(self, conn: Connection) -> None:
        self.conns.discard(conn)

    # -- what stats and metrics read (safe from any thread) -------------------------

    def gauges(self) -> dict[str, float]:
        """Server-side gauges for `stats` and /metrics."""
        return {
            "queue_depth": len(self.queue),
            "queue_bytes": self.queue.nbytes,
            "buffered_bytes": self.buffered,
            "connections": len(self.conns),
        }

    def reported(self) -> Mapping[str, Mapping[str, float]]:
        """What sarpd's clients reported (kept by the service), once serving."""
        service = self.service
        return {} if service is None else service.reports.snapshot()

    def activity(self) -> Activity | None:
        """The index's activity counters, once serving (see `IndexLike`)."""
        service = self.service
        return None if service is None else service.index.activity

    def cluster(self) -> Mapping[str, object] | None:
        """What the replica says of itself (cluster mode; None on a single node)."""
        forwarder = self.forwarder
        return None if forwarder is None else forwarder.stats()

    def extra_stats(self) -> dict[str, object]:
        """The server's part of the `stats` op: gauges and metrics counters."""
        out: dict[str, object] = {**self.gauges(), **self.metrics.snapshot()}
        if self.syncer is not None:  # group commit: write batches and the syncs they shared
            out["group_commit_batches"] = self.syncer.written
            out["group_commit_syncs"] = self.syncer.syncs
        cluster = self.cluster()
        if cluster is not None:
            out["cluster"] = dict(cluster)
        return out

    def reject(self, conn: Connection, req: Request, err: SarpError) -> None:
        self.metrics.record_rejected(op_name(req), err.code)
        conn.send(encode_error(req.id, err))

    def submit(self, conn: Connection, req: Request, received: float | None = None,
               now: bool = False) -> None:
        """Queue `req` for the batcher, or answer it at once; `received`: when it was
        decoded (time.monotonic(); default now), for its latency. `now`: run the batch
        it joins without waiting out the batch window (a caller that cannot pipeline:
        an HTTP query waits for its answer before the next comes)."""
        if self.service is None or self.stopping or self.suspended:
            self.reject(conn, req, Unavailable(self.status))
            return
        if self.policy.checks_requests and not conn.trusted:
            refused = self.policy.authorize(conn.cred, req)
            if refused is not None:
                self.reject(conn, req, refused)
                return
        if self.forwarder is not None and self.forwarder.takes(conn, req):
            return  # cluster mode: a write, or a request behind one (sarpd.daemon.forward)
        if len(self.queue) >= self.config.max_queue:
            limit = self.config.max_queue
            self.reject(conn, req, Busy(f"queue: {len(self.queue)} requests queued reaches "
                                        f"max_queue ({limit}); retry later"))
            return
        size = request_bytes(req)
        if self.queue and self.queue.nbytes + size > self.config.max_queue_bytes:
            limit = self.config.max_queue_bytes
            self.reject(conn, req, Busy(
                f"queue: {self.queue.nbytes} + {size} bytes queued exceeds max_queue_bytes "
                f"({limit}); retry later"))
            return
        if not self.queue:
            self._first_at = asyncio.get_running_loop().time()
        self.queue.push((conn, req, size, time.monotonic() if received is None else received),
                        kind_of(req) == "read")
        conn.inflight += 1
        conn.batched += 1
        conn.batch_idle.clear()
        self._wake.set()
        if now or len(self.queue) >= self.config.batch_max:
            self._full.set()

    # -- batching ------------------------------------------------------------------

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        window = max(0.0, self.config.batch_window_ms / 1000.0)
        bmax = max(1, self.config.batch_max)
        while True:
            if not self.queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            remaining = self._first_at + window - loop.time()
            if len(self.queue) < bmax and remaining > 0 and not self.stopping:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._full.wait()
            batch = self.queue.take(bmax)  # which requests: sarpd.daemon.batching
            self._first_at = float("-inf")  # leftovers have waited long enough
            self._busy = True
            try:
                await self._run(batch)
            except Exception:
                # Last resort, not an answer: the service answers every request and
                # `_run` sends the answers even when the metrics fail, so only a bug
                # gets here, and a bug must not stop the batcher (the daemon's loop).
                log.exception("batcher: unexpected error after a batch of %d", len(batch))
            finally:
                self._busy = False

    async def _run(self, batch: list[Queued]) -> None:
        service = self.service
        assert service is not None
        block_tokens = self.config.index.block_tokens
        keyed = [(id(conn), req) for conn, req, _, _ in batch]

        def work() -> tuple[list[object], list[bytes], bool]:
            results = service.run_batch(keyed)  # never raises
            frames = [
                _encode(req, res, block_tokens)
                for (_, req), res in zip(keyed, results, strict=True)
            ]
            return results, frames, service.unsynced

        results, frames, unsynced = await self.run_exclusive(work)
        ticket = self.syncer.ticket() if unsynced and self.syncer is not None else None
        if ticket is None and self._delivering is None:
            self._deliver_now(batch, keyed, results, frames)
        else:  # after the batches before it, and once its writes are durable
            self._delivering = asyncio.create_task(
                self._deliver(batch, keyed, results, frames, ticket, self._delivering))
        if self.metrics.index_stats_due():
            await self.run_exclusive(partial(self.metrics.refresh_index, service.index.stats))

    def _deliver_now(self, batch: list[Queued], keyed: list[tuple[int, Request]],
                     results: list[object], frames: list[bytes]) -> None:
        try:  # before the answers go out, so that a client sees its own requests counted
            self.metrics.record_batch([req for _, req in keyed], results)
        finally:  # metrics never cost an answer
            self._send(batch, frames)
        self.metrics.record_latency(  # the answers are written (to the transports) now
            [req for _, req in keyed], [at for *_, at in batch], time.monotonic())

    async def _deliver(self, batch: list[Queued], keyed: list[tuple[int, Request]],
                       results: list[object], frames: list[bytes], ticket: int | None,
                       before: asyncio.Task[None] | None) -> None:
        """Answer a batch once the batches before it are answered and its writes are
        durable (group commit); a failed sync answers its writes `unavailable`."""
        if before is not None:
            with contextlib.suppress(Exception):  # its own failure is its own (logged)
                await before
        try:
            await self._durable_then_send(batch, keyed, results, frames, ticket)
        except Exception:  # a bug: logged, and the next batches still go out
            log.exception("group commit: answering a batch of %d failed", len(batch))
        finally:
            if self._delivering is asyncio.current_task():
                self._delivering = None

    async def _durable_then_send(self, batch: list[Queued], keyed: list[tuple[int, Request]],
                                 results: list[object], frames: list[bytes],
                                 ticket: int | None) -> None:
        if ticket is not None:
            assert self.syncer is not None
            try:
                await self.syncer.durable(ticket)
            except Exception as exc:
                err = Unavailable(f"write: the sync of the disk failed ({exc}); nothing "
                                  "of this write is acknowledged, retry later")
                log.error("group commit: sync failed: %s", exc)
                writes = [kind_of(req) == "write" for _, req in keyed]  # the service's rule
                results = [err if w else res for w, res in zip(writes, results, strict=True)]
                frames = [encode_error(req.id, err) if w else frame
                          for w, (_, req), frame in zip(writes, keyed, frames, strict=True)]
        self._deliver_now(batch, keyed, results, frames)

    @staticmethod
    def _send(batch: list[Queued], frames: list[bytes]) -> None:
        per_conn: dict[Connection, list[bytes]] = {}
        for (conn, *_), frame in zip(batch, frames, strict=True):
            per_conn.setdefault(conn, []).append(frame)
        for conn, parts in per_conn.items():
            conn.send(b"".join(parts))
            conn.batched -= len(parts)
            if not conn.batched:
                conn.batch_idle.set()
            conn.answered(len(parts))


def request_bytes(req: Request) -> int:
    """Bytes of the arrays a decoded request holds (tokens or ids, meta, ids)."""
    n = 0
    seq = getattr(req, "seq", None)
    if seq is not None:
        arr = seq.tokens if seq.tokens is not None else seq.hashes
        n += 0 if arr is None else int(arr.nbytes)
    for name in ("meta", "ids"):
        value = getattr(req, name, None)
        if isinstance(value, np.ndarray):
            n += int(value.nbytes)
    return n


def _encode(req: Request, result: object, block_tokens: int) -> bytes:
    try:
        return encode_result(req.id, result, block_tokens=block_tokens)
    except Exception as exc:
        log.exception("cannot encode the result of request %d", req.id)
        return encode_error(req.id, Internal(f"cannot encode result: {exc!r}"))


def check_socket_path(path: Path) -> None:
    """Refuse a path that is too long, in a directory that does not exist, is not a
    socket, or has a live server behind it; remove a stale socket file left by a crash."""
    if len(os.fsencode(path)) >= 108:
        raise ConfigError(f"socket {path}: path is {len(os.fsencode(path))} bytes; limit is 107")
    if not path.parent.is_dir():  # never a `mkdir -p`: a typo must not serve elsewhere
        raise ConfigError(f"socket {path}: directory {path.parent} does not exist "
                          "(create it first; under systemd, RuntimeDirectory= does)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"socket {path}: exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # stale: nobody listens
        return
    finally:
        probe.close()
    raise ConfigError(f"socket {path}: another server is listening on it")

