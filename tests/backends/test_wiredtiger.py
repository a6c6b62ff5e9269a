"""WiredTiger specifics beyond the contract suite (tests/backends/test_contract.py runs
every contract test on wiredtiger too): threads, checkpoints bounding recovery, kill -9
after sync=False batches, the cache size, the sync flag reaching the log, empty keys,
double open, close during a scan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import cast

import pytest

from backends.base import WriteBatch
from backends.errors import BackendConfigError, BackendIOError
from backends.registry import cache_floor
from backends.wiredtiger import MIN_CACHE_BYTES, SCAN_CHUNK, WiredTigerBackend
from tests.backends.helpers import batch_of, be8, put_all

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


Scan = Generator[tuple[bytes, bytes], None, None]


def _generator(scan: Iterator[tuple[bytes, bytes]]) -> Scan:
    return cast(Scan, scan)  # WiredTigerBackend.scan is a generator function


@pytest.fixture
def wt(tmp_path: Path) -> Iterator[WiredTigerBackend]:
    backend = WiredTigerBackend(tmp_path / "db", cache_bytes=8 * MiB)
    yield backend
    backend.close()


# --- threads ----------------------------------------------------------------------------

WRITERS, READERS, ROUNDS = 4, 3, 150


def _writer(backend: WiredTigerBackend, t: int, errors: list[BaseException]) -> None:
    try:
        for i in range(ROUNDS):
            # batch i of writer t: four keys with the same version, plus a shared key
            # every writer overwrites, plus a delete of the previous batch's marker
            puts = {b"w" + bytes([t]) + bytes([j]): be8(i) * 8 for j in range(4)}
            puts[b"shared"] = bytes([t]) + be8(i)
            puts[b"m" + bytes([t]) + be8(i)] = b"x"
            deletes = (b"m" + bytes([t]) + be8(i - 1),) if i else ()
            backend.write(batch_of(puts, deletes), sync=i % 10 == 0)
    except BaseException as exc:
        errors.append(exc)


def _reader(backend: WiredTigerBackend, stop: threading.Event, errors: list[BaseException]) -> None:
    try:
        while not stop.is_set():
            for t in range(WRITERS):
                got = backend.get_many([b"w" + bytes([t]) + bytes([j]) for j in range(4)])
                # a batch is seen whole or not at all: one version for all four keys
                assert len(set(got)) == 1, got
            markers = [k for k, _ in backend.scan(b"m", b"n")]
            assert markers == sorted(markers)
            # one snapshot: exactly one marker per writer that has written
            assert len({k[1] for k in markers}) == len(markers), markers
    except BaseException as exc:
        errors.append(exc)


def test_threads_read_and_write_concurrently(wt: WiredTigerBackend) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()
    writers = [threading.Thread(target=_writer, args=(wt, t, errors)) for t in range(WRITERS)]
    readers = [threading.Thread(target=_reader, args=(wt, stop, errors)) for _ in range(READERS)]
    for thread in writers + readers:
        thread.start()
    for thread in writers:
        thread.join(120)
    stop.set()
    for thread in readers:
        thread.join(120)
    assert not errors, errors[:3]
    for t in range(WRITERS):
        keys = [b"w" + bytes([t]) + bytes([j]) for j in range(4)]
        assert wt.get_many(keys) == [be8(ROUNDS - 1) * 8] * 4
        assert [k for k, _ in wt.scan(b"m" + bytes([t]), b"m" + bytes([t + 1]))] == [
            b"m" + bytes([t]) + be8(ROUNDS - 1)
        ]
    shared = wt.get_many([b"shared"])[0]
    assert shared is not None and shared[1:] == be8(ROUNDS - 1)
    # the session pool holds at most one session per thread that called at once
    assert len(wt._pool) <= WRITERS + READERS + 1


def test_close_waits_for_calls_and_ends_scans(tmp_path: Path) -> None:
    backend = WiredTigerBackend(tmp_path / "db")
    put_all(backend, [(b"S" + be8(i), b"v") for i in range(SCAN_CHUNK * 2 + 5)], sync=False)
    scan = _generator(backend.scan(b"S", b"T"))
    assert next(scan)[0] == b"S" + be8(0)
    outcomes: list[object] = []

    def read() -> None:
        try:
            outcomes.append(backend.get_many([b"S" + be8(3)] * 50))
        except BackendIOError as exc:
            outcomes.append(exc.message)

    other_thread = threading.Thread(target=read)
    other_thread.start()
    backend.close()
    other_thread.join()
    # before the close: read whole; after: refused (never a crash on a freed session)
    assert outcomes in ([[b"v"] * 50], [f"wiredtiger {tmp_path / 'db'}: get_many after close"])
    with pytest.raises(BackendIOError, match="closed during a scan"):
        list(scan)  # the first chunk was read already; the next one fails
    scan.close()
    again = WiredTigerBackend(tmp_path / "db")
    assert len(list(again.scan(b"S", b"T"))) == SCAN_CHUNK * 2 + 5
    again.close()


def test_abandoned_scan_and_scans_across_chunks(wt: WiredTigerBackend) -> None:
    n = SCAN_CHUNK * 3 + 1
    put_all(wt, [(b"S" + be8(i), be8(i)) for i in range(n)], sync=False)
    for _ in range(300):  # scans dropped half-way give their session back
        scan = _generator(wt.scan(b"S", b"T"))
        next(scan)
        scan.close()
    got = list(wt.scan(b"S" + be8(1), b"S" + be8(n - 1)))
    assert [v for _, v in got] == [be8(i) for i in range(1, n - 1)]


# --- keys -------------------------------------------------------------------------------


def test_empty_and_non_bytes_keys(wt: WiredTigerBackend) -> None:
    put_all(wt, [(b"a", b"1")], sync=True)
    with pytest.raises(ValueError, match="empty key"):
        wt.write(batch_of({b"": b"v", b"b": b"2"}), sync=True)
    assert wt.get_many([b"", b"a", b"b"]) == [None, b"1", None]  # nothing of the batch
    wt.write(batch_of({}, deletes=(b"",)), sync=False)
    assert list(wt.scan(b"", b"\xff")) == [(b"a", b"1")]
    with pytest.raises(TypeError, match="bytes"):
        wt.get_many([bytearray(b"a")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bytes"):
        wt.write(batch_of({b"c": "text"}), sync=False)  # type: ignore[dict-item]
    assert wt.get_many([b"a", b"c"]) == [b"1", None]


# --- configuration ------------------------------------------------------------------------


def test_cache_size_is_configured(tmp_path: Path) -> None:
    backend = WiredTigerBackend(tmp_path / "a", cache_bytes=48 * MiB)
    stats = backend.stats()
    assert stats["cache_bytes_configured"] == stats["cache_bytes_max"] == 48 * MiB
    assert stats["engine_diagnostic_build"] == 0  # `make setup-wt` builds Release
    backend.close()
    small = WiredTigerBackend(tmp_path / "b", cache_bytes=1000)
    assert small.stats()["cache_bytes_max"] == MIN_CACHE_BYTES  # room for a batch
    assert cache_floor("wiredtiger") == MIN_CACHE_BYTES  # what the bench reports
    small.close()
    with pytest.raises(BackendConfigError, match="-1"):
        WiredTigerBackend(tmp_path / "c", cache_bytes=-1)


def test_sync_flag_reaches_the_log(wt: WiredTigerBackend) -> None:
    def syncs() -> int:
        return int(wt.stats()["log_syncs"])

    base = syncs()
    for i in range(3):
        wt.write(batch_of({be8(i): b"v"}), sync=False)
    assert syncs() == base
    wt.write(batch_of({b"s": b"v"}), sync=True)
    assert syncs() == base + 1
    wt.sync()
    assert syncs() >= base + 1  # nothing new to sync: WiredTiger may skip the fsync
    wt.write(batch_of({b"t": b"v"}), sync=False)
    wt.write(WriteBatch(), sync=True)  # an empty synced batch syncs what came before
    assert syncs() == base + 2


def test_second_open_and_bad_directory(tmp_path: Path) -> None:
    first = WiredTigerBackend(tmp_path / "db")
    with pytest.raises(BackendIOError, match="already open in this process"):
        WiredTigerBackend(tmp_path / "." / "db")
    first.close()
    WiredTigerBackend(tmp_path / "db").close()
    a_file = tmp_path / "file"
    a_file.write_bytes(b"not a directory")
    for _ in range(2):  # a failed open releases its claim on the path
        with pytest.raises(BackendIOError, match=str(a_file)):
            WiredTigerBackend(a_file)


# --- crashes ------------------------------------------------------------------------------

VALUE = 1600  # a segment's size

CHILD = """
import os, signal, sys, time
from pathlib import Path
from backends.base import WriteBatch
from backends.wiredtiger import WiredTigerBackend
path, n, wait_s, log_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
b = WiredTigerBackend(path, cache_bytes=8 << 20, checkpoint_wait_s=wait_s,
                      checkpoint_log_bytes=log_bytes)
for i in range(n):
    wb = WriteBatch()
    wb.put(b"S" + i.to_bytes(8, "big"), bytes([i % 251]) * VALUE)
    b.write(wb, sync=False)
    quarter = 4 * (i + 1) // n if (4 * (i + 1)) % n == 0 else 0
    if log_bytes and 1 <= quarter <= 3:
        # each quarter writes more log than log_bytes: let the checkpoint thread catch up,
        # so the last checkpoint is past 3/4 of the log however loaded the host is
        deadline = time.monotonic() + 60
        while int(b.stats()["checkpoints"]) < quarter and time.monotonic() < deadline:
            time.sleep(0.01)
print(int(b.stats()["checkpoints"]), b.stats()["log_files"], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
""".replace("VALUE", str(VALUE))


def _crash_child(path: Path, n: int, wait_s: int, log_bytes: int) -> tuple[int, int]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(n), str(wait_s), str(log_bytes)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    checkpoints, log_files = proc.stdout.split()
    return int(checkpoints), int(log_files)


def _recover(path: Path, n: int) -> int:
    """Reopen after the kill: every batch (sync=False) is there; log records replayed."""
    backend = WiredTigerBackend(path)
    try:
        got = list(backend.scan(b"S", b"T"))
        assert len(got) == n
        assert all(v == bytes([i % 251]) * VALUE for i, (_, v) in enumerate(got))
        return int(backend.stats()["log_records_scanned"])
    finally:
        backend.close()


def test_checkpoints_bound_recovery_after_kill_9(tmp_path: Path) -> None:
    """sync=False batches survive kill -9 (the log reached the OS). With checkpoints every
    2 MB of log, recovery reads far fewer log records than with none, and old log files
    are removed."""
    n = 6000  # ~10 MB of log
    checkpoints, log_files = _crash_child(tmp_path / "ckpt", n, 0, 2 * MiB)
    assert checkpoints >= 1
    assert log_files <= 4
    _, plain_log_files = _crash_child(tmp_path / "plain", n, 0, 0)
    assert plain_log_files >= 5  # every log file kept: no checkpoint released one
    replayed_ckpt = _recover(tmp_path / "ckpt", n)
    replayed_plain = _recover(tmp_path / "plain", n)
    assert replayed_plain >= n
    assert replayed_ckpt < replayed_plain // 2, (replayed_ckpt, replayed_plain)


def test_reopen_after_clean_close_replays_no_log(tmp_path: Path) -> None:
    backend = WiredTigerBackend(tmp_path / "db")
    put_all(backend, [(b"S" + be8(i), b"v" * VALUE) for i in range(500)], sync=True)
    backend.close()  # checkpoints
    again = WiredTigerBackend(tmp_path / "db")
    try:
        assert len(list(again.scan(b"S", b"T"))) == 500
        assert int(again.stats()["log_records_scanned"]) < 50
    finally:
        again.close()


PANIC_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from backends.base import WriteBatch
from backends.wiredtiger import WiredTigerBackend
from backends.errors import BackendIOError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
b = WiredTigerBackend(Path(sys.argv[1]), cache_bytes=4 << 20)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
def put(key, value, sync):
    wb = WriteBatch()
    wb.put(key, value)
    b.write(wb, sync)
put(b"before", b"1", True)
try:
    put(b"big", b"y" * (2 << 20), False)  # the log write fails: EFBIG, a panic
    error = ""
except BackendIOError as exc:
    error = exc.message
put(b"after", b"2", True)  # on the reopened connection
print(json.dumps({"error": error, "reopens": b.stats()["reopens_after_panic"],
                  "seen": [v is not None for v in b.get_many([b"before", b"big", b"after"])]}))
b.close()
"""


def test_panic_reopens_the_connection(tmp_path: Path) -> None:
    """A log write that fails (EFBIG, even with sync=False) panics WiredTiger: the write
    raises BackendIOError, the next call reopens the connection and goes on."""
    proc = subprocess.run(
        [sys.executable, "-c", PANIC_CHILD, str(tmp_path / "db")],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert "WT_PANIC" in result["error"] and str(tmp_path / "db") in result["error"]
    assert result["reopens"] == 1
    assert result["seen"] == [True, False, True]
    again = WiredTigerBackend(tmp_path / "db")
    try:
        assert again.get_many([b"before", b"big", b"after"]) == [b"1", None, b"2"]
    finally:
        again.close()


def test_direct_io_opens_data_files_with_o_direct(tmp_path: Path) -> None:
    """direct_io=[data] reaches wiredtiger_open (WiredTiger refuses a config key it
    does not know), the data round-trips through a checkpoint and a reopen."""
    backend = WiredTigerBackend(tmp_path / "db", direct_io=True)
    try:
        assert "direct_io=[data]" in backend._config
        assert backend.stats()["direct_io"] == 1
        put_all(backend, [(be8(i), b"x" * 100) for i in range(500)], sync=False)
        backend.flush_buffers()
    finally:
        backend.close()
    again = WiredTigerBackend(tmp_path / "db", direct_io=True)
    try:
        assert again.get_many([be8(0), be8(499)]) == [b"x" * 100] * 2
    finally:
        again.close()
