"""bloomstore/store.py, the engine as a whole (no sarp): real files in tmp dirs, real
processes. Behaviour against a dict across flushes, checkpoints and compactions, RAM
per key, kill -9 at any point, recovery that reads no page, and the open guards. The
parts have their own files (test_chain.py, test_wal.py, ...); the Backend contract of
the adapter is in tests/backends/test_contract.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bloomstore import BloomStore, ConfigError, Geometry, StoreClosedError, StoreLockedError, Tuning
from tests.bloomstore.helpers import QUIET, ROOT, SMALL, apply, assert_same, filled, random_batches


def test_random_ops_match_a_dict_across_flushes_checkpoints_compactions(
        tmp_path: Path) -> None:
    tuning = Tuning(page_bytes=2048, wal_bytes=48 << 10, compact_min_pages=6,
                    dead_ratio=0.4, cache_bytes=64 << 10, fsync=False)
    rng = random.Random(7)
    keyspace = 1500
    model: dict[bytes, bytes] = {}
    store = BloomStore(tmp_path / "db", SMALL, tuning)
    totals = dict.fromkeys(("flushes", "checkpoints", "compactions"), 0)
    for i, (puts, deletes) in enumerate(random_batches(rng, 900, keyspace)):
        store.write(puts, deletes, sync=i % 50 == 0)
        apply(model, puts, deletes)
        if i % 97 == 0:
            lo = b"k%06d" % rng.randrange(keyspace)
            hi = b"k%06d" % rng.randrange(keyspace)
            assert list(store.scan(lo, hi)) == sorted(
                (k, v) for k, v in model.items() if lo <= k < hi)
        if i % 300 == 299:
            stats = store.stats()
            for name in totals:
                totals[name] += int(stats[name])
            store.close()
            store = BloomStore(tmp_path / "db", None, tuning)  # the stored geometry
            assert_same(store, model, keyspace)
    assert_same(store, model, keyspace)
    assert all(count > 0 for count in totals.values()), totals
    assert store.stats()["flush_errors"] == 0
    store.close()


def test_later_operation_wins_and_empty_values(tmp_path: Path) -> None:
    with_store = BloomStore(tmp_path / "db", SMALL, QUIET)
    with_store.write({b"a": b"1", b"b": b"", b"": b"empty key"}, (), sync=True)
    with_store.write({b"a": b"2"}, [b"b"], sync=False)
    with_store.checkpoint()  # everything on pages now
    with_store.write({b"b": b"3"}, [b"a"], sync=False)
    assert with_store.get_many([b"a", b"b", b"", b"c"]) == [None, b"3", b"empty key", None]
    with_store.close()
    again = BloomStore(tmp_path / "db", None, QUIET)
    assert list(again.scan(b"", b"\xff")) == [(b"", b"empty key"), (b"b", b"3")]
    again.close()


def test_ram_per_key_is_reported_and_holds_no_per_key_index(tmp_path: Path) -> None:
    store = filled(tmp_path / "db", Geometry(), 60_000)
    store.checkpoint()
    stats = store.stats()
    assert stats["entries_on_pages"] == 60_000 and stats["buffered_entries"] == 0
    assert 0 < float(stats["ram_bytes_per_key"]) < 1.0
    assert float(stats["index_ram_bytes_per_key"]) < 1.0
    # the filters are on flash (mapped), not in the counted RAM: 16 bits per key
    assert int(stats["chain_mapped_bytes"]) >= 60_000 * 2
    store.close()


CHILD = textwrap.dedent("""
    import sys
    from bloomstore import BloomStore, Geometry, Tuning
    geo = Geometry(partitions=3, keys_per_page=8, bits_per_key=10, hashes=7)
    tuning = Tuning(page_bytes=1024, wal_bytes=16384, compact_min_pages=4, dead_ratio=0.3)
    store = BloomStore(sys.argv[1], geo, tuning)
    first = int(sys.argv[2])
    i = first
    while True:
        puts = {b"b%08d-%d" % (i, j): b"%d" % (i * 10 + j) * (1 + j) for j in range(3)}
        puts[b"last"] = b"%d" % i
        puts[b"hot%d" % (i % 5)] = b"%d" % i
        puts[b"d%08d" % i] = b"x"
        store.write(puts, [b"d%08d" % (i - 1)], sync=True)
        print(i, flush=True)
        i += 1
""")


def _run_and_kill(path: Path, first: int, acks: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(first)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = first - 1
    while acked < first + acks:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"writer died: {proc.communicate()[1]}")
        acked = int(line)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return max([acked, *map(int, rest.split())])


def test_kill_9_during_flushes_checkpoints_and_compactions(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = 0
    for acks in (150, 230):
        acked = _run_and_kill(path, first, acks)
        store = BloomStore(path)
        last = int(store.get_many([b"last"])[0] or b"-1")
        assert last >= acked  # every acknowledged batch, maybe one more
        got = dict(store.scan(b"b", b"c"))
        assert len(got) == 3 * (last + 1)  # a prefix of the batches, each one whole
        for i in range(0, last + 1, 7):
            for j in range(3):
                assert got[b"b%08d-%d" % (i, j)] == b"%d" % (i * 10 + j) * (1 + j)
        assert [k for k, _ in store.scan(b"d", b"e")] == [b"d%08d" % last]
        hot = store.get_many([b"hot%d" % (i % 5) for i in range(last - 4, last + 1)])
        assert hot == [b"%d" % i for i in range(last - 4, last + 1)]
        stats = store.stats()
        assert int(stats["page_reads"]) > 0 and int(stats["pages"]) > 10
        store.close()
        first = last + 1
    # the writer went through log checkpoints and compactions (new file generations)
    assert not (path / "wal-000001.log").exists()
    assert any(int(p.stem.split("-")[1]) > 1 for p in path.glob("*.pages"))


def test_recovery_reads_no_page(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"v%d" % i for i in range(2000)}
    store.write(model, ())
    store.checkpoint()
    store.write({b"k%06d" % i: b"new" for i in range(5)}, [b"k000010"], sync=True)
    pages = sum(store.page_counts())
    store.close()
    store = BloomStore(path, None, QUIET)
    stats = store.stats()
    assert stats["page_reads"] == 0 and stats["pages"] == pages > 100
    assert stats["buffered_entries"] == 6  # replayed from the log
    model.update({b"k%06d" % i: b"new" for i in range(5)})
    del model[b"k000010"]
    assert_same(store, model, 2000)
    store.close()


def test_open_guards(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    with pytest.raises(StoreLockedError, match="already open in this process"):
        BloomStore(tmp_path / "." / "db")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from bloomstore import BloomStore\n"
         "try:\n    BloomStore(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__)",
         str(path)], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert child.stdout.strip() == "StoreLockedError"
    store.close()
    with pytest.raises(StoreClosedError):
        store.get_many([b"a"])
    with pytest.raises(ConfigError, match="geometry"):
        BloomStore(path, Geometry(partitions=5))
    with pytest.raises(ConfigError, match="keys_per_page 0"):
        Geometry(keys_per_page=0)
    BloomStore(path).close()  # the failed opens released the directory
