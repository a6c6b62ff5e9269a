"""Bad input against a real sarpd: every case of PROTOCOL.md gets its documented error
code and a message naming the field, and never takes the daemon down.

One daemon for the module, started with small limits (--config): sequences of at
most 1,024 tokens and frames of at most 64 KiB.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from sarpd.client import SyncClient
from sarpd.errors import BadRequest
from tests.daemon_helpers import REPO, RawConn, SarpdProc, launcher
from tests.protocol.helpers import assert_clean

MAX_TOKENS = 1024
MAX_FRAME = 64 * 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SarpdProc]:
    config = {
        "server": {"max_frame_size": MAX_FRAME},
        "index": {"max_sequence_tokens": MAX_TOKENS},
    }
    with launcher(tmp_path_factory.mktemp("bad")) as lau:
        yield lau(config=config)


def toks(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def assert_alive(daemon: SarpdProc) -> None:
    """A valid insert + match on a fresh connection still works."""
    assert daemon.alive, daemon.log()
    with RawConn(daemon.socket) as conn:
        seq = toks(32, start=5000)
        ins = conn.call("insert", 1, tokens=seq, meta=7, ns="alive")
        assert ins["ok"], ins
        got = conn.call("match", 2, tokens=seq, ns="alive")
        assert got["ok"] and got["blocks"] == 2, got


# (name, request fields without id, expected code, text the message must contain)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("op missing", {"tokens": toks(16)}, "bad_request", "op"),
    ("op wrong type", {"op": 3}, "bad_request", "op"),
    ("unknown op", {"op": "frobnicate"}, "unknown_op", "frobnicate"),
    ("tokens missing", {"op": "match"}, "bad_request", "tokens"),
    ("tokens wrong type", {"op": "match", "tokens": "abc"}, "bad_request", "tokens"),
    ("token wrong type", {"op": "match", "tokens": [1, "x"]}, "bad_request", "tokens[1]"),
    ("token negative", {"op": "match", "tokens": [5, -1]}, "bad_request", "tokens[1]"),
    ("token over uint32", {"op": "match", "tokens": [2**32]}, "bad_request", "tokens[0]"),
    ("tokens bin odd", {"op": "match", "tokens": b"abcde"}, "bad_request", "tokens"),
    (
        "tokens and hashes",
        {"op": "match", "tokens": toks(16), "hashes": [1]},
        "bad_request",
        "hashes",
    ),
    ("hashes bin length", {"op": "match", "hashes": b"x" * 15}, "bad_request", "hashes"),
    ("hash item length", {"op": "match", "hashes": [b"x" * 8]}, "bad_request", "hashes[0]"),
    ("hash over uint64", {"op": "match", "hashes": [2**64 - 1, -3]}, "bad_request", "hashes"),
    ("ns wrong type", {"op": "match", "tokens": toks(16), "ns": 5}, "bad_request", "ns"),
    (
        "with_ids wrong type",
        {"op": "match", "tokens": [], "with_ids": 1},
        "bad_request",
        "with_ids",
    ),
    ("meta missing", {"op": "insert", "tokens": toks(32)}, "bad_request", "meta"),
    (
        "meta wrong length",
        {"op": "insert", "tokens": toks(32), "meta": [1, 2, 3]},
        "bad_request",
        "meta",
    ),
    (
        "meta bin length",
        {"op": "insert", "tokens": toks(32), "meta": b"\0" * 8},
        "bad_request",
        "meta",
    ),
    ("meta negative", {"op": "insert", "tokens": toks(16), "meta": -1}, "bad_request", "meta"),
    ("meta wrong type", {"op": "insert", "tokens": toks(16), "meta": "x"}, "bad_request", "meta"),
    (
        "parent wrong length",
        {"op": "insert", "tokens": toks(16), "meta": 1, "parent": b"p" * 8},
        "bad_request",
        "parent",
    ),
    (
        "unknown parent",
        {"op": "insert", "tokens": toks(16), "meta": 1, "parent": 12345, "ns": "nobody"},
        "unknown_parent",
        "parent",
    ),
    ("remove without sequence", {"op": "remove"}, "bad_request", "tokens"),
    ("remove ids wrong length", {"op": "remove", "ids": [b"i" * 15]}, "bad_request", "ids[0]"),
    (
        "remove from negative",
        {"op": "remove", "tokens": toks(16), "from": -2},
        "bad_request",
        "from",
    ),
    ("clear without ns", {"op": "clear"}, "bad_request", "ns"),
    ("clear mask wrong type", {"op": "clear", "ns": "", "mask": "x"}, "bad_request", "mask"),
    (
        "sequence over the limit",
        {"op": "match", "tokens": toks(MAX_TOKENS + 16)},
        "too_large",
        "max_sequence_tokens",
    ),
    (
        "insert over the limit",
        {"op": "insert", "tokens": toks(MAX_TOKENS + 16), "meta": 0},
        "too_large",
        "max_sequence_tokens",
    ),
]


@pytest.mark.parametrize(("name", "fields", "code", "names"), CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_its_code_and_names_the_field(
    daemon: SarpdProc, name: str, fields: dict[str, Any], code: str, names: str
) -> None:
    with RawConn(daemon.socket) as conn:
        conn.send({"id": 41, **fields})
        resp = conn.recv()
        assert resp["id"] == 41, resp
        assert resp["ok"] is False, resp
        assert resp["error"]["code"] == code, resp
        assert names in resp["error"]["message"], resp
        if code != "unknown_parent":
            assert_clean(resp["error"]["message"], names)
        # per-request errors keep the connection usable
        assert conn.call("ping", 42) == {"id": 42, "ok": True}
    assert_alive(daemon)


def test_request_without_id_is_answered_with_id_0(daemon: SarpdProc) -> None:
    with RawConn(daemon.socket) as conn:
        conn.send({"op": "ping"})
        resp = conn.recv()
        assert resp["id"] == 0 and resp["error"]["code"] == "bad_request"
        assert "id" in resp["error"]["message"]
        conn.send([1, 2, 3])  # not a map
        resp = conn.recv()
        assert resp["id"] == 0 and resp["error"]["code"] == "bad_request"
        assert conn.call("ping", 5)["ok"]
    assert_alive(daemon)


def test_not_msgpack_gets_one_error_then_close(daemon: SarpdProc) -> None:
    with RawConn(daemon.socket, timeout=10) as conn:
        conn.send_raw(b"\xc1" * 8)  # 0xc1 is never valid msgpack
        resp = conn.recv()
        assert resp["id"] == 0 and resp["ok"] is False
        assert resp["error"]["code"] == "bad_request"
        assert "msgpack" in resp["error"]["message"]
        assert conn.closed_by_server()
    assert_alive(daemon)


def test_frame_over_the_limit_gets_too_large_then_close(daemon: SarpdProc) -> None:
    with RawConn(daemon.socket, timeout=10) as conn:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send({"id": 3, "op": "match", "tokens": b"\0" * (MAX_FRAME * 2)})
        resp = conn.recv()
        assert resp["id"] == 0 and resp["ok"] is False
        assert resp["error"]["code"] == "too_large"
        assert "max_frame_size" in resp["error"]["message"]
        assert conn.closed_by_server()
    assert_alive(daemon)


def test_requests_before_a_bad_frame_are_answered_before_the_close(daemon: SarpdProc) -> None:
    with RawConn(daemon.socket, timeout=10) as conn:
        ins = {"id": 9, "op": "insert", "tokens": toks(32, 9000), "meta": 1, "ns": "pre"}
        conn.send_raw(msgpack.packb(ins) + b"\xc1")  # one write: a request, then garbage
        first, second = conn.recv(), conn.recv()
        assert first == {"id": 9, "ok": True, "blocks": 2, "new_blocks": 2, "matched_blocks": 0}
        assert second["id"] == 0 and second["error"]["code"] == "bad_request"
        assert conn.closed_by_server()
    with RawConn(daemon.socket) as conn:
        assert conn.call("match", 1, tokens=toks(32, 9000), ns="pre")["blocks"] == 2
    assert_alive(daemon)


def test_client_disconnecting_mid_frame(daemon: SarpdProc) -> None:
    frame = msgpack.packb({"id": 1, "op": "insert", "tokens": toks(512), "meta": 1})
    for cut in (1, len(frame) // 2, len(frame) - 1):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(daemon.socket))
        sock.sendall(frame[:cut])
        sock.close()
    assert_alive(daemon)


def test_client_disconnecting_mid_request(daemon: SarpdProc) -> None:
    """Many pipelined writes and matches, then the client vanishes without reading."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(daemon.socket))
    frames = b"".join(
        msgpack.packb(
            {"id": i, "op": "insert", "tokens": toks(64, 100 * i), "meta": i, "ns": "mid"}
        )
        + msgpack.packb({"id": 10_000 + i, "op": "match", "tokens": toks(64, 100 * i)})
        for i in range(300)
    )
    sock.sendall(frames)
    sock.close()
    time.sleep(0.2)
    assert_alive(daemon)
    # the writes that were received took effect
    with RawConn(daemon.socket) as conn:
        got = conn.call("match", 1, tokens=toks(64, 0), ns="mid")
        assert got["ok"] and got["blocks"] in (0, 4)


def test_client_that_never_reads_does_not_block_others(daemon: SarpdProc) -> None:
    """A client floods requests and never reads its answers: the server stops reading
    from it (memory stays bounded) while other clients are served."""
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(str(daemon.socket))
    hog.setblocking(False)
    chunk = msgpack.packb({"id": 1, "op": "ping"}) * 1024
    deadline = time.monotonic() + 30
    stalled = False
    while time.monotonic() < deadline and not stalled:
        try:
            hog.send(chunk)
        except BlockingIOError:
            # stalled: the socket stays unwritable, i.e. the server is not reading
            _, writable, _ = select.select([], [hog], [], 0.5)
            stalled = not writable
    assert stalled, "the server kept reading from a client that never reads"
    assert_alive(daemon)
    hog.close()
    assert_alive(daemon)


def sarpctl(daemon: SarpdProc, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sarpd.ctl.main", "--socket",
                           str(daemon.socket), *args], input=stdin, capture_output=True,
                          text=True, timeout=60, cwd=REPO, env=env)


@pytest.mark.parametrize(("args", "stdin", "field", "says"), [
    (["match"], '{"a":1}', "tokens", "tokens: {'a': 1} is not a JSON list"),
    (["insert"], "[1, 2, 99999999999999999999999]", "tokens",
     "tokens[2]: 99999999999999999999999 is not a uint32"),
    (["match"], '["a","b"]', "tokens", "tokens[0]: 'a' is not a uint32"),
    (["insert"], "1 2 x", "tokens", "tokens[2]: 'x' is not a uint32"),
    (["match"], "[1,", "tokens", "tokens: not valid JSON"),
    (["insert", "--meta", str(2**64)], "1 2", "--meta", "18446744073709551616"),
    (["insert", "--meta", "-1"], "1 2", "--meta", "-1"),
    (["match", "--hashes", "[1, 18446744073709551616]"], "", "hashes",
     "hashes[1]: 18446744073709551616 is not a uint64"),
    (["insert", "--ns", "x" * 2000], "1 2", "ns", "ns: 2000 bytes exceeds max_ns_bytes"),
])
def test_sarpctl_bad_input_is_named_cleanly(daemon: SarpdProc, args: list[str], stdin: str,
                                            field: str, says: str) -> None:
    out = sarpctl(daemon, *args, stdin=stdin)
    assert out.returncode == 2, out
    assert says in out.stderr, out.stderr
    assert_clean(out.stderr, field)
    assert_alive(daemon)


def test_the_python_client_names_bad_values_before_sending(daemon: SarpdProc) -> None:
    with SyncClient(daemon.socket) as c:
        for call, says in [
            (lambda: c.insert(tokens=toks(32), meta=2**64),
             "meta: 18446744073709551616 is not a uint64"),
            (lambda: c.match(tokens=[1, 2, 99999999999999999999999]),
             "tokens[2]: 99999999999999999999999 is not a uint32"),
            (lambda: c.match(tokens=["a", "b"]), "tokens[0]: 'a' is not a uint32"),
            (lambda: c.insert(tokens=toks(32), meta=[1, -1]), "meta[1]: -1 is not a uint64"),
            (lambda: c.match(hashes=[2**64]), "hashes[0]: 18446744073709551616 is not"),
            (lambda: c.insert(tokens=toks(16), meta=1, parent=2**64), "parent: 18446744"),
            (lambda: c.remove(tokens=toks(16), start=-1), "from: -1 is not a uint64"),
            (lambda: c.clear("n", mask=1.5), "mask: 1.5 is not a uint64"),  # type: ignore[arg-type]
        ]:
            with pytest.raises(BadRequest) as info:
                call()
            assert says in info.value.message
            assert_clean(info.value.message, says.split(":")[0].split("[")[0])
        # and what only the server can judge comes back named too
        with pytest.raises(BadRequest) as info:
            c.insert(tokens=toks(32), meta=[1, 2, 3])
        assert_clean(info.value.message, "meta")
        assert c.ping() == {}
    assert_alive(daemon)
