"""bloomstore/compact.py: compaction keeps every live key, drops the dead ones and
the old file generation; a partition's dead ratio triggers it."""

from __future__ import annotations

from pathlib import Path

from bloomstore import BloomStore, Tuning
from tests.bloomstore.helpers import QUIET, SMALL, apply, assert_same


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
