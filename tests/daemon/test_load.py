"""Load bounds against real sarpd processes: `max_queue` answers `busy`, a client that
never reads is disconnected past `max_write_buffer` while others are served, and a
SIGTERM under load answers every request it received, loses no acknowledged insert
and writes the final snapshot.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Any

import msgpack
import numpy as np

from tests.daemon_helpers import Launcher, RawConn, SarpdProc


def toks(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def test_past_max_queue_requests_are_answered_busy(sarpd_factory: Launcher) -> None:
    # A long batching window keeps requests queued; 40 pipelined pings against a
    # queue of 8: the first 8 are queued, the rest answered busy at once.
    server = {"max_queue": 8, "batch_window_ms": 300.0, "batch_max": 1024}
    proc = sarpd_factory(config={"server": server})
    with RawConn(proc.socket) as conn:
        conn.send_raw(b"".join(msgpack.packb({"id": i, "op": "ping"}) for i in range(1, 41)))
        answers = [conn.recv() for _ in range(40)]
    assert sorted(a["id"] for a in answers) == list(range(1, 41))  # each answered once
    ok = [a for a in answers if a["ok"]]
    busy = [a for a in answers if not a["ok"]]
    assert len(ok) == 8 and len(busy) == 32, answers
    assert all(a["error"]["code"] == "busy" for a in busy)
    assert "max_queue (8)" in busy[0]["error"]["message"]
    with RawConn(proc.socket) as conn:  # nothing stuck: the next request is served
        assert conn.call("ping")["ok"]
        stats = conn.call("stats", 2)
        assert stats["ok"] and stats["errors_busy"] == 32 and stats["queue_depth"] == 0


def test_past_max_queue_bytes_requests_are_answered_busy(sarpd_factory: Launcher) -> None:
    # 1,024 tokens decode to 4,096 bytes: two inserts fit in 10,000 bytes, not three
    server = {"max_queue_bytes": 10_000, "batch_window_ms": 300.0, "batch_max": 1024}
    proc = sarpd_factory(config={"server": server})
    with RawConn(proc.socket) as conn:
        conn.send_raw(b"".join(
            msgpack.packb({"id": i, "op": "insert", "tokens": toks(1024, i * 2000), "meta": i,
                           "ns": "qb"})
            for i in range(1, 11)
        ))
        answers = {a["id"]: a for a in (conn.recv() for _ in range(10))}
        assert [answers[i]["ok"] for i in range(1, 11)] == [True, True] + [False] * 8
        assert "exceeds max_queue_bytes (10000)" in answers[3]["error"]["message"]
        assert answers[3]["error"]["code"] == "busy"
        # a busy insert took no effect; an admitted one did
        assert conn.call("match", 20, tokens=toks(1024, 3 * 2000), ns="qb")["blocks"] == 0
        assert conn.call("match", 21, tokens=toks(1024, 2 * 2000), ns="qb")["blocks"] == 64
        assert conn.call("stats", 22)["queue_bytes"] == 0


def test_unfinished_messages_past_max_buffered_bytes_are_refused(
    sarpd_factory: Launcher,
) -> None:
    proc = sarpd_factory(config={"server": {"max_buffered_bytes": 100_000}})

    def insert(rid: int, start: int) -> bytes:
        tokens = np.arange(start, start + 20_000, dtype="<u4").tobytes()  # 80,000 bytes
        return msgpack.packb({"id": rid, "op": "insert", "tokens": tokens, "meta": 1,
                              "ns": "buf"})

    first, second = insert(1, 0), insert(2, 10**6)
    with RawConn(proc.socket, timeout=0.5) as a, RawConn(proc.socket, timeout=10) as b:
        a.send_raw(first[:60_000])
        assert a.closed_by_server() is False  # 60,000 bytes held: under the bound
        a.sock.settimeout(30)
        b.send_raw(second[:60_000])  # 120,000 held in all: b is refused
        got = b.recv()
        assert got["id"] == 0 and got["error"]["code"] == "busy", got
        assert "exceeds max_buffered_bytes (100000)" in got["error"]["message"]
        assert b.closed_by_server()
        a.send_raw(first[60_000:])  # a finishes its message and is served
        assert a.recv()["ok"]
        stats = a.call("stats", 3)
        assert stats["buffered_bytes"] == 0


def test_client_that_never_reads_is_cut_off_past_max_write_buffer(
    sarpd_factory: Launcher,
) -> None:
    server = {"max_write_buffer": 256 * 1024, "max_inflight_per_conn": 4096}
    proc = sarpd_factory(config={"server": server})
    seq = toks(1024, 1)  # 64 blocks: a match with_ids answers ~1.6 KB
    with RawConn(proc.socket) as conn:
        assert conn.call("insert", tokens=seq, meta=3, ns="hog")["ok"]
    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(str(proc.socket))
    req = {"op": "match", "tokens": seq, "ns": "hog", "with_ids": True}
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # may be cut off early
        hog.sendall(b"".join(msgpack.packb({"id": i, **req}) for i in range(1, 2001)))
    # the hog never reads; others are served meanwhile and the hog gets cut off
    deadline = time.monotonic() + 30
    while "max_write_buffer" not in proc.log() and time.monotonic() < deadline:
        with RawConn(proc.socket, timeout=10) as other:
            got = other.call("match", tokens=seq, ns="hog")
            assert got["ok"] and got["blocks"] == 64
        time.sleep(0.05)
    assert "exceeds max_write_buffer (262144)" in proc.log()
    hog.settimeout(10)
    received = 0
    try:
        while chunk := hog.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    hog.close()
    assert received < 2000 * 1600  # it did not get every answer: it was disconnected
    assert proc.alive


def _pipeline_inserts(path: str, worker: int, out: dict[int, Any]) -> None:
    """Pipelined inserts (up to 16 unanswered) until the server closes; records every
    response by id, and the ids sent."""
    sent: list[int] = []
    answers: dict[int, dict[str, Any]] = {}
    unpacker = msgpack.Unpacker(raw=False)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.settimeout(30)
    sending = True
    try:
        rid = 0
        while True:
            while sending and len(sent) - len(answers) < 16:
                rid += 1
                tokens = toks(128, worker * 10_000_000 + rid * 1000)
                msg = {"id": rid, "op": "insert", "tokens": tokens, "meta": rid, "ns": "load"}
                try:
                    sock.sendall(msgpack.packb(msg))
                except (BrokenPipeError, ConnectionResetError):
                    # the server closed with our later requests unread: it did not read
                    # this one, but answers to earlier ones may still be in our buffer
                    # (rejections go out at once, durable writes after their sync)
                    sending = False
                    break
                sent.append(rid)
            data = sock.recv(1 << 16)
            if not data:
                break
            unpacker.feed(data)
            for resp in unpacker:
                assert resp["id"] not in answers, resp
                answers[resp["id"]] = resp
    except ConnectionResetError:
        pass  # read to the end of what the server sent
    finally:
        sock.close()
    out[worker] = (sent, answers)


def test_sigterm_under_load_answers_received_requests_and_snapshots(
    sarpd_factory: Launcher,
) -> None:
    proc = sarpd_factory(config={"index": {"snapshot_interval_s": 0}})
    results: dict[int, Any] = {}
    workers = [
        threading.Thread(target=_pipeline_inserts, args=(str(proc.socket), w, results))
        for w in range(6)
    ]
    for t in workers:
        t.start()
    time.sleep(1.5)
    assert proc.stop(signal.SIGTERM) == 0, proc.log()
    for t in workers:
        t.join(60)
    assert len(results) == 6
    acked: list[tuple[int, int]] = []
    for w, (sent, answers) in results.items():
        # what the server read it answered: the answered ids are a gap-free prefix
        missing = sorted(set(sent[: len(answers)]) - set(answers))[:20]
        assert sorted(answers) == sent[: len(answers)], (
            w, len(sent), len(answers), missing, proc.log()[-4000:])  # the log: why
        for rid, resp in answers.items():
            if resp["ok"]:
                assert resp["blocks"] == 8
                acked.append((w, rid))
            else:
                assert resp["error"]["code"] == "unavailable", resp
    assert len(acked) >= 12, "the load did not get going"
    assert "final snapshot up to segment" in proc.log()
    proc.start()  # the snapshot covers everything: nothing to re-route
    assert "0 segments re-routed" in proc.log().rsplit("recovering the index", 1)[-1]
    _assert_all_matched(proc, acked)


def _assert_all_matched(proc: SarpdProc, acked: list[tuple[int, int]]) -> None:
    with RawConn(proc.socket) as conn:
        for i in range(0, len(acked), 256):
            part = acked[i : i + 256]
            conn.send_raw(b"".join(
                msgpack.packb({"id": j, "op": "match", "ns": "load",
                               "tokens": toks(128, w * 10_000_000 + rid * 1000)})
                for j, (w, rid) in enumerate(part)
            ))
            got = [conn.recv() for _ in part]
            lost = [g for g in got if not g["ok"] or g["blocks"] != 8]
            assert not lost, f"{len(lost)} acknowledged inserts lost, e.g. {lost[0]}"
