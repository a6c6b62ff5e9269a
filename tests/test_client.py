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
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.client import (
    Client,
    ConnectFailed,
    ConnectionLost,
    RequestTimeout,
    SarpConnectionError,
    SyncClient,
)
from sarpd.errors import BadRequest, FrameError, SarpError, UnknownOp, UnknownParent
from sarpd.model import Insert, Match, MatchResult, Remove, Request, ids_from_bytes
from sarpd.protocol.fields import (
    decode_match,
    ids_field,
    meta_field,
    one_id_field,
    seq_fields,
    tokens_bin,
    uint_arg,
)
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    encode_error,
    encode_ok,
    encode_request,
    encode_result,
)
from tests.protocol.helpers import SAFE_TEXT, assert_clean

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


@pytest.mark.parametrize(("tokens", "text"), [
    ([1, -1], "tokens[1]: -1 is not a uint32"),
    ([2**32], "tokens[0]: 4294967296 is not a uint32"),
    ([1.5], "tokens[0]: 1.5 is not a uint32"),
    ([[1]], "tokens[0]: [1] is not a uint32"),
    ([1, 2, 99999999999999999999999], "tokens[2]: 99999999999999999999999 is not a uint32"),
    (["a", "b"], "tokens[0]: 'a' is not a uint32"),
    (np.array(["a", "b"]), "tokens[0]: 'a' is not a uint32"),
    (np.array([1, 99999999999999999999999], dtype=object), "tokens[1]: 9999999"),
    (np.array([0.5]), "tokens[0]: 0.5 is not a uint32"),
    (np.array([3, -2]), "tokens[1]: -2 is not a uint32"),
    (np.zeros((2, 2), dtype=np.uint32), "tokens: an array of 2 dimensions is not"),
    ("abc", "tokens: 'abc' is not an array of uint32"),
    (7, "tokens: 7 is not an array of uint32"),
    (b"abc", "tokens: bin of 3 bytes is not a multiple of 4"),
])
def test_bad_tokens_fail_in_the_client(tokens: Any, text: str) -> None:
    with pytest.raises(BadRequest) as info:
        tokens_bin(tokens)
    assert text in info.value.message


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


def test_bad_values_fail_before_anything_is_sent() -> None:
    got: list[Any] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = Decoder()
        while data := await reader.read(65536):
            for req in dec.feed(data):
                got.append(req)
                writer.write(answer(req))

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            bad: list[tuple[Awaitable[Any], str]] = [
                (client.insert(tokens=list(range(32)), meta=2**64),
                 "meta: 18446744073709551616 is not a uint64"),
                (client.match(tokens=[1, 2, 99999999999999999999999]),
                 "tokens[2]: 99999999999999999999999 is not a uint32"),
                (client.remove(tokens=[1], meta=-1), "meta: -1 is not a uint64"),
                (client.clear("n", mask=2**64), "mask: 18446744073709551616 is not a uint64"),
                (client.report("bridge", {"events": 2**70}), "counters.events: 1180591620"),
                (client.request("match", tokens=[1], after_seq={"s0": 2**64}),
                 "after_seq.s0: 18446744073709551616 is out of range"),
            ]
            for call, text in bad:
                with pytest.raises(BadRequest) as info:
                    await call
                assert text in info.value.message
                assert_clean(info.value.message, text.split(":")[0].split("[")[0])
            assert await client.ping() == {"op": "ping"}
            await client.close()
        assert [type(r).__name__ for r in got] == ["Ping"]

    run(main())


# ------------------------------------------- property: every bad value is named cleanly

BIG = st.integers(min_value=2**64, max_value=2**300)
NEG = st.integers(min_value=-(2**300), max_value=-1)
NOT_INT = st.one_of(
    st.floats(), st.text(SAFE_TEXT, max_size=30), st.booleans(), st.none(),
    st.binary(max_size=40), st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(0, 9), max_size=2),
    st.tuples(st.floats(), st.none()),
)


def bad_uint(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(min_value=limit, max_value=2**300), NEG, NOT_INT)


def as_form(items: list[Any], form: str) -> Any:
    if form == "tuple":
        return tuple(items)
    if form == "array":
        arr = np.empty(len(items), dtype=object)
        for i, v in enumerate(items):
            arr[i] = v
        return arr
    return items


def expect_bad(fn: Callable[[], object], field: str) -> str:
    with pytest.raises(BadRequest) as info:
        fn()
    assert_clean(info.value.message, field)
    return info.value.message


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=6), bad_uint(2**32),
       st.sampled_from(["list", "tuple", "array"]))
def test_a_bad_token_is_named_with_its_index(good: list[int], bad: Any, form: str) -> None:
    message = expect_bad(lambda: tokens_bin(as_form([*good, bad], form)), "tokens")
    assert message.startswith(f"tokens[{len(good)}]: ")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.integers(), st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                 st.none(), st.binary(max_size=40).filter(lambda b: len(b) % 4 != 0),
                 st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(), max_size=2),
                 st.frozensets(st.integers(0, 9), max_size=2)))
def test_bad_tokens_values_are_named(value: Any) -> None:
    expect_bad(lambda: tokens_bin(value), "tokens")


BAD_ID = st.one_of(BIG, NEG, st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                   st.none(), st.binary(max_size=40).filter(lambda b: len(b) != 16),
                   st.lists(st.integers(0, 9), max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**64 - 1), st.binary(min_size=16, max_size=16)),
                max_size=5), BAD_ID, st.sampled_from(["hashes", "ids"]),
       st.sampled_from(["list", "tuple", "array"]))
def test_a_bad_id_is_named_with_its_index(good: list[Any], bad: Any, name: str,
                                          form: str) -> None:
    message = expect_bad(lambda: ids_field(as_form([*good, bad], form), name), name)
    assert message.startswith(f"{name}[{len(good)}]: ")


@settings(max_examples=150, deadline=None)
@given(BAD_ID.filter(lambda v: not isinstance(v, list)))
def test_a_bad_parent_is_named(value: Any) -> None:
    expect_bad(lambda: one_id_field(value, "parent"), "parent")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=5), bad_uint(2**64),
       st.sampled_from(["list", "tuple", "array"]),
       st.one_of(BIG, NEG, st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                 st.none(), st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(),
                                            max_size=2)))
def test_bad_meta_is_named(good: list[int], bad: Any, form: str, scalar: Any) -> None:
    message = expect_bad(lambda: meta_field(as_form([*good, bad], form)), "meta")
    assert message.startswith(f"meta[{len(good)}]: ")
    expect_bad(lambda: meta_field(scalar), "meta")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["from", "holders", "mask", "value", "protocol", "meta"]),
       bad_uint(2**64))
def test_bad_uint_arguments_are_named(name: str, value: Any) -> None:
    expect_bad(lambda: uint_arg(name, value), name)


@settings(max_examples=100, deadline=None)
@given(st.text(SAFE_TEXT, min_size=1, max_size=8),
       st.one_of(BIG, st.integers(max_value=-(2**63) - 1)), st.integers(0, 3))
def test_an_int_no_field_can_carry_is_named_by_its_path(field: str, big: int, depth: int) -> None:
    nested: Any = big
    suffix = ""
    for i in range(depth):  # the outermost container's accessor comes first in the path
        if i % 2:
            nested, suffix = [0, nested], f"[1]{suffix}"
        else:
            nested, suffix = {"k": nested}, f".k{suffix}"
    message = expect_bad(lambda: encode_request(1, "match", {field: nested}), field)
    assert message.startswith(f"{field}{suffix}: ") and "is out of range" in message
