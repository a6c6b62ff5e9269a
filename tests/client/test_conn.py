"""The client's connection (sarpd.client.conn) against a fake in-process server on a
real Unix socket: pipelining, errors, connection loss, timeouts, a window of requests
in one write (`submit`, `flush`, `outcomes`)."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import msgpack
import pytest

from sarpd.client import (
    Client,
    ConnectFailed,
    ConnectionLost,
    RequestTimeout,
    SarpConnectionError,
    SyncClient,
)
from sarpd.errors import BadRequest, FrameError, SarpError, UnknownOp, UnknownParent
from sarpd.model import Insert, Match
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    encode_error,
    encode_ok,
)
from tests.client.fake_sarpd import (
    LoopFactory,
    answer,
    fake_server,
    read_requests,
    run,
    short_tmpdir,
)
from tests.daemon_helpers import SarpdProc


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


# ------------------------------------------------------------------ request timeout


def test_a_request_unanswered_in_time_raises_request_timeout(loop_factory: LoopFactory) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads every request, answers none, until the client closes

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path, request_timeout=0.3)
            with pytest.raises(RequestTimeout) as info:
                await client.ping()
            message = str(info.value)
            assert str(path) in message and "ping" in message and "0.3 s" in message
            assert isinstance(info.value, SarpConnectionError)
            with pytest.raises(RequestTimeout, match="did not answer ping"):
                await client.check()  # no limit of its own: a ping first, within 0.3 s
            with pytest.raises(RequestTimeout, match=r"did not answer snapshot within 0\.2 s"):
                await client.snapshot(timeout=0.2)
            await client.close()

    run(main(), loop_factory)


def test_a_late_answer_is_dropped_not_given_to_the_next_request(loop_factory: LoopFactory,
                                                                ) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec, held = Decoder(), []
        while data := await reader.read(65536):
            for req in dec.feed(data):
                if not held:
                    held.append(req)  # the first request: answered only after the next one
                    continue
                writer.write(encode_ok(held[0].id, {"op": "late"}) if len(held) == 1 else b"")
                held.append(req)
                writer.write(answer(req))

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path, request_timeout=0.3)
            with pytest.raises(RequestTimeout):
                await client.ping()
            assert await client.stats() == {"op": "stats"}  # the late ping answer came first
            assert await client.hello() == {"op": "hello"}
            await client.close()

    run(main(), loop_factory)



# ------------------------------------------- a window of requests in one write (real sarpd)


def test_a_window_in_one_write(sarpd_proc: SarpdProc) -> None:
    """`submit` buffers, `flush` writes the window, `outcomes` gives each request's
    result fields or error, in order, as `request` would."""

    async def main() -> list[object]:
        client = await Client.connect(sarpd_proc.socket)
        try:
            await client.hello(protocol=2)
            reqs = [("insert", {"ns": "", "hashes": (1, 2, 3), "meta": 7}),
                    ("insert", {"ns": "", "hashes": (4,), "parent": 3, "meta": 7}),
                    ("insert", {"ns": "", "hashes": (9,), "parent": 99, "meta": 7}),
                    ("remove", {"ns": "", "ids": (4,), "meta": 7})]  # fmt: skip
            futs = [client.submit(op, fields) for op, fields in reqs]
            assert not any(f.done() for f in futs)  # nothing sent before flush
            await client.flush()
            out = await client.outcomes(futs)
            hit = await client.match(hashes=[1, 2, 3, 4])
            return [*out, hit["blocks"]]
        finally:
            await client.close()

    first, second, orphan, removal, blocks = asyncio.run(main())
    assert first == {"blocks": 3, "new_blocks": 3, "matched_blocks": 0}
    assert isinstance(second, dict) and second["new_blocks"] == 1
    assert isinstance(orphan, UnknownParent)
    assert removal == {"removed": 1}
    assert blocks == 3  # applied in order: the removal after the insert of block 4


def test_a_lost_connection_fails_the_window(sarpd_proc: SarpdProc) -> None:
    async def main() -> list[object]:
        client = await Client.connect(sarpd_proc.socket)
        await client.close()
        futs = [client.submit("clear", {"ns": "", "mask": 0, "value": 0}) for _ in range(3)]
        await client.flush()
        return await client.outcomes(futs)

    assert all(isinstance(r, ConnectionLost) for r in asyncio.run(main()))


def test_an_unanswered_window_is_dropped_after_the_request_timeout() -> None:
    """A sarpd that takes the connection and never answers: the window fails with
    ConnectionLost naming the timeout (a caller retries it), never hangs."""

    async def main(path: Path) -> list[object]:
        client = await Client.connect(path, request_timeout=0.2)
        try:
            futs = [client.submit("clear", {"ns": "", "mask": 0, "value": 0})
                    for _ in range(3)]
            await client.flush()
            return list(await asyncio.wait_for(client.outcomes(futs), 10))
        finally:
            await client.close()

    with short_tmpdir() as tmp:
        path = tmp / "mute.sock"
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mute.bind(str(path))
        mute.listen()
        try:
            out = asyncio.run(main(path))
        finally:
            mute.close()
    assert len(out) == 3 and all(isinstance(r, ConnectionLost) for r in out), out
    assert "3 requests unanswered after 0.2 s" in str(out[0])


def test_request_and_a_window_share_one_send_path() -> None:
    """A request made while a window is buffered goes out after it, in one write, and
    every answer reaches its own caller."""
    writes: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = Decoder()
        while data := await reader.read(65536):
            reqs = dec.feed(data)
            writes.append(len(reqs))
            for req in reqs:
                writer.write(answer(req))

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            futs = [client.submit(op, {}) for op in ("ping", "stats")]
            assert await client.request("hello") == {"op": "hello"}  # flushes all three
            assert await client.outcomes(futs) == [{"op": "ping"}, {"op": "stats"}]
            await client.close()

    run(main())
    assert writes == [3]
