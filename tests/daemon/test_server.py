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
from sarpd.errors import ConfigError
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
    with pytest.raises(ConfigError, match="limit is 107"):
        check_socket_path(Path("/tmp/" + "x" * 120))
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(ConfigError, match="not a socket"):
        check_socket_path(regular)

    async def main() -> None:
        async with serving() as (_, path):
            with pytest.raises(ConfigError, match="another server is listening"):
                check_socket_path(path)

    run(main)


def test_stats_and_metrics_read_the_server_the_service_and_the_index() -> None:
    """Nothing is patched in: the service gets the server's part of `stats` when it is
    built, and the metrics read the server's gauges, the service's reports and the
    index's own match counters."""

    async def main() -> None:
        async with serving() as (server, path):
            idx = FakeIndex()
            server.set_ready(Service(idx, server.config, "memory",
                                     extra_stats=server.extra_stats))
            p = await peer(path)
            p.send({"id": 1, "op": "insert", "tokens": [5] * 16, "meta": 0},
                   {"id": 2, "op": "match", "tokens": [5] * 16},
                   {"id": 3, "op": "match", "tokens": [6] * 16},
                   {"id": 4, "op": "report", "source": "bridge", "counters": {"gaps": 2}})
            assert [(await p.recv())["ok"] for _ in range(4)] == [True] * 4
            assert (idx.activity.matched_blocks, idx.activity.queried_blocks) == (1, 2)
            assert server.activity() is idx.activity
            p.send({"id": 5, "op": "stats"})
            stats = await p.recv()
            assert stats["hit_ratio"] == 0.5 and stats["connections"] == 1
            assert stats["queue_depth"] == 0 and stats["reports"]["bridge"]["gaps"] == 2
            names = {f.name: f for f in server.metrics.families()}
            assert names["sarpd_match_hit_blocks"].samples[0].value == 1
            assert names["sarpd_connections"].samples[0].value == 1
            reported = {s.labels["name"]: s.value for s in names["sarpd_reported"].samples}
            assert reported["gaps"] == 2

    run(main)


def test_failing_metrics_cost_no_answer_and_the_batcher_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving() as (server, path):
            server.set_ready(Service(FakeIndex(), server.config, "memory"))

            def broken(*args: object) -> None:
                raise RuntimeError("metrics bug")

            monkeypatch.setattr(server.metrics, "record_batch", broken)
            p = await peer(path)
            p.send({"id": 1, "op": "ping"})
            assert await p.recv() == {"id": 1, "ok": True}
            p.send({"id": 2, "op": "ping"})
            assert await p.recv() == {"id": 2, "ok": True}
            assert "metrics bug" in caplog.text and "batcher: unexpected error" in caplog.text

    run(main)


def test_a_decoder_bug_closes_only_its_connection_with_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        async with serving() as (server, path):
            server.set_ready(Service(FakeIndex(), server.config, "memory"))
            good = await peer(path)
            bad = await peer(path)
            await asyncio.sleep(0.01)
            victim = next(c for c in server.conns if c.peer.startswith("conn#2"))

            def feed(data: bytes) -> list[object]:
                raise IndexError("decoder bug")

            monkeypatch.setattr(victim.decoder, "feed", feed)
            bad.send({"id": 1, "op": "ping"})
            resp = await bad.recv()
            assert resp["id"] == 0 and resp["error"]["code"] == "internal"
            assert "decoder failed" in resp["error"]["message"]
            with pytest.raises(ConnectionError):
                await bad.recv()
            good.send({"id": 2, "op": "ping"})
            assert await good.recv() == {"id": 2, "ok": True}

    run(main)
