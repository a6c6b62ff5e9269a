"""RocksDBBackend (backends/rocksdb.py): what the cross-backend contract
(tests/backends/test_contract.py) does not show: table options kept on reopen, the
memory budget binding (memtables and index/filter partitions inside it), partitions
not read at open, one open per directory, refused directories (a file, rocksdict's
pickle mode), a bad tunable, the sync flag reaching the WAL, and resume() after a
failed write."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import rocksdict

from backends.base import WriteBatch
from backends.errors import BackendConfigError, BackendIOError
from backends.rocksdb import (
    BLOOM_BITS_PER_KEY,
    MIN_CACHE_BYTES,
    WRITE_BUFFERS,
    RocksDBBackend,
    block_cache_bytes,
    memtable_limit_bytes,
    read_table_options,
    write_buffer_bytes,
)
from tests.backends.helpers import batch_of, be8, put_all

ROOT = Path(__file__).resolve().parents[2]


def test_rocksdb_reopen_keeps_table_options(tmp_path: Path) -> None:
    """The gotcha: a reopen without column_families={"default": opts} silently loads the
    stored OPTIONS (8 MiB cache, no bloom filter)."""
    path = tmp_path / "db"
    first = RocksDBBackend(path, cache_bytes=3 << 20)
    put_all(first, [(b"S" + be8(i), b"v" * 100) for i in range(2000)], sync=False)
    assert first.stats()["block_cache_bytes"] == block_cache_bytes(3 << 20)
    first.close()  # flushes: the reads below go to an SST file with its filter

    again = RocksDBBackend(path, cache_bytes=5 << 20, statistics=True)
    try:
        assert again.stats()["block_cache_bytes"] == block_cache_bytes(5 << 20)
        table = read_table_options(path)
        assert table["filter_policy"] == "bloomfilter"
        assert table["no_block_cache"] == "false"
        assert table["cache_index_and_filter_blocks"] == "true"
        assert table["partition_filters"] == "true"
        misses = [b"S" + be8(i) + b"?" for i in range(300)]
        assert again.get_many(misses) == [None] * 300
        assert int(again.stats()["bloom_useful"]) > 250  # the filter answered
        assert again.get_many([b"S" + be8(5)]) == [b"v" * 100]
    finally:
        again.close()


def test_rocksdb_second_open_in_process_is_refused(tmp_path: Path) -> None:
    first = RocksDBBackend(tmp_path / "db")
    with pytest.raises(BackendIOError, match="already open in this process"):
        RocksDBBackend(tmp_path / "." / "db")
    first.close()
    RocksDBBackend(tmp_path / "db").close()


def test_rocksdb_close_during_scan_releases_directory(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path / "db")
    put_all(backend, [(b"S" + be8(i), b"v") for i in range(10)], sync=False)
    scan = backend.scan(b"S", b"T")
    assert next(scan)[0] == b"S" + be8(0)
    backend.close()
    with pytest.raises(BackendIOError, match="closed during a scan"):
        next(scan)
    again = RocksDBBackend(tmp_path / "db")  # the iterator no longer pins the DB
    assert len(list(again.scan(b"S", b"T"))) == 10
    again.close()


def test_rocksdb_bad_directories(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_bytes(b"not a directory")
    with pytest.raises(BackendIOError, match=str(a_file)):
        RocksDBBackend(a_file)
    pickled = rocksdict.Rdict(str(tmp_path / "pickle"))  # rocksdict's default mode
    pickled["k"] = "v"
    pickled.close()
    for _ in range(2):  # the failed open released its claim on the directory
        with pytest.raises(BackendIOError, match="pickle mode"):
            RocksDBBackend(tmp_path / "pickle")
    with pytest.raises(BackendConfigError, match="-1"):
        RocksDBBackend(tmp_path / "neg", cache_bytes=-1)
    with pytest.raises(BackendConfigError, match=f"{MIN_CACHE_BYTES - 1} .*{MIN_CACHE_BYTES}"):
        RocksDBBackend(tmp_path / "small", cache_bytes=MIN_CACHE_BYTES - 1)
    RocksDBBackend(tmp_path / "least", cache_bytes=MIN_CACHE_BYTES).close()


def test_rocksdb_sync_flag_reaches_the_wal(tmp_path: Path) -> None:
    """kill -9 cannot tell a synced WAL from one in the page cache; RocksDB's own
    counter of WAL syncs can."""
    backend = RocksDBBackend(tmp_path / "db", statistics=True)
    try:

        def syncs() -> int:
            return int(backend.stats()["wal_syncs"])

        base = syncs()
        for i in range(3):
            backend.write(batch_of({be8(i): b"v"}), sync=False)
        assert syncs() == base
        backend.write(batch_of({b"s": b"v"}), sync=True)
        assert syncs() == base + 1
        backend.write(WriteBatch(), sync=True)  # an empty batch still syncs what came before
        backend.sync()
        assert syncs() == base + 3
    finally:
        backend.close()


RESUME_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from backends.base import WriteBatch
from backends.errors import BackendIOError
from backends.rocksdb import RocksDBBackend
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of a signal
b = RocksDBBackend(Path(sys.argv[1]), cache_bytes=4 << 20)
def put(key, value):
    wb = WriteBatch()
    wb.put(key, value)
    b.write(wb, True)
put(b"before", b"1")
b.resume()  # nothing failed: a no-op
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
out = {}
try:
    put(b"big", b"y" * (2 << 20))
except BackendIOError as exc:
    out["write"] = exc.message
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
b.resume()  # the disk has room again: reopen
put(b"after", b"2")
out["seen"] = [v is not None for v in b.get_many([b"before", b"after"])]
print(json.dumps(out))
b.close()
"""


def test_resume_after_a_failed_write_makes_writes_work_again(tmp_path: Path) -> None:
    """A write that fails (EFBIG under RLIMIT_FSIZE, in a child process) raises
    BackendIOError naming the directory; once there is room, resume() reopens the
    database and the next write succeeds."""
    proc = subprocess.run(
        [sys.executable, "-c", RESUME_CHILD, str(tmp_path / "db")],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert str(tmp_path / "db") in result["write"] and "write of" in result["write"]
    assert result["seen"] == [True, True]
    again = RocksDBBackend(tmp_path / "db")
    try:
        assert again.get_many([b"before", b"after"]) == [b"1", b"2"]
    finally:
        again.close()


def _db_options(path: Path, section: str = "[DBOptions]") -> dict[str, str]:
    """One section of the newest OPTIONS file RocksDB wrote in `path`."""
    files = sorted(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    out: dict[str, str] = {}
    current = ""
    for line in files[-1].read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line
        elif current == section and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("direct", [True, False])
def test_direct_io_sets_use_direct_reads(tmp_path: Path, direct: bool) -> None:
    """What RocksDB recorded for the open: direct reads exactly when asked for."""
    db = RocksDBBackend(tmp_path / "db", cache_bytes=1 << 20, direct_io=direct)
    try:
        opts = _db_options(tmp_path / "db")
        assert opts["use_direct_reads"] == str(direct).lower()
        assert db.stats()["direct_io"] == int(direct)
    finally:
        db.close()


@pytest.mark.parametrize(("budget", "buffer"), [(MIN_CACHE_BYTES, 64 << 10),
                                                 (4 << 20, 512 << 10), (1 << 30, 64 << 20)])
def test_a_new_store_records_partitioned_metadata_and_budgeted_memtables(
        tmp_path: Path, budget: int, buffer: int) -> None:
    """What RocksDB recorded for the open: a two-level index and partitioned filters in
    the cache (top level pinned), and WRITE_BUFFERS memtables of a quarter of the budget
    between them, within RocksDB's 64 KiB floor and its 64 MiB default; the block cache
    gets the rest of the budget."""
    db = RocksDBBackend(tmp_path / "db", cache_bytes=budget)
    try:
        table = read_table_options(tmp_path / "db")
        assert table["index_type"] == "kTwoLevelIndexSearch"
        assert table["partition_filters"] == "true"
        assert table["metadata_block_size"] == "4096"
        assert table["cache_index_and_filter_blocks"] == "true"
        assert table["pin_top_level_index_and_filter"] == "true"
        cf = _db_options(tmp_path / "db", '[CFOptions "default"]')
        assert int(cf["write_buffer_size"]) == write_buffer_bytes(budget) == buffer
        assert int(cf["max_write_buffer_number"]) == WRITE_BUFFERS == 2
        stats = {k: v for k, v in db.stats().items() if isinstance(v, int)}
        assert stats["cache_bytes_configured"] == budget
        assert stats["block_cache_bytes"] + stats["memtable_limit_bytes"] == budget
        assert stats["memtable_limit_bytes"] == int(2 * buffer * (1 + 0.6 / 8))
    finally:
        db.close()


def test_memory_stays_within_the_budget_under_writes(tmp_path: Path) -> None:
    """Writes of 12x the budget, in batches much smaller than a write buffer, with reads
    that fill the block cache: the memtables are flushed when full, so they stay within
    their limit, the cache within the rest, and memory_bytes within the budget but the
    table readers (outside the cache, RocksDB's own: a few KB per table file)."""
    budget = 4 << 20
    db = RocksDBBackend(tmp_path / "db", cache_bytes=budget)
    rng = random.Random(12)
    value = os.urandom(1000)
    keys: list[bytes] = []
    written = 0
    peak: dict[str, int] = {}
    try:
        while written < 12 * budget:
            for _ in range(4):
                batch = WriteBatch()
                for _ in range(64):
                    key = rng.getrandbits(64).to_bytes(8, "big")
                    batch.put(key, value[: rng.randrange(200, 1000)])
                    keys.append(key)
                    written += 8 + len(batch.puts[key])
                db.write(batch, sync=False)
            assert all(v is not None for v in db.get_many(rng.sample(keys, 64)))
            stats = {k: int(v) for k, v in db.stats().items() if isinstance(v, int)}
            assert stats["memory_bytes"] == (stats["block_cache_usage"] + stats["memtable_bytes"]
                                             + stats["table_readers_bytes"])
            for k in ("memory_bytes", "block_cache_usage", "memtable_bytes",
                      "table_readers_bytes"):
                peak[k] = max(peak.get(k, 0), stats[k])
        assert int(db.stats()["sst_bytes"]) > 2 * budget  # the memtables were flushed
    finally:
        db.close()
    cache, memtables = block_cache_bytes(budget), memtable_limit_bytes(budget)
    assert 0.9 * cache < peak["block_cache_usage"] <= cache, peak  # full: it bound
    assert 0.5 * memtables < peak["memtable_bytes"] <= memtables, peak
    assert peak["table_readers_bytes"] < 64 << 10, peak
    assert peak["memory_bytes"] <= budget + peak["table_readers_bytes"], peak


def test_a_fresh_open_reads_no_filter_or_index_partition(tmp_path: Path) -> None:
    """A store of 300k keys reopened: the table readers and the cache hold the top-level
    index and filter blocks only, not the 10 bits per key of the filters (366 KiB, which
    unpartitioned filters held in the table readers from the open); a get then reads
    partitions into the cache."""
    n = 300_000
    path = tmp_path / "db"
    first = RocksDBBackend(path, cache_bytes=8 << 20)
    assert first.ingest((be8(i), b"v" * 16) for i in range(n)) == n
    first.close()
    filters = n * BLOOM_BITS_PER_KEY // 8
    again = RocksDBBackend(path, cache_bytes=8 << 20)
    try:
        opened = again.stats()
        assert int(opened["estimate_num_keys"]) == n
        assert int(opened["table_readers_bytes"]) + int(opened["block_cache_usage"]) \
            < filters / 10, opened
        assert again.get_many([be8(7), be8(n + 7)]) == [b"v" * 16, None]
        assert int(again.stats()["block_cache_usage"]) > int(opened["block_cache_usage"])
    finally:
        again.close()
