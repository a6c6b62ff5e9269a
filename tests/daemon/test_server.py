"""The asyncio server in-process (real Unix socket, fake index): the recovery gate,
batching, back-pressure bookkeeping and a clean stop."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sarpd.config import ServerConfig
from sarpd.daemon.server import Server, check_socket_path
from sarpd.daemon.service import Service
from sarpd.errors import SarpError
from tests.daemon.test_service import FakeIndex


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.unpacker = msgpack.Unpacker(raw=False)

    def send(self, *msgs: dict[str, Any]) -> None:
        self.writer.write(b"".join(msgpack.packb(m) for m in msgs))

    async def recv(self) -> dict[str, Any]:
        while True:
            for msg in self.unpacker:
                return dict(msg)
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            if not data:
                raise ConnectionError("closed")
            self.unpacker.feed(data)


@asynccontextmanager
async def serving(**cfg: Any) -> AsyncIterator[tuple[Server, Path]]:
    with tempfile.TemporaryDirectory(prefix="sarp-", dir="/tmp") as tmp:
        path = Path(tmp) / "s.sock"
        server = Server(ServerConfig(socket=path, **cfg))
        await server.start()
        try:
            yield server, path
        finally:
            if not server.stopping:
                await server.stop()
            server.executor.shutdown()


async def peer(path: Path) -> Peer:
    return Peer(*await asyncio.open_unix_connection(str(path)))


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro())


def test_unavailable_until_ready_then_served() -> None:
    async def main() -> None:
        async with serving() as (server, path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
            p = await peer(path)
            server.status = "recovering: 3 of 10 segments"
            p.send({"id": 1, "op": "ping"})
            resp = await p.recv()
            assert resp["error"] == {
                "code": "unavailable",
                "message": "recovering: 3 of 10 segments",
            }
            server.set_ready(Service(FakeIndex(), server.config, "memory"))
            p.send({"id": 2, "op": "ping"})
            assert await p.recv() == {"id": 2, "ok": True}

    run(main)


def test_pipelined_requests_share_batches_and_keep_order() -> None:
    async def main() -> None:
        async with serving(batch_window_ms=20.0, batch_max=1000) as (server, path):
            idx = FakeIndex()
            server.set_ready(Service(idx, server.config, "memory"))
            peers = [await peer(path) for _ in range(3)]
            for k, p in enumerate(peers):
                p.send(*({"id": i, "op": "ping"} for i in range(1, 51)))
                p.send({"id": 51, "op": "stats"}) if k == 2 else None
            for p in peers:
                assert [(await p.recv())["id"] for _ in range(50)] == list(range(1, 51))
            stats = await peers[2].recv()
            assert stats["requests"] == 151 and stats["batches"] <= 3

    run(main)


def test_inflight_limit_pauses_reading_and_resumes() -> None:
    """With max_inflight_per_conn 4, the server stops reading from a connection that
    has 4 unanswered requests, and resumes once they are answered."""

    async def main() -> None:
        async with serving(max_inflight_per_conn=4, batch_window_ms=5.0) as (server, path):
            server.set_ready(Service(FakeIndex(), server.config, "memory"))
            p = await peer(path)
            await asyncio.sleep(0.01)
            (conn,) = server.conns
            assert conn.transport is not None
            pauses = 0
            pause = conn.transport.pause_reading

            def counting_pause() -> None:
                nonlocal pauses
                pauses += 1
                pause()

            conn.transport.pause_reading = counting_pause  # type: ignore[method-assign]
            n = 300
            for i in range(1, n + 1):  # one write per request: many reads
                p.send({"id": i, "op": "ping", "pad": b"x" * 1000})
                await p.writer.drain()
            got = [(await p.recv())["id"] for _ in range(n)]
            assert got == list(range(1, n + 1))
            assert pauses > 0
            assert conn.transport.is_reading()

    run(main)


def test_stop_answers_received_requests_then_closes_and_removes_the_socket() -> None:
    async def main() -> None:
        async with serving(batch_window_ms=200.0) as (server, path):
            server.set_ready(Service(FakeIndex(), server.config, "memory"))
            p = await peer(path)
            p.send(*({"id": i, "op": "ping"} for i in range(1, 11)))
            await asyncio.sleep(0.05)  # received, waiting in the batch window
            await server.stop()
            assert [(await p.recv())["id"] for _ in range(10)] == list(range(1, 11))
            with pytest.raises(ConnectionError):
                await p.recv()
            assert not path.exists()

    run(main)


def test_socket_path_checks(tmp_path: Path) -> None:
    with pytest.raises(SarpError, match="limit is 107"):
        check_socket_path(Path("/tmp/" + "x" * 120))
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(SarpError, match="not a socket"):
        check_socket_path(regular)

    async def main() -> None:
        async with serving() as (_, path):
            with pytest.raises(SarpError, match="another server is listening"):
                check_socket_path(path)

    run(main)
