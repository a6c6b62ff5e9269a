"""The indexer API's HTTP/1.1 server: an asyncio Protocol over httptools (llhttp, the
parser uvicorn runs on), on sarpd's loop, on `http_host:http_port`.

Why not the aiohttp application that serves /metrics on `metrics_port`: a gateway
sends a query, waits for its answer, and sends the next, so per-request overhead is
latency. aiohttp's request and response objects cost ~50 us a request (a trivial
handler answers one keep-alive client in ~76 us p50 on aiohttp, ~25 us on this
protocol, same machine and client), against ~100-200 us of a /query's own work.

    request   HTTP/1.0 or 1.1; a body by Content-Length or chunked (decoded by the
              parser), at most `max_body` bytes: past it 413 and the connection
              closed; ``Expect: 100-continue`` answered at once
    routing   (method, path) -> handler; a path not served 404, another method on a
              served path 405; every error body is JSON ``{"error": ...}``
    handler   `Request` -> `Reply`, or an awaitable of one. A reply in hand is written
              at once, inside data_received (a query answered on the spot takes no
              task); an awaitable is awaited by a task, and the requests pipelined
              behind it wait for it: answers go out in the order of the requests
    response  status line, Content-Type, Content-Length; ``Connection: close`` when
              the client asked for it (or spoke HTTP/1.0 without keep-alive), the
              connection then closed after the answer
    errors    a request the parser refuses: 400 and close; an exception a handler did
              not turn into a Reply: 500 ``{"error": "internal error ..."}``, logged
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast

import httptools
import msgspec

__all__ = ["ApiServer", "Handler", "Reply", "Request", "json_error"]

log = logging.getLogger("sarpd.daemon.api_http")

MAX_PIPELINED = 64  # requests queued behind a pending one before reading pauses
_KEPT = frozenset({b"accept", b"expect"})  # the request headers handlers may read


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str  # the raw query string ("" if none)
    headers: Mapping[bytes, bytes]  # of `_KEPT`, names lowercased
    body: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: bytes = b"application/json"


Handler = Callable[[Request], "Reply | Awaitable[Reply]"]


def json_error(status: int, message: str) -> Reply:
    return Reply(status, msgspec.json.encode({"error": message}))


_INTERNAL = json_error(500, "internal error (see the sarpd log)")
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def encode(reply: Reply, close: bool) -> bytes:
    reason = _REASONS.get(reply.status, b"Unknown")
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        reply.status, reason, reply.content_type, len(reply.body),
        b"Connection: close\r\n" if close else b"")
    return head + reply.body


class ApiServer:
    """The routes, served on one or more listening sockets (`listen`)."""

    def __init__(self, routes: Mapping[tuple[str, str], Handler], max_body: int) -> None:
        self.routes = dict(routes)
        self.paths = {path for _, path in routes}
        self.max_body = max_body
        self.conns: set[_Conn] = set()
        self._servers: list[asyncio.AbstractServer] = []

    async def listen(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_server(lambda: _Conn(self), host, port))

    def route(self, req: Request) -> Reply | Awaitable[Reply]:
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            if req.path in self.paths:
                return json_error(405, f"{req.method} is not allowed on {req.path}")
            return json_error(404, f"{req.path}: not found")
        return handler(req)

    async def close(self) -> None:
        for srv in self._servers:
            srv.close()
        for conn in list(self.conns):
            conn.abort()
        for srv in self._servers:
            await srv.wait_closed()
        self._servers.clear()


class _Conn(asyncio.Protocol):
    """One client connection (module docstring)."""

    def __init__(self, app: ApiServer) -> None:
        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[tuple[Request, bool]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.paused = False
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass
        self.app.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.app.conns.discard(self)
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send(json_error(400, "protocol upgrades are not served"), close=True)
        except httptools.HttpParserError as exc:
            self._send(json_error(400, f"malformed HTTP request: {exc}"), close=True)

    # -- httptools callbacks ---------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _KEPT:
            self.headers[name] = value

    def on_headers_complete(self) -> None:
        if self.headers.get(b"expect", b"").lower() == b"100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= self.app.max_body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        keep = self.parser.should_keep_alive()
        if self.size > self.app.max_body:
            self._queue(None, False)
            return
        url = httptools.parse_url(self.url)
        req = Request(self.parser.get_method().decode("latin-1"),
                      url.path.decode("latin-1"),
                      url.query.decode("latin-1") if url.query else "",
                      self.headers, b"".join(self.body))
        self._queue(req, keep)

    # -- answering, in order ---------------------------------------------------------
    def _queue(self, req: Request | None, keep: bool) -> None:
        if req is None:  # over max_body: answered, then closed
            req = Request("", "", "", {}, b"")
            keep = False
            self.pending.append((req, keep))
        elif self.task is None and not self.pending:
            self._answer(req, keep)
            return
        else:
            self.pending.append((req, keep))
        if self.task is None:
            self._drain()
        elif len(self.pending) >= MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True

    def _answer(self, req: Request, keep: bool) -> None:
        """Answer now if the handler has its reply in hand, else start a task."""
        if not req.method:
            self._send(json_error(413, f"body: over {self.app.max_body} bytes"), close=True)
            return
        try:
            out = self.app.route(req)
        except Exception:
            log.exception("indexer API: %s %s failed", req.method, req.path)
            out = _INTERNAL
        if isinstance(out, Reply):
            self._send(out, close=not keep)
        else:
            self.task = asyncio.get_running_loop().create_task(self._later(out, keep))

    async def _later(self, aw: Awaitable[Reply], keep: bool) -> None:
        try:
            reply = await aw
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("indexer API: a request failed")
            reply = _INTERNAL
        self.task = None
        self._send(reply, close=not keep)
        self._drain()

    def _drain(self) -> None:
        """The requests that waited behind a pending one, while answers are in hand."""
        while self.pending and self.task is None and not self.closing:
            req, keep = self.pending.popleft()
            self._answer(req, keep)
        if self.paused and not self.pending and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _send(self, reply: Reply, close: bool) -> None:
        if self.closing or self.transport is None:
            return
        self.transport.write(encode(reply, close))
        if close:
            self.closing = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
