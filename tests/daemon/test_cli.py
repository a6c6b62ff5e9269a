"""`sarpd` (sarpd.daemon.cli): a real sarpd process (RocksDB on a temp dir, --sync
always) through its socket, its logs, its recovery progress and its start-up checks:
a bad setting (file, flag or SARPD_* variable) or a missing directory stops it before
anything starts, and an idle sarpd neither writes nor logs snapshots."""

from __future__ import annotations

import asyncio
import grp
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

from sarpd.client import Client, SyncClient
from sarpd.config import ServerConfig
from sarpd.daemon.cli import Daemon, main
from sarpd.errors import UnknownParent
from tests.daemon_helpers import REPO, Launcher, RawConn, SarpdProc, free_port

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


# --- start-up checks: nothing starts with a setting sarpd cannot use ---------------------


def run_sarpd(*args: str | Path, env: dict[str, str] | None = None,
              cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`python -m sarpd.daemon ARGS` to its exit (these all exit before serving; the
    timeout is a backstop, the issue's 5 s target is the lead's script's to time)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "sarpd.daemon", *map(str, args)], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=60)


def assert_nothing_started(res: subprocess.CompletedProcess[str], *untouched: Path) -> None:
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "ready" not in out and "listening" not in out and "recovering" not in out, out
    assert "Traceback" not in out and "Error:" in out, out
    for path in untouched:
        assert not path.exists(), f"{path} was created:\n{out}"


@pytest.mark.parametrize(("text", "named"), [
    ('[server]\nmax_connections = "ten"\n',
     '[server] max_connections: "ten" is not an integer'),
    ("[server]\nmax_connections = 0\n", "[server] max_connections: 0 must be >= 1"),
    ("[indx]\nwindow_cap = 2\n", "unknown table [indx]"),
    ("[server]\nbind_namespaces = 1\n", "[server] bind_namespaces: 1 is not true or false"),
    ('[server]\nbackend = "rocks"\n', '[server] backend: "rocks" is not one of'),
])
def test_a_bad_config_file_stops_sarpd_before_anything_starts(
        tmp_path: Path, text: str, named: str) -> None:
    config = tmp_path / "sarpd.toml"
    config.write_text(text)
    data, sock = tmp_path / "data", tmp_path / "s.sock"
    res = run_sarpd("--config", config, "--data-dir", data, "--socket", sock)
    assert_nothing_started(res, data, sock)
    assert res.returncode == 1 and str(config) in res.stderr  # the file is named
    assert named in res.stderr, res.stderr


def test_a_socket_in_a_missing_directory_is_refused_and_nothing_created(tmp_path: Path) -> None:
    missing, data = tmp_path / "nonexistent" / "dir", tmp_path / "data"
    res = run_sarpd("--data-dir", data, "--socket", missing / "s.sock")
    assert_nothing_started(res, tmp_path / "nonexistent", data)
    assert f"socket {missing / 's.sock'}: directory {missing} does not exist" in res.stderr


def test_a_data_dir_whose_parent_is_missing_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "a" / "b" / "data"
    res = run_sarpd("--data-dir", data, "--socket", tmp_path / "s.sock")
    assert_nothing_started(res, tmp_path / "a", tmp_path / "s.sock")
    assert f"data dir {data}: its parent directory {data.parent} does not exist" in res.stderr


@pytest.mark.parametrize(("env", "said"), [
    ({"SARPD_BATCH_MAX": "ten"}, "'ten' is not a valid integer"),  # click's type check
    ({"SARPD_BATCH_MAX": "0"}, "0 must be >= 1"),  # sarpd.config's range rule
    ({"SARPD_METRICS_PORT": "99999"}, "99999 is not in the range 0<=x<=65535"),
    ({"SARPD_BATCH_WINDOW_MS": "nan"}, "NaN is not a finite number"),
    ({"SARPD_METRICS_HOST": " "}, '" " is not a non-empty string'),
])
def test_a_bad_environment_variable_is_refused_by_name(
        tmp_path: Path, env: dict[str, str], said: str) -> None:
    data, sock = tmp_path / "data", tmp_path / "s.sock"
    res = run_sarpd("--data-dir", data, "--socket", sock, env=env)
    assert_nothing_started(res, data, sock)
    assert res.returncode == 2  # a usage error, as a bad flag is
    (name,) = env
    assert f"'{name}'" in res.stderr and said in res.stderr, res.stderr
    flag = "--" + name.removeprefix("SARPD_").lower().replace("_", "-")
    assert f"'{flag}'" in res.stderr, res.stderr


def test_help_tells_of_environment_variables_and_the_metrics_host() -> None:
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())  # as wrapped to any width
    assert "SARPD_BATCH_MAX=512 is --batch-max 512" in text
    assert "--metrics-host HOST" in text and "[env var: SARPD_METRICS_HOST]" in text
    assert "SARPD_VERSION" not in text  # --version is no setting


def test_settings_from_the_environment_and_the_metrics_host_flag(sarpd_factory: Launcher) -> None:
    """SARPD_LOG_FORMAT and --metrics-host reach the daemon: JSON logs, metrics served
    on 127.0.0.2 (not the default 127.0.0.1)."""
    port = free_port()
    proc = sarpd_factory(env={"SARPD_LOG_FORMAT": "json"},
                         extra_args=("--metrics-host", "127.0.0.2", "--metrics-port", str(port)))
    lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
    assert any(line["message"].startswith("ready: serving on") for line in lines), proc.log()
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as resp:
                assert resp.status == 200 and b"sarpd_requests_total" in resp.read()
                break
        except OSError:
            if time.monotonic() > deadline:
                raise


# --- periodic snapshots: only when something changed -----------------------------------


def _wait_for(proc: SarpdProc, text: str, count: int = 1) -> str:
    deadline = time.monotonic() + 60
    while proc.log().count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in:\n{proc.log()}"
        time.sleep(0.05)
    return proc.log()


def test_an_idle_sarpd_writes_and_logs_no_snapshots(sarpd_factory: Launcher) -> None:
    """With snapshots every 0.2 s: idle, nothing is written and nothing logged at INFO
    (DEBUG, set by SARPD_LOG_LEVEL, says why); after an insert, one snapshot; idle
    again, no more."""
    idle = "DEBUG sarpd: periodic snapshot: nothing changed since the last one"
    wrote = "INFO sarpd: snapshot up to segment"
    proc = sarpd_factory(config={"index": {"snapshot_interval_s": 0.2}},
                         env={"SARPD_LOG_LEVEL": "DEBUG"})
    snaps = proc.data_dir / "snapshots" / "rocksdb"
    log = _wait_for(proc, idle, 3)
    assert wrote not in log and not list(snaps.glob("*.snap"))
    with SyncClient(proc.socket) as c:
        c.insert(tokens=seq(3, seed=77), meta=1, ns="t-idle")
    log = _wait_for(proc, wrote)
    written = list(snaps.glob("*.snap"))
    assert len(written) == 1
    mtime = written[0].stat().st_mtime_ns
    after = log.count(idle)
    log = _wait_for(proc, idle, after + 3)
    assert log.count(wrote) == 1, log
    assert list(snaps.glob("*.snap")) == written and written[0].stat().st_mtime_ns == mtime
    with SyncClient(proc.socket) as c:
        assert c.stats()["snapshots"] == 1  # the service counts snapshots written


def test_a_snapshot_follows_enough_changed_segments(sarpd_factory: Launcher) -> None:
    """With snapshots by time only once an hour: none until 4 segments changed, then one
    at once (issue 24: what a restart re-routes stays bounded under load)."""
    wrote = "INFO sarpd: snapshot up to segment"
    proc = sarpd_factory(config={"index": {"snapshot_interval_s": 3600,
                                           "snapshot_changed_segments": 4}})
    snaps = proc.data_dir / "snapshots" / "rocksdb"
    with SyncClient(proc.socket) as c:
        for i in range(3):  # three sessions, three segments
            c.insert(tokens=seq(2, seed=100 + i), meta=1)
        time.sleep(1.0)  # four polls: nothing due
        assert wrote not in proc.log() and not list(snaps.glob("*.snap"))
        c.insert(tokens=seq(2, seed=200), meta=1)
    _wait_for(proc, wrote)
    assert len(list(snaps.glob("*.snap"))) == 1
