"""One pipelined connection to sarpd on its Unix socket: `Client` (asyncio).

    client = await Client.connect("/run/sarpd/sarpd.sock")
    await client.insert(tokens=prompt_tokens, meta=worker_slot)
    hit = await client.match(tokens=prompt_tokens)   # {"blocks", "tokens", "meta": [...]}

Any number of requests may be in flight at once (``asyncio.gather`` them); responses
are matched to requests by id. A lost connection fails every request in flight, and
every later one, with `ConnectionLost`.

A window of requests goes out in one write without a coroutine per request (the
bridge's way): `Client.submit` buffers each request and returns the future of its
result, `Client.flush` writes every buffered one at once, `Client.outcomes` waits
for them, at most the request timeout. `Client.request` is the same path for one
request (submit, flush, wait).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import msgpack

from sarpd.client.fields import Result
from sarpd.client.ops import (
    REQUEST_TIMEOUT_S,
    ConnectFailed,
    ConnectionLost,
    Ops,
    RequestTimeout,
    timeout_arg,
)
from sarpd.errors import SarpError
from sarpd.protocol.wire import encode_request, error_from_code

if TYPE_CHECKING:
    from sarpd.client.cluster import ClusterClient

__all__ = ["CLOSE_TIMEOUT_S", "MAX_RESPONSE_BYTES", "Client"]

MAX_RESPONSE_BYTES = 256 * 1024 * 1024
CLOSE_TIMEOUT_S = 1.0  # close: how long unsent bytes may take before they are dropped


class _Conn(asyncio.Protocol):
    """The connection state: pending futures by request id, response unpacker."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[Result]] = {}
        self.lost: str | None = None  # why the connection is gone
        self.server_error: SarpError | None = None  # an id-0 error before the close
        self.closed = asyncio.get_running_loop().create_future()
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_RESPONSE_BYTES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._unpacker.feed(data)
            for msg in self._unpacker:
                self._dispatch(msg)
        except Exception as exc:
            self.abort(f"bad response from sarpd ({exc or 'not a response map'})")

    def _dispatch(self, msg: object) -> None:
        if not isinstance(msg, dict) or type(msg.get("id")) is not int:
            raise ValueError(f"expected a response map with an id, got {msg!r:.80}")
        rid, ok = msg["id"], msg.get("ok")
        if ok is True:
            del msg["id"], msg["ok"]  # what is left: the result fields
            outcome: Result | SarpError = msg
        else:
            error = msg.get("error")
            if not isinstance(error, dict):
                raise ValueError(f"response {rid}: ok is {ok!r} and no error map")
            outcome = error_from_code(str(error.get("code")), str(error.get("message")))
        fut = self.pending.pop(rid, None)
        if fut is None:
            if rid == 0 and isinstance(outcome, SarpError):  # a stream error: close follows
                self.server_error = outcome
            return  # else: its caller was cancelled
        if fut.done():
            return
        if isinstance(outcome, SarpError):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def abort(self, reason: str) -> None:
        self.lost = self.lost or reason
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.server_error is not None:
            err = self.server_error
            reason = f"closed by sarpd after a stream error ({err.code}: {err.message})"
        elif isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror
        elif exc is not None:
            reason = str(exc) or "the transport failed"
        else:
            reason = "closed by sarpd"
        self.lost = self.lost or reason
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self.lost_error())
        self._wake_writers(self.lost_error())
        if not self.closed.done():
            self.closed.set_result(None)

    def lost_error(self) -> ConnectionLost:
        err = ConnectionLost(f"connection to sarpd at {self.path} lost: {self.lost}")
        err.__cause__ = self.server_error
        return err

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers(None)

    def _wake_writers(self, exc: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if w.done():
                continue
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)

    async def drain(self) -> None:
        if self._paused and self.lost is None:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter


class Client(Ops):
    """A pipelined asyncio connection to sarpd. Create with ``await Client.connect()``."""

    def __init__(self, conn: _Conn, request_timeout: float | None = REQUEST_TIMEOUT_S) -> None:
        self._conn = conn
        self._next_id = 1  # 0 is what the server uses for stream errors
        self._frames: list[bytes] = []  # submitted, not yet written (`flush`)
        self.request_timeout = request_timeout  # None: no limit

    @property
    def path(self) -> str:
        return self._conn.path

    @classmethod
    async def cluster(cls, urls: str | Sequence[str], *, timeout: float = 30.0,
                      ) -> ClusterClient:
        """A client over a whole cluster (NATS URLs; `ClusterClient.open`)."""
        from sarpd.client.cluster import ClusterClient

        return await ClusterClient.open(urls, timeout=timeout)

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *, timeout: float = 10.0,
                      request_timeout: float | None = REQUEST_TIMEOUT_S) -> Client:
        """Connect to the sarpd socket at ``path``; `ConnectFailed` says why not.
        ``timeout``: for the connection; ``request_timeout``: how long each request may
        go unanswered before `RequestTimeout` (None: no limit)."""
        spath = os.fspath(path)
        request_timeout = timeout_arg("request_timeout", request_timeout)
        loop = asyncio.get_running_loop()
        try:
            transport, conn = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _Conn(spath), spath), timeout
            )
        except FileNotFoundError as exc:
            msg = f"sarpd socket {spath} does not exist (is sarpd running with --socket {spath}?)"
            raise ConnectFailed(msg) from exc
        except ConnectionRefusedError as exc:
            raise ConnectFailed(f"nothing listens on sarpd socket {spath} (stale?)") from exc
        except PermissionError as exc:
            msg = f"no permission to connect to sarpd socket {spath} (check its group)"
            raise ConnectFailed(msg) from exc
        except TimeoutError as exc:
            raise ConnectFailed(
                f"connecting to sarpd socket {spath}: no answer in {timeout}s"
            ) from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to sarpd socket {spath}: {exc}") from exc
        if conn.transport is None:  # uvloop calls connection_made a little later
            conn.transport = transport
        return cls(conn, request_timeout)

    def submit(self, op: str, fields: Mapping[str, Any]) -> asyncio.Future[Result]:
        """Buffer one request (written by the next `flush`, in order) and return the
        future of its result fields; it fails with the SarpError of an error response,
        or `ConnectionLost` when the connection is (or goes) away."""
        return self._submit(op, fields)[1]

    def _submit(self, op: str, fields: Mapping[str, Any]) -> tuple[int, asyncio.Future[Result]]:
        conn = self._conn
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        if conn.lost is not None or conn.transport is None:
            fut.set_exception(conn.lost_error())
            return 0, fut
        rid = self._next_id
        frame = encode_request(rid, op, fields)  # a BadRequest here leaves nothing behind
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        self._frames.append(frame)
        conn.pending[rid] = fut
        return rid, fut

    async def flush(self) -> None:
        """Write every buffered request in one write, then wait while the transport's
        buffer is full (sarpd reads slower than we send)."""
        frames, self._frames = self._frames, []
        conn = self._conn
        if frames and conn.lost is None and conn.transport is not None:
            conn.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
            await conn.drain()

    async def outcomes(self, futs: Sequence[asyncio.Future[Result]],
                       ) -> list[Result | BaseException]:
        """Every future's outcome (`submit`): its result fields or its error. A sarpd
        that leaves one unanswered past the request timeout is dropped: the connection
        is aborted and the rest fail with `ConnectionLost` (a caller may retry them on
        a new connection)."""
        if futs and self.request_timeout is not None:
            _done, late = await asyncio.wait(futs, timeout=self.request_timeout)
            if late:
                self._conn.abort(f"{len(late)} requests unanswered after "
                                 f"{self.request_timeout:g} s")
        return list(await asyncio.gather(*futs, return_exceptions=True))

    async def send(self, op: str, fields: Mapping[str, Any], timeout: float | None) -> Result:
        """One request (`submit`, `flush`), its result within ``timeout`` seconds."""
        conn = self._conn
        if conn.lost is not None or conn.transport is None:
            raise conn.lost_error()
        rid, fut = self._submit(op, fields)
        try:
            async with asyncio.timeout(timeout):
                await self.flush()
                return await fut
        except TimeoutError as exc:
            raise RequestTimeout(
                f"sarpd at {conn.path} did not answer {op} within {timeout:g} s (the request "
                "timeout): it is stuck, overloaded, or not sarpd") from exc
        finally:
            conn.pending.pop(rid, None)  # a late answer finds no request: dropped

    async def close(self) -> None:
        """Close the connection; requests still in flight fail with ConnectionLost."""
        conn = self._conn
        if conn.transport is not None and not conn.closed.done():
            conn.lost = conn.lost or "closed by the client"
            conn.transport.close()
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(conn.closed)
            except TimeoutError:  # sarpd reads nothing: drop the bytes it did not take
                conn.transport.abort()
        await conn.closed

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
