"""`sarpd` (sarpd.daemon.cli): a real sarpd process (RocksDB on a temp dir, --sync
always) through its socket, its logs, its recovery progress and its start-up checks."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from sarpd.client import Client, SyncClient
from sarpd.config import ServerConfig
from sarpd.daemon.cli import Daemon
from sarpd.errors import UnknownParent
from tests.daemon_helpers import Launcher, RawConn, SarpdProc

BT = 16  # tokens per block

STATS_FIELDS = (
    "blocks",
    "segments",
    "routing_points",
    "directory_bytes",
    "requests",
    "matches",
    "inserts",
    "uptime_s",
    "recovered_in_s",
)


def seq(n_blocks: int, seed: int, extra: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, 2**32, n_blocks * BT + extra, dtype=np.uint64)]


@pytest.fixture
def client(shared_sarpd: SarpdProc) -> Iterator[SyncClient]:
    with SyncClient(shared_sarpd.socket) as c:
        yield c


def test_socket_mode_default(shared_sarpd: SarpdProc) -> None:
    assert stat.S_IMODE(os.stat(shared_sarpd.socket).st_mode) == 0o660


def test_hello_and_ping(client: SyncClient) -> None:
    hello = client.hello()
    assert hello["server"] == "sarpd"
    assert hello["protocol"] == 1
    assert hello["block_tokens"] == 16 and hello["segment_blocks"] == 64
    assert isinstance(hello["version"], str) and hello["version"]
    assert isinstance(hello["hash"], str) and hello["hash"] != "unknown"
    assert hello["backend"] == "rocksdb"
    assert client.ping() == {}


def test_protocol_2_holders_over_the_socket(shared_sarpd: SarpdProc,
                                            client: SyncClient) -> None:
    """A protocol-2 connection adds holders; a protocol-1 one keeps "the first insert
    wins" on the same daemon; a match answers per holder; remove takes one holder."""
    prompt = seq(70, seed=21)
    turn = prompt + seq(5, seed=22)
    with SyncClient(shared_sarpd.socket) as fleet:
        hello = fleet.hello(protocol=2)
        assert (hello["protocol"], hello["max_protocol"], hello["holders"]) == (2, 2, True)
        for worker in (3, 1, 2):
            fleet.insert(tokens=prompt, meta=worker << 48, ns="t-fleet")
        assert fleet.insert(tokens=turn, meta=2 << 48, ns="t-fleet")["new_blocks"] == 5
        got = fleet.match(tokens=turn, ns="t-fleet", holders=8)
        assert got["blocks"] == 75 and got["meta"] == [2 << 48] * 75
        assert got["holders"] == [[2 << 48, 75], [1 << 48, 70], [3 << 48, 70]]
        assert fleet.remove(tokens=prompt, ns="t-fleet", meta=2 << 48) == {"removed": 0}
        got = fleet.match(tokens=turn, ns="t-fleet", holders=8)
        # the turn's blocks are still worker 2's: every block has a holder, but worker
        # 2's run from position 0 is 0 now, so it is left out
        assert got["holders"] == [[1 << 48, 70], [3 << 48, 70]] and got["blocks"] == 75
    assert client.hello()["protocol"] == 1 and client.hello()["holders"] is False
    client.insert(tokens=prompt, meta=9 << 48, ns="t-fleet")  # protocol 1: no holder added
    assert client.match(tokens=prompt, ns="t-fleet", holders=8)["holders"] == [
        [1 << 48, 70], [3 << 48, 70]]
    assert client.stats()["holdings"] >= 140


def test_insert_then_match_returns_every_block_and_its_meta(client: SyncClient) -> None:
    tokens = seq(150, seed=1, extra=7)  # 150 whole blocks and a partial one
    meta = [1000 + i for i in range(150)]
    ins = client.insert(tokens=tokens, meta=meta, ns="t-match")
    assert ins == {"blocks": 150, "new_blocks": 150, "matched_blocks": 0}
    got = client.match(tokens=tokens, ns="t-match", with_ids=True)
    assert got["blocks"] == 150 and got["tokens"] == 150 * BT
    assert got["meta"] == meta
    assert len(got["ids"]) == 150 and all(len(i) == 16 for i in got["ids"])
    # a longer query matches the indexed prefix; another namespace matches nothing
    assert client.match(tokens=tokens + seq(3, seed=2), ns="t-match")["blocks"] == 150
    assert client.match(tokens=tokens, ns="other")["blocks"] == 0
    # a second insert of the same sequence finds it all; the first metadata wins
    again = client.insert(tokens=tokens, meta=5, ns="t-match")
    assert again == {"blocks": 150, "new_blocks": 0, "matched_blocks": 150}
    assert client.match(tokens=tokens, ns="t-match")["meta"] == meta


def test_insert_by_hashes_and_parent(client: SyncClient) -> None:
    hashes = [int(h) for h in np.arange(1, 11, dtype=np.uint64) * 7919]
    client.insert(hashes=hashes[:4], meta=3, ns="t-hash")
    got = client.match(hashes=hashes[:4], ns="t-hash", with_ids=True)
    assert got["blocks"] == 4
    tail = client.insert(hashes=hashes[4:], meta=4, ns="t-hash", parent=got["ids"][-1])
    assert tail["blocks"] == 6
    full = client.match(hashes=hashes, ns="t-hash")
    assert full["blocks"] == 10 and full["meta"] == [3] * 4 + [4] * 6
    with pytest.raises(UnknownParent):
        client.insert(hashes=hashes[:1], meta=1, ns="t-hash", parent=b"\x01" * 16)


def _pipelined_worker(path: Path, conn_no: int, errors: list[str]) -> None:
    """25 x (insert one more block, match the whole sequence) in one send; every
    response in request order, each match seeing the inserts sent before it."""
    try:
        tokens = seq(25, seed=100 + conn_no)
        frames = b""
        for i in range(25):
            ins = {"id": 2 * i + 1, "op": "insert", "tokens": tokens[: (i + 1) * BT], "meta": i}
            frames += msgpack.packb({**ins, "ns": f"pipe{conn_no}"})
            frames += msgpack.packb(
                {"id": 2 * i + 2, "op": "match", "tokens": tokens, "ns": f"pipe{conn_no}"}
            )
        with RawConn(path) as conn:
            conn.send_raw(frames)
            for n in range(1, 51):
                resp = conn.recv()
                assert resp["id"] == n, f"conn {conn_no}: response {resp['id']}, expected {n}"
                assert resp["ok"], resp
                if n % 2 == 0:
                    blocks = n // 2
                    assert resp["blocks"] == blocks, (conn_no, n, resp["blocks"])
                    assert np.frombuffer(resp["meta"], "<u8").tolist() == list(range(blocks))
                else:
                    assert resp["new_blocks"] == 1, (conn_no, n, resp)
    except Exception as exc:
        errors.append(repr(exc))


def test_200_pipelined_requests_from_concurrent_clients_in_connection_order(
    shared_sarpd: SarpdProc,
) -> None:
    errors: list[str] = []
    threads = [
        threading.Thread(target=_pipelined_worker, args=(shared_sarpd.socket, k, errors))
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with RawConn(shared_sarpd.socket) as conn:
        stats = conn.call("stats")
    assert stats["batches"] < stats["requests"]  # requests shared batches


def test_async_client_gather(shared_sarpd: SarpdProc) -> None:
    async def main() -> list[dict[str, Any]]:
        async with await Client.connect(shared_sarpd.socket) as c:
            ops = []
            for k in range(40):
                tokens = seq(3, seed=500 + k)
                ops.append(c.insert(tokens=tokens, meta=k, ns="gather"))
                ops.append(c.match(tokens=tokens, ns="gather"))
            return list(await asyncio.gather(*ops))

    results = asyncio.run(main())
    for k in range(40):
        assert results[2 * k]["new_blocks"] == 3
        assert results[2 * k + 1]["blocks"] == 3 and results[2 * k + 1]["meta"] == [k] * 3


def test_remove_from_a_position_and_refill(client: SyncClient) -> None:
    tokens = seq(8, seed=7)
    client.insert(tokens=tokens, meta=list(range(8)), ns="t-rm")
    assert client.remove(tokens=tokens, start=5, ns="t-rm") == {"removed": 3}
    assert client.match(tokens=tokens, ns="t-rm")["blocks"] == 5
    assert client.remove(tokens=tokens, start=5, ns="t-rm") == {"removed": 0}
    refill = client.insert(tokens=tokens, meta=9, ns="t-rm")
    assert refill["new_blocks"] == 3 and refill["matched_blocks"] == 5
    assert client.match(tokens=tokens, ns="t-rm")["meta"] == [0, 1, 2, 3, 4, 9, 9, 9]


def test_remove_by_ids_leaves_a_hole_that_a_refill_closes(client: SyncClient) -> None:
    tokens = seq(8, seed=8)
    client.insert(tokens=tokens, meta=1, ns="t-hole")
    ids = client.match(tokens=tokens, ns="t-hole", with_ids=True)["ids"]
    assert client.remove(ids=[ids[2]], ns="t-hole") == {"removed": 1}
    assert client.match(tokens=tokens, ns="t-hole")["blocks"] == 2  # a prefix with a hole
    refill = client.insert(tokens=tokens, meta=2, ns="t-hole")
    assert refill["new_blocks"] == 1  # the blocks after the hole were never removed
    assert client.match(tokens=tokens, ns="t-hole")["meta"] == [1, 1, 2, 1, 1, 1, 1, 1]


def test_clear_by_mask_and_value(client: SyncClient) -> None:
    a, b = seq(4, seed=21), seq(6, seed=22)
    client.insert(tokens=a, meta=0x10 | 1, ns="t-clear")  # worker 1
    client.insert(tokens=b, meta=0x20 | 2, ns="t-clear")  # worker 2
    client.insert(tokens=a, meta=1, ns="t-keep")
    assert client.clear("t-clear", mask=0xF, value=1) == {"removed": 4}
    assert client.match(tokens=a, ns="t-clear")["blocks"] == 0
    assert client.match(tokens=b, ns="t-clear")["blocks"] == 6
    assert client.clear("t-clear") == {"removed": 6}
    assert client.match(tokens=b, ns="t-clear")["blocks"] == 0
    assert client.match(tokens=a, ns="t-keep")["blocks"] == 4


def test_stats_fields_and_snapshot(client: SyncClient) -> None:
    client.insert(tokens=seq(2, seed=31), meta=0, ns="t-stats")
    stats = client.stats()
    for name in STATS_FIELDS:
        assert name in stats, f"stats lacks {name}: {sorted(stats)}"
    assert stats["blocks"] >= 2 and stats["directory_bytes"] > 0
    assert isinstance(stats["recovered_in_s"], float) and stats["recovered_in_s"] >= 0
    snap = client.snapshot()
    assert snap["segment_id"] >= 1 and snap["seconds"] >= 0


def test_sigterm_exits_0_and_a_restart_matches_everything(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory()
    seqs = {k: seq(1 + k * 7 % 90, seed=900 + k) for k in range(30)}
    with SyncClient(proc.socket) as c:
        for k, tokens in seqs.items():
            c.insert(tokens=tokens, meta=k, ns=f"ns{k % 3}")
    assert proc.stop(signal.SIGTERM) == 0, proc.log()
    assert not proc.socket.exists()
    assert "final snapshot" in proc.log()
    proc.start()
    with SyncClient(proc.socket) as c:
        for k, tokens in seqs.items():
            got = c.match(tokens=tokens, ns=f"ns{k % 3}")
            assert got["blocks"] == len(tokens) // BT and got["meta"] == [k] * got["blocks"]
        assert c.stats()["recovered_in_s"] is not None
    assert "recovered in" in proc.log()
    assert proc.stop(signal.SIGINT) == 0, proc.log()


def test_two_daemons_cannot_share_a_data_dir(sarpd_factory: Launcher) -> None:
    first = sarpd_factory()
    second = SarpdProc(first.data_dir)
    try:
        second.start(wait=False)
        assert second.proc is not None
        assert second.proc.wait(60) != 0
        assert "in use by another sarpd" in second.log()
        assert str(first.proc.pid if first.proc else "") in second.log()
    finally:
        second.cleanup()
    third = SarpdProc(first.data_dir.parent / "third")
    third.socket = first.socket  # another data dir, but the same socket
    try:
        third.start(wait=False)
        assert third.proc is not None
        assert third.proc.wait(60) != 0
        assert "another server is listening" in third.log()
    finally:
        third.cleanup()
    with RawConn(first.socket) as conn:
        assert conn.call("ping")["ok"]


def test_socket_mode_group_and_connection_limit(sarpd_factory: Launcher) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    server = {"max_connections": 2, "socket_mode": "0600", "socket_group": group}
    proc = sarpd_factory(config={"server": server, "index": {"snapshot_interval_s": 0.2}})
    st = os.stat(proc.socket)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_gid == os.getgid()
    with RawConn(proc.socket) as a, RawConn(proc.socket) as b:
        assert a.call("ping")["ok"] and b.call("ping")["ok"]
        with RawConn(proc.socket, timeout=10) as c:
            resp = c.recv()
            assert resp["id"] == 0 and resp["error"]["code"] == "busy"
            assert "max_connections" in resp["error"]["message"]
            assert c.closed_by_server()
    with RawConn(proc.socket) as d:  # the slots are free again
        assert d.call("ping")["ok"]
    # the periodic snapshot ran (snapshot_interval_s 0.2)
    deadline = time.monotonic() + 30
    while "snapshot up to segment" not in proc.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "snapshot up to segment" in proc.log()


@pytest.fixture(scope="module")
def json_log_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SarpdProc]:
    from tests.daemon_helpers import launcher

    with launcher(tmp_path_factory.mktemp("jsonlog")) as lau:
        yield lau(extra_args=("--log-format", "json"))


def test_json_logs(json_log_daemon: SarpdProc) -> None:
    lines = [json.loads(line) for line in json_log_daemon.log().splitlines()
             if line.startswith("{")]
    assert lines, json_log_daemon.log()
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(line["message"].startswith("ready: serving on") for line in lines)


def test_recovery_progress_has_an_eta_in_status_and_metrics() -> None:
    daemon = Daemon(ServerConfig())
    daemon._recovery_started -= 2.0  # 2 s in, a quarter done: ~6 s left
    daemon._progress(1000, 4000)
    status = daemon.server.status
    assert status.startswith("recovering: 1000 of 4000 segments (25%, ETA ")
    eta = float(status.split("ETA ")[1].split(" s")[0])
    assert 5.5 < eta < 7.5
    r = daemon.server.metrics.recovery
    assert (r.done, r.total, r.ready) == (1000, 4000, False) and r.eta_s == pytest.approx(eta, 0.1)
    daemon.server.executor.shutdown()
