"""The client without sarpd: its encoding checked by the server's Decoder, and its
connection handling against a fake in-process server on a real Unix socket."""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import uvloop

from sarpd.client import (
    Client,
    ConnectFailed,
    ConnectionLost,
    SarpConnectionError,
    SyncClient,
    decode_match,
    ids_field,
    meta_field,
    one_id_field,
    seq_fields,
    tokens_bin,
)
from sarpd.errors import BadRequest, FrameError, SarpError, UnknownOp, UnknownParent
from sarpd.model import Insert, Match, MatchResult, Remove, Request, ids_from_bytes
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    encode_error,
    encode_ok,
    encode_request,
    encode_result,
)

ID_A = bytes(range(16))
ID_B = bytes(range(100, 116))

# --------------------------------------------------------------- encoding vs Decoder


def decoded(op: str, fields: dict[str, Any]) -> Request | BadMessage:
    (req,) = Decoder().feed(encode_request(1, op, fields))
    return req


def test_tokens_are_sent_as_uint32_bin_in_every_input_form() -> None:
    values = [0, 5, 2**32 - 1, 17] * 8
    forms: list[Any] = [
        values,
        tuple(values),
        np.array(values, dtype=np.uint32),
        np.array(values, dtype=np.int64),
        np.array(values, dtype=np.uint64),
        np.array(values, dtype="<u4").tobytes(),
    ]
    for form in forms:
        raw = tokens_bin(form)
        assert raw == np.array(values, dtype="<u4").tobytes()
        req = decoded("match", seq_fields(form, None, "n"))
        assert isinstance(req, Match) and req.seq.tokens is not None
        assert req.seq.tokens.tolist() == values and req.seq.ns == "n"
    assert tokens_bin([]) == b""


@pytest.mark.parametrize(
    ("tokens", "text"),
    [([1, -1], "tokens[1]: -1"), ([2**32], "tokens[0]"), ([1.5], "tokens:"), ([[1]], "tokens:")],
)
def test_bad_tokens_fail_in_the_client(tokens: Any, text: str) -> None:
    with pytest.raises(BadRequest, match=text.replace("[", r"\[").replace("]", r"\]")):
        tokens_bin(tokens)


def test_ids_in_every_input_form() -> None:
    expect = ids_from_bytes(ID_A + ID_B)
    forms: list[Any] = [ID_A + ID_B, bytearray(ID_A + ID_B), expect, [ID_A, ID_B]]
    for form in forms:
        req = decoded("match", seq_fields(None, form, ""))
        assert isinstance(req, Match) and req.seq.hashes is not None
        assert (req.seq.hashes == expect).all()
    engine = np.array([3, 2**64 - 1], dtype=np.uint64)
    assert ids_field(engine, "hashes") == [3, 2**64 - 1]
    req = decoded("remove", {"ns": "e", "ids": ids_field(engine, "ids")})
    assert isinstance(req, Remove) and req.ids is not None
    assert req.ids.tolist() == [[3, 0], [2**64 - 1, 0]]
    with pytest.raises(BadRequest, match="hashes"):
        ids_field(np.zeros((2, 3), dtype=np.uint64), "hashes")


def test_insert_fields_meta_and_parent() -> None:
    tokens = list(range(48))
    for meta in (7, [1, 2, 3], np.array([1, 2, 3], dtype=np.uint64), np.arange(1, 4)):
        fields = {**seq_fields(tokens, None, ""), "meta": meta_field(meta)}
        req = decoded("insert", fields)
        assert isinstance(req, Insert)
        got = req.meta if isinstance(req.meta, int) else req.meta.tolist()
        assert got in (7, [1, 2, 3])
    for parent in (ID_A, ids_from_bytes(ID_A), ids_from_bytes(ID_A)[0], 99):
        fields = {"hashes": [5], "meta": 0, "parent": one_id_field(parent, "parent")}
        req = decoded("insert", fields)
        assert isinstance(req, Insert) and req.parent is not None
        want = [[99, 0]] if isinstance(parent, int) else ids_from_bytes(ID_A).tolist()
        assert req.parent.tolist() == want
    with pytest.raises(BadRequest, match="parent"):
        one_id_field(ids_from_bytes(ID_A + ID_B), "parent")


def test_decode_match() -> None:
    meta = np.array([1, 2**64 - 1], dtype=np.uint64)
    raw = encode_result(3, MatchResult(blocks=2, meta=meta, ids=ids_from_bytes(ID_A + ID_B)))
    got = decode_match(msgpack.unpackb(raw, raw=False))
    assert got["meta"] == [1, 2**64 - 1] and got["ids"] == [ID_A, ID_B]
    assert got["blocks"] == 2 and got["tokens"] == 32


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


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_factory(request: pytest.FixtureRequest) -> LoopFactory:
    factory: LoopFactory = (
        uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop
    )
    return factory


def run(coro: Awaitable[None], loop_factory: LoopFactory = asyncio.new_event_loop) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, 20)

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(bounded())


def test_100_pipelined_requests_answered_out_of_order(loop_factory: LoopFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reqs = await read_requests(reader, 100, Decoder())
        random.Random(1).shuffle(reqs)
        for req in reqs:
            writer.write(answer(req))
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            calls = [client.match(tokens=list(range(16 * k)), ns="p") for k in range(100)]
            results = await asyncio.gather(*calls)
            for k, res in enumerate(results):
                assert res == {"blocks": k, "tokens": 16 * k, "meta": list(range(k))}
            await client.close()

    run(main(), loop_factory)


def test_error_responses_raise_their_class() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = Decoder()
        while data := await reader.read(65536):
            for req in dec.feed(data):
                if isinstance(req, Insert):
                    writer.write(encode_error(req.id, UnknownParent("parent: not indexed")))
                elif isinstance(req, BadMessage):
                    writer.write(encode_error(req.id, req.error))
                else:
                    err = {"code": "future_code", "message": "from a newer server"}
                    writer.write(msgpack.packb({"id": req.id, "ok": False, "error": err}))
        writer.close()

    async def main() -> None:
        async with fake_server(handler) as path, await Client.connect(path) as client:
            with pytest.raises(UnknownParent, match="parent: not indexed"):
                await client.insert(hashes=[1], parent=5)
            with pytest.raises(UnknownOp, match="op: unknown op") as info:
                await client.request("frobnicate")
            assert info.value.code == "unknown_op"
            with pytest.raises(SarpError, match="newer server") as odd:
                await client.ping()
            assert odd.value.code == "future_code"
            with pytest.raises(BadRequest, match="tokens, hashes: missing"):
                await client.match()  # the connection survives every error

    run(main())


def test_connection_loss_fails_every_pending_request(loop_factory: LoopFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_requests(reader, 10, Decoder())
        writer.close()  # without answering

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            results = await asyncio.gather(
                *(client.ping() for _ in range(10)), return_exceptions=True
            )
            assert all(isinstance(r, ConnectionLost) for r in results), results
            assert str(path) in str(results[0])
            assert isinstance(results[0], ConnectionError)
            with pytest.raises(ConnectionLost, match="lost"):
                await client.ping()  # later requests fail at once
            await client.close()

    run(main(), loop_factory)


def test_stream_error_from_the_server_is_in_the_connection_lost_message(
    loop_factory: LoopFactory,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_requests(reader, 3, Decoder())
        writer.write(encode_error(0, FrameError("frame: 99 bytes exceeds max_frame_size (9)")))
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            results = await asyncio.gather(
                *(client.ping() for _ in range(3)), return_exceptions=True
            )
            for r in results:
                assert isinstance(r, ConnectionLost), r
                assert "too_large" in str(r) and "max_frame_size" in str(r)
                assert isinstance(r.__cause__, SarpError)
            await client.close()

    run(main(), loop_factory)


def test_garbage_from_the_server_fails_pending_requests() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_requests(reader, 1, Decoder())
        writer.write(msgpack.packb([1, 2, 3]))
        await writer.drain()
        await reader.read()
        writer.close()

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            with pytest.raises(ConnectionLost, match="bad response"):
                await client.ping()
            await client.close()

    run(main())


def test_close_fails_pending_and_cancelled_requests_do_not_disturb_others(
    loop_factory: LoopFactory,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec, held = Decoder(), []
        while data := await reader.read(65536):
            for req in dec.feed(data):
                if isinstance(req, Match) and req.seq.tokens is not None:
                    if len(req.seq.tokens) == 16:
                        held.append(req)  # answered when the next request comes
                    continue  # 32 tokens: never answered
                writer.write(b"".join(answer(r) for r in held) + answer(req))
                held.clear()
        writer.close()

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            slow = asyncio.ensure_future(client.match(tokens=[1] * 16))
            await asyncio.sleep(0.01)
            slow.cancel()
            # the late answer to the cancelled match arrives first and is dropped
            assert await client.ping() == {"op": "ping"}
            assert await client.ping() == {"op": "ping"}
            pending = asyncio.ensure_future(client.match(tokens=[1] * 32))
            await asyncio.sleep(0.01)
            await client.close()
            with pytest.raises(ConnectionLost, match="closed by the client"):
                await pending
            await client.close()  # idempotent
            with pytest.raises(ConnectionLost):
                await client.ping()

    run(main(), loop_factory)


def test_connect_errors_name_the_path() -> None:
    async def main() -> None:
        with short_tmpdir() as tmp:
            missing = tmp / "nope.sock"
            with pytest.raises(ConnectFailed, match=str(missing)) as info:
                await Client.connect(missing)
            assert isinstance(info.value, ConnectionError)
            stale = tmp / "stale.sock"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(stale))  # bound, never listening: refused
            try:
                with pytest.raises(ConnectFailed, match="nothing listens") as info2:
                    await Client.connect(stale)
                assert str(stale) in str(info2.value)
            finally:
                sock.close()

    run(main())
    with short_tmpdir() as tmp, pytest.raises(SarpConnectionError, match="does not exist"):
        SyncClient(tmp / "x.sock")


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
