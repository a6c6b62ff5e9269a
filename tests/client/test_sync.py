"""`SyncClient` (sarpd.client.sync): blocking calls against a server thread, its
request timeout."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sarpd.client import (
    RequestTimeout,
    SyncClient,
)
from sarpd.errors import BadRequest
from sarpd.protocol.wire import (
    Decoder,
)
from tests.client.fake_sarpd import (
    answer,
    fake_server,
    short_tmpdir,
)

ID_A = bytes(range(16))


def void(_: object) -> None:
    return None


def test_sync_client_against_a_server_thread() -> None:
    ready = threading.Event()
    stop: list[Callable[[], None]] = []
    box: dict[str, Path] = {}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = Decoder()
        while data := await reader.read(65536):
            for req in dec.feed(data):
                writer.write(answer(req))
        writer.close()

    def serve() -> None:
        async def main() -> None:
            async with fake_server(handler) as path:
                box["path"] = path
                done = asyncio.Event()
                loop = asyncio.get_running_loop()
                stop.append(lambda: void(loop.call_soon_threadsafe(done.set)))
                ready.set()
                await done.wait()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with SyncClient(box["path"]) as client:
            assert client.path == str(box["path"])
            assert client.ping() == {"op": "ping"}
            got = client.match(tokens=np.arange(40, dtype=np.uint32))
            assert got == {"blocks": 2, "tokens": 32, "meta": [0, 1]}
            assert client.stats() == {"op": "stats"}
            assert client.check(fix=True) == {"op": "check"}
            assert client.clear("ns", mask=1, value=1) == {"op": "clear"}
            assert client.remove(ids=[ID_A], ns="x") == {"op": "remove"}
            assert client.insert(tokens=[1] * 16, meta=[3]) == {"op": "insert"}
            with pytest.raises(BadRequest, match="meta"):
                client.insert(tokens=[1] * 16, meta=[3, 4])
            assert client.hello() == {"op": "hello"}
        client.close()  # idempotent after the with block
    finally:
        stop[0]()
        thread.join(10)


def test_sync_client_request_timeout_against_a_server_that_never_answers() -> None:
    with short_tmpdir() as tmp:
        path = tmp / "mute.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)
        accepted: list[socket.socket] = []
        thread = threading.Thread(target=lambda: accepted.append(listener.accept()[0]),
                                  daemon=True)
        thread.start()
        try:
            with SyncClient(path, request_timeout=0.3) as client:
                with pytest.raises(RequestTimeout, match=f"{path} did not answer stats"):
                    client.stats()
                with pytest.raises(RequestTimeout, match=r"check within 0\.2 s"):
                    client.check(timeout=0.2)
            with pytest.raises(ValueError, match="request_timeout: 0 is not a number"):
                SyncClient(path, request_timeout=0)
        finally:
            thread.join(5)
            for sock in (*accepted, listener):
                sock.close()


