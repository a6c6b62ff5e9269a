"""The BloomStore engine on its own (no sarp): real files in tmp dirs, real processes.

Small geometries (few keys per page, few partitions) make every run cross many page
flushes, log checkpoints and compactions. The Backend contract of the adapter is in
test_backend_contract.py (it runs over every registered backend).
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

from bloomstore import (
    BloomStore,
    ConfigError,
    CorruptionError,
    Geometry,
    StoreClosedError,
    StoreLockedError,
    Tuning,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = Geometry(partitions=4, keys_per_page=16, bits_per_key=10, hashes=7)
# no automatic checkpoint or compaction unless a test asks for them
QUIET = Tuning(page_bytes=4096, wal_bytes=1 << 30, compact_min_pages=0, fsync=False)


def be8(i: int) -> bytes:
    return i.to_bytes(8, "big")


def random_batches(rng: random.Random, n: int, keyspace: int) -> list[tuple[dict[bytes, bytes],
                                                                              set[bytes]]]:
    out = []
    for _ in range(n):
        puts: dict[bytes, bytes] = {}
        deletes: set[bytes] = set()
        for _ in range(rng.randint(1, 12)):
            key = b"k%06d" % rng.randrange(keyspace)
            if rng.random() < 0.2:
                deletes.add(key)
                puts.pop(key, None)
            else:
                puts[key] = rng.randbytes(rng.randint(0, 60))
                deletes.discard(key)
        out.append((puts, deletes))
    return out


def apply(model: dict[bytes, bytes], puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
    for key in deletes:
        model.pop(key, None)
    model.update(puts)


def assert_same(store: BloomStore, model: dict[bytes, bytes], keyspace: int) -> None:
    keys = [b"k%06d" % i for i in range(keyspace)]
    assert store.get_many(keys) == [model.get(k) for k in keys]
    assert list(store.scan(b"", b"\xff")) == sorted(model.items())


# --- behaviour against a dict -----------------------------------------------------------


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


# --- the bit-sliced chain ---------------------------------------------------------------


def _filled(path: Path, geometry: Geometry, keys: int) -> BloomStore:
    store = BloomStore(path, geometry, QUIET)
    for start in range(0, keys, 500):
        store.write({b"key%07d" % i: b"v%d" % i for i in range(start, min(keys, start + 500))})
    return store


def test_chain_candidates_are_a_superset_of_the_true_pages_newest_first(
        tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "db", SMALL, QUIET)
    rng = random.Random(3)
    for _ in range(600):  # overwrites spread versions of a key over several pages
        store.write({b"x%04d" % rng.randrange(800): rng.randbytes(8) for _ in range(10)})
    counts = store.page_counts()
    assert min(counts) > 64  # more than one 64-filter slab per chain
    holders: dict[bytes, list[int]] = {}
    for part, count in enumerate(counts):
        for page in range(count):
            for key in store.page_keys(part, page):
                holders.setdefault(key, []).append(page)
    assert len(holders) > 500
    for key, pages in holders.items():
        cands = store.candidate_pages(key)
        assert set(pages) <= set(cands)
        assert cands == sorted(cands, reverse=True)
    store.close()


def test_false_positive_rate_is_near_the_configured_target(tmp_path: Path) -> None:
    geometry = Geometry(partitions=2, keys_per_page=64, bits_per_key=8, hashes=6)
    store = _filled(tmp_path / "db", geometry, 64 * 2 * 70)
    absent = [b"absent%07d" % i for i in range(3000)]
    assert store.get_many(absent) == [None] * 3000
    stats = store.stats()
    target = float(stats["target_fp_rate"])
    assert 0.02 < target < 0.025
    assert 0.6 * target < float(stats["false_positive_rate"]) < 1.5 * target
    # each absent key tests ~70 filters: that many times the rate in extra page reads
    extra = float(stats["extra_page_reads_per_lookup"])
    assert 0.6 * 70 * target < extra < 1.5 * 70 * target
    present = [b"key%07d" % i for i in range(0, 64 * 2 * 70, 7)]
    assert store.get_many(present) == [b"v%d" % int(k[3:]) for k in present]
    store.close()


def test_ram_per_key_is_reported_and_holds_no_per_key_index(tmp_path: Path) -> None:
    store = _filled(tmp_path / "db", Geometry(), 60_000)
    store.checkpoint()
    stats = store.stats()
    assert stats["entries_on_pages"] == 60_000 and stats["buffered_entries"] == 0
    assert 0 < float(stats["ram_bytes_per_key"]) < 1.0
    assert float(stats["index_ram_bytes_per_key"]) < 1.0
    # the filters are on flash (mapped), not in the counted RAM: 16 bits per key
    assert int(stats["chain_mapped_bytes"]) >= 60_000 * 2
    store.close()


# --- compaction -------------------------------------------------------------------------


def test_compaction_keeps_every_live_key_and_reduces_disk(tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "db", SMALL, QUIET)
    model: dict[bytes, bytes] = {}
    for round_ in range(6):
        puts = {b"k%06d" % i: b"r%d-%d" % (round_, i) for i in range(round_ * 37, 400)}
        deletes = {b"k%06d" % i for i in range(round_ * 50, round_ * 50 + 25)}
        for key in deletes:
            puts.pop(key, None)
        store.write(puts, deletes)
        apply(model, puts, deletes)
    store.checkpoint()
    before = store.stats()
    results = store.compact()
    after = store.stats()
    assert len(results) == SMALL.partitions
    assert int(after["disk_bytes"]) < int(before["disk_bytes"]) // 2
    assert int(after["pages"]) < int(before["pages"])
    assert after["entries_on_pages"] == len(model)
    assert after["tombstones_on_pages"] == 0 and after["dead_estimate"] == 0
    assert_same(store, model, 400)
    store.close()
    again = BloomStore(tmp_path / "db", None, QUIET)
    assert_same(again, model, 400)
    assert sorted(p.name for p in (tmp_path / "db").glob("*.pages")) == [
        f"p{i:04d}-000002.pages" for i in range(SMALL.partitions)]
    again.close()


def test_dead_ratio_triggers_compaction(tmp_path: Path) -> None:
    tuning = Tuning(page_bytes=4096, compact_min_pages=4, dead_ratio=0.5, fsync=False)
    store = BloomStore(tmp_path / "db", SMALL, tuning)
    for round_ in range(40):  # the same 100 keys again and again
        store.write({b"hot%03d" % i: b"%d" % round_ for i in range(100)})
    stats = store.stats()
    assert int(stats["compactions"]) > 0
    assert int(stats["pages"]) < 40 * 100 // SMALL.keys_per_page // 2
    assert store.get_many([b"hot%03d" % i for i in range(100)]) == [b"39"] * 100
    store.close()


# --- crash safety -----------------------------------------------------------------------


def _wal(path: Path) -> Path:
    [wal] = path.glob("wal-*.log")
    return wal


def test_torn_log_tail_is_ignored_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    for i in range(10):
        store.write({b"batch%02d" % i: b"x" * 100, b"last": b"%d" % i}, (), sync=True)
    store.close()
    wal = _wal(path)
    with wal.open("r+b") as fh:  # tear the last record
        fh.truncate(wal.stat().st_size - 30)
    with wal.open("ab") as fh:  # and leave garbage after it
        fh.write(os.urandom(200))
    store = BloomStore(path, None, QUIET)
    assert store.get_many([b"last", b"batch08", b"batch09"]) == [b"8", b"x" * 100, None]
    store.write({b"after": b"1"}, (), sync=True)  # appended after the cut
    store.close()
    store = BloomStore(path, None, QUIET)
    assert store.get_many([b"last", b"after", b"batch09"]) == [b"8", b"1", None]
    store.close()


def test_lost_manifest_edits_are_replayed_from_the_log(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"v%d" % i for i in range(600)}
    store.write(model, (), sync=True)  # flushes many pages: FLUSH edits after the snapshot
    assert sum(store.page_counts()) > 20
    store.close()
    manifest = path / "MANIFEST"
    with manifest.open("r+b") as fh:
        fh.truncate(manifest.stat().st_size - 500)
    store = BloomStore(path, None, QUIET)
    assert_same(store, model, 600)
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


# --- corruption and recovery cost -------------------------------------------------------


def test_corrupt_page_is_detected_never_served(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"value %d" % i for i in range(300)}
    store.write(model, ())
    store.checkpoint()
    store.close()
    victim = sorted(path.glob("p0001-*.pages"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    store = BloomStore(path, None, Tuning(cache_bytes=0, fsync=False))  # opens: no page read
    errors = 0
    for key, value in model.items():
        try:
            assert store.get_many([key]) == [value]
        except CorruptionError as exc:
            assert str(victim) in str(exc)
            errors += 1
    assert 0 < errors < len(model)
    with pytest.raises(CorruptionError):
        list(store.scan(b"", b"\xff"))
    store.close()


def test_chain_bits_are_checksummed_but_uncommitted_columns_ignored(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"v%d" % i for i in range(300)}
    store.write(model, ())
    store.checkpoint()
    length = store.page_counts()[2]
    store.close()
    chain = sorted(path.glob("p0002-*.chain"))[0]
    words = bytearray(chain.read_bytes())
    # a flush that crashed before its manifest edit: bits in column `length` (< 64)
    for j in range(0, len(words), 8 * 3):
        words[j + length // 8] |= 1 << (length % 8)
    chain.write_bytes(bytes(words))
    store = BloomStore(path, None, QUIET)
    assert_same(store, model, 300)
    store.close()
    # a flipped bit of a committed filter: detected, never read as "absent"
    words[8 * 5] ^= 1
    chain.write_bytes(bytes(words))
    store = BloomStore(path, None, QUIET)
    in_two = [k for k in model if store.partition_of(k) == 2]
    with pytest.raises(CorruptionError, match="slab 0"):
        store.get_many(in_two[:1])
    other = [k for k in model if store.partition_of(k) != 2]
    assert store.get_many(other) == [model[k] for k in other]
    store.close()


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


def test_log_range_scan_reads_only_recent_pages(tmp_path: Path) -> None:
    """sarp's change log: b"L" + growing versions among random block keys."""
    store = BloomStore(tmp_path / "db", SMALL, Tuning(cache_bytes=0, compact_min_pages=0,
                                                      fsync=False))
    rng = random.Random(5)
    for v in range(3000):
        store.write({b"L" + be8(v): be8(v), b"B" + rng.randbytes(16): b"m" * 12})
    pages = sum(store.page_counts())
    before = int(store.stats()["page_reads"])
    recent = list(store.scan(b"L" + be8(2900), b"L" + b"\xff" * 8))
    assert [int.from_bytes(k[1:], "big") for k, _ in recent] == list(range(2900, 3000))
    assert int(store.stats()["page_reads"]) - before < pages // 10
    assert len(list(store.scan(b"L", b"M"))) == 3000
    store.close()


# --- opening ----------------------------------------------------------------------------


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
