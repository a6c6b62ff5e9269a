"""The bridge's connection to sarpd: `Client`, plus a window of requests in one write.

`Client.request` costs a coroutine, a task (under ``gather``) and a write per
request: most of the bridge's CPU once decoding is cheap. `PipeClient.submit`
encodes a request, registers its response future with the connection and leaves it
in a buffer; `flush` writes every buffered request at once (one system call per
window). Responses arrive, and are matched to requests, exactly as for
`Client.request` (the same connection object, the same ids, the same errors):
`submit` returns the future of the raw response map, which `result_of` turns into
the result fields (or the `SarpError` of an error response).

The requests the bridge sends (`request_of`): ids go out as msgpack uints (sarpd
zero-extends them, PROTOCOL.md `hashes`), `meta` as one uint for every block.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sarpd.bridge.mapping import ClearOp, InsertOp, Op, RemoveOp
from sarpd.client import REQUEST_TIMEOUT_S, Client
from sarpd.protocol.wire import encode_request

__all__ = ["PipeClient", "request_of", "result_of"]


def request_of(op: Op) -> tuple[str, dict[str, Any]]:
    """The sarpd request (op name, fields) of an insert, a removal or a clear."""
    if isinstance(op, InsertOp):
        fields: dict[str, Any] = {"ns": op.ns, "hashes": op.hashes, "meta": op.meta}
        if op.parent is not None:
            fields["parent"] = op.parent
        return "insert", fields
    if isinstance(op, RemoveOp):
        fields = {"ns": op.ns, "ids": op.ids}
        if op.meta is not None:
            fields["meta"] = op.meta
        return "remove", fields
    if isinstance(op, ClearOp):
        return "clear", {"ns": op.ns, "mask": op.mask, "value": op.value}
    raise TypeError(f"request_of: {type(op).__name__} is not one request")


class PipeClient(Client):
    """A `Client` that can also send a window of requests in one write."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self._frames: list[bytes] = []

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *, timeout: float = 10.0,
                      request_timeout: float | None = REQUEST_TIMEOUT_S) -> PipeClient:
        client = await super().connect(path, timeout=timeout, request_timeout=request_timeout)
        assert isinstance(client, PipeClient)
        return client

    def submit(self, op: str, fields: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Buffer one request (sent by `flush`); its future gets the response map, or
        the connection's error when it is lost."""
        conn = self._conn
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if conn.lost is not None or conn.transport is None:
            fut.set_exception(conn.lost_error())
            return fut
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        self._frames.append(encode_request(rid, op, fields))
        conn.pending[rid] = fut
        return fut

    async def flush(self) -> None:
        """Write every buffered request (in order), then wait while the transport's
        buffer is full."""
        frames, self._frames = self._frames, []
        conn = self._conn
        if frames and conn.lost is None and conn.transport is not None:
            conn.transport.write(b"".join(frames))
            await conn.drain()


    async def outcomes(self, futs: list[asyncio.Future[Any]]) -> list[Any]:
        """Every future's outcome, a response map or its error. A sarpd that leaves
        one unanswered past the request timeout is dropped: the connection is aborted
        and the rest fail with `ConnectionLost`, which the bridge retries."""
        if futs and self.request_timeout is not None:
            _done, late = await asyncio.wait(futs, timeout=self.request_timeout)
            if late:
                self._conn.abort(f"{len(late)} requests unanswered after "
                                 f"{self.request_timeout:g} s")
        return await asyncio.gather(*futs, return_exceptions=True)


def result_of(outcome: dict[str, Any] | BaseException) -> dict[str, Any] | BaseException:
    """A raw response map as `Client.request` returns it (without ``id`` and ``ok``)."""
    if isinstance(outcome, dict):
        outcome.pop("id", None)
        outcome.pop("ok", None)
    return outcome
