"""bloomstore/scan.py: ordered range scans merge buffers and pages; a b"L" scan
after a snapshot reads only the recent pages (zone map)."""

from __future__ import annotations

import random
from pathlib import Path

from bloomstore import (
    BloomStore,
    Tuning,
)
from tests.bloomstore.helpers import (
    SMALL,
    be8,
)


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
