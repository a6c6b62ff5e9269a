"""sarpd/daemon/api_http.py on a real socket: keep-alive, answers in the order of the
requests when an awaited one is followed by pipelined ones, chunked bodies, ``Expect:
100-continue``, the body limit (413, closed), malformed requests (400, closed),
404/405, HTTP/1.0's close, and a failing handler (500, the connection goes on); each
on asyncio's loop and on uvloop's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import uvloop

from sarpd.daemon.api_http import ApiServer, Reply, Request

MAX_BODY = 64


async def _slow(req: Request) -> Reply:
    await asyncio.sleep(0.05)
    return Reply(200, b'{"slow":' + req.body + b"}")


async def _slow_fail(req: Request) -> Reply:
    await asyncio.sleep(0)
    raise RuntimeError("boom later")


def _fail(req: Request) -> Reply:
    raise RuntimeError("boom")


ROUTES = {
    ("POST", "/echo"): lambda req: Reply(200, req.body, b"text/plain"),
    ("GET", "/q"): lambda req: Reply(200, json.dumps([req.query]).encode()),
    ("POST", "/slow"): _slow,
    ("GET", "/fail"): _fail,
    ("GET", "/fail_later"): _slow_fail,
    ("GET", "/accept"): lambda req: Reply(200, req.headers.get(b"accept", b"-")),
}


def served(test: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        srv = ApiServer(ROUTES, MAX_BODY)
        await srv.listen("127.0.0.1", 0)
        port = srv._servers[0].sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(test(port), 10)
        finally:
            await srv.close()
    asyncio.run(main())
    uvloop.run(main())  # sarpd's loop: its transports are not asyncio.Transport's


async def read_answer(r: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await r.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def test_keep_alive_and_pipelined_answers_keep_the_order_of_the_requests() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(post("/slow", b"1") + post("/echo", b"two") + b"GET /q?a=1&b=2 HTTP/1.1\r\n"
                b"Host: x\r\n\r\n" + post("/slow", b"3") + post("/echo", b"four"))
        got = [(await read_answer(r))[2] for _ in range(5)]
        assert got == [b'{"slow":1}', b"two", b'["a=1&b=2"]', b'{"slow":3}', b"four"]
        w.write(post("/echo", b"again"))
        status, headers, body = await read_answer(r)
        assert (status, body, headers["content-type"]) == (200, b"again", "text/plain")
        assert "connection" not in headers
        w.close()
    served(test)


def test_chunked_bodies_expect_continue_and_kept_headers() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        assert (await read_answer(r))[2] == b"abcde"
        w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                b"Expect: 100-continue\r\n\r\n")
        assert await r.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(b"ok")
        assert (await read_answer(r))[2] == b"ok"
        w.write(b"GET /accept HTTP/1.1\r\nHost: x\r\nACCEPT: text/x\r\n\r\n")
        assert (await read_answer(r))[2] == b"text/x"
        w.close()
    served(test)


def test_a_body_over_the_limit_is_413_and_the_connection_closes() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(post("/echo", b"x" * (MAX_BODY + 1)) + post("/echo", b"never"))
        status, headers, body = await read_answer(r)
        assert status == 413 and headers["connection"] == "close"
        assert json.loads(body) == {"error": f"body: over {MAX_BODY} bytes"}
        assert await r.read() == b""  # closed: the next request is not answered
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(post("/echo", b"x" * MAX_BODY))  # at the limit: taken
        assert (await read_answer(r))[2] == b"x" * MAX_BODY
        w.close()
    served(test)


def test_malformed_requests_are_400_and_closed() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = await read_answer(r)
        assert status == 400 and headers["connection"] == "close"
        assert json.loads(body)["error"].startswith("malformed HTTP request")
        assert await r.read() == b""
    served(test)


def test_unknown_paths_404_other_methods_405_and_http_1_0_closes() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = await read_answer(r)
        assert (status, json.loads(body)) == (404, {"error": "/nope: not found"})
        status, _, body = await read_answer(r)
        assert (status, json.loads(body)) == (405, {"error": "GET is not allowed on /echo"})
        w.write(b"POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
        status, headers, body = await read_answer(r)
        assert (status, body, headers["connection"]) == (200, b"hi", "close")
        assert await r.read() == b""
    served(test)


def test_a_failing_handler_is_500_and_the_connection_goes_on() -> None:
    async def test(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for path in ("/fail", "/fail_later"):
            w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() + post("/echo", b"ok"))
            status, _, body = await read_answer(r)
            assert status == 500 and "internal error" in json.loads(body)["error"]
            assert (await read_answer(r))[2] == b"ok"
        w.close()
    served(test)
