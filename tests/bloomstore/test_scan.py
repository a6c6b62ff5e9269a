"""bloomstore/scan.py: ordered range scans merge buffers and pages; a b"L" scan
after a snapshot reads only the recent pages (zone map)."""

from __future__ import annotations

import random
from pathlib import Path

from bloomstore import BloomStore, Tuning
from tests.bloomstore.helpers import QUIET, SMALL, be8


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


def test_scan_merges_buffers_and_pages_newest_version_first(tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "db", SMALL, QUIET)
    store.write({b"k%03d" % i: b"old" for i in range(100)})
    store.checkpoint()  # every version "old" on pages
    store.write({b"k%03d" % i: b"new" for i in range(0, 100, 3)},
                [b"k%03d" % i for i in range(1, 100, 3)])  # in the buffers
    got = dict(store.scan(b"k010", b"k020"))
    assert got == {b"k%03d" % i: b"new" if i % 3 == 0 else b"old"
                   for i in range(10, 20) if i % 3 != 1}
    assert list(got) == sorted(got)
    store.close()


def test_a_scan_sees_the_store_as_of_its_first_step(tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "db", SMALL, QUIET)
    store.write({b"a": b"1", b"b": b"2", b"c": b"3"})
    store.checkpoint()
    scan = store.scan(b"", b"\xff")
    assert next(scan) == (b"a", b"1")
    store.write({b"b": b"changed", b"bb": b"new"}, [b"c"])
    store.compact()  # even a new file generation under the scan
    assert list(scan) == [(b"b", b"2"), (b"c", b"3")]
    assert list(store.scan(b"", b"\xff")) == [(b"a", b"1"), (b"b", b"changed"), (b"bb", b"new")]
    store.close()
