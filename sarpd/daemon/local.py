"""A client inside sarpd: requests from the daemon's own parts (the indexer API's HTTP
handlers and event listeners) through the server's batcher, as a socket's are.

A `LocalConn` is a connection without a transport: `request` submits a request (every
limit, the batching, the group commit and the answer order apply as for a socket) and
resolves with its answer: the response map of docs/PROTOCOL.md, decoded (a failure
raises the `SarpError` its code names). Requests on one `LocalConn` take effect in the
order submitted, so a listener owns one; the HTTP handlers share one.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgpack

from sarpd.daemon.server import Connection, Server
from sarpd.model import Request
from sarpd.protocol.wire import error_from_code

__all__ = ["LocalConn"]


class LocalConn(Connection):
    trusted = True  # sarpd's own part: no access policy (bind_namespaces) applies

    def __init__(self, server: Server, name: str) -> None:
        super().__init__(server)
        self.peer = name
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    def next_id(self) -> int:
        return next(self._ids)

    def submit(self, req: Request, now: bool = False) -> asyncio.Future[dict[str, Any]]:
        """Queue `req` (its id from `next_id`); the future resolves with its answer.
        `now`: without waiting out the batch window (`Server.submit`)."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[req.id] = fut  # before submit: a refusal is answered at once
        self.server.submit(self, req, now=now)
        return fut

    async def request(self, req: Request, now: bool = False) -> dict[str, Any]:
        return await self.submit(req, now)

    def send(self, data: bytes) -> None:
        self._unpacker.feed(data)
        for resp in self._unpacker:
            fut = self._waiting.pop(resp.get("id", 0), None)
            if fut is None or fut.done():
                continue
            if resp.get("ok"):
                fut.set_result(resp)
            else:
                err = resp.get("error") or {}
                fut.set_exception(error_from_code(str(err.get("code", "internal")),
                                                  str(err.get("message", ""))))

    def close(self) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
