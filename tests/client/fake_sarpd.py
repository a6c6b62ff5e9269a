"""A fake sarpd for the client's tests: an in-process server on a real Unix socket
(`fake_server`), answering with the server's own encoders (`answer`)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from sarpd.model import Match, MatchResult
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    encode_error,
    encode_ok,
    encode_result,
)

# ------------------------------------------------------------------------ fake server

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextmanager
def short_tmpdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sarpc", dir="/tmp"))  # sun_path is 108 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def fake_server(handler: Handler) -> AsyncIterator[Path]:
    with short_tmpdir() as tmp:
        path = tmp / "fake.sock"
        server = await asyncio.start_unix_server(handler, path=str(path))
        try:
            yield path
        finally:
            server.close()
            await server.wait_closed()


async def read_requests(reader: asyncio.StreamReader, n: int, dec: Decoder) -> list[Any]:
    reqs: list[Any] = []
    while len(reqs) < n:
        data = await reader.read(65536)
        if not data:
            break
        reqs += dec.feed(data)
    return reqs


def answer(req: Any) -> bytes:
    """Match: one block per 16 tokens, meta = block index; others: echo the op."""
    if isinstance(req, Match):
        assert req.seq.tokens is not None
        k = len(req.seq.tokens) // 16
        return encode_result(req.id, MatchResult(blocks=k, meta=np.arange(k, dtype=np.uint64)))
    if isinstance(req, BadMessage):
        return encode_error(req.id, req.error)
    return encode_ok(req.id, {"op": type(req).__name__.lower()})


LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def run(coro: Awaitable[None], loop_factory: LoopFactory = asyncio.new_event_loop) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, 20)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(bounded())

