"""bloomstore/filter.py: key hashing (partition, bit positions, zone prefixes), and
the false-positive rate it gives a store."""

from __future__ import annotations

from pathlib import Path

from bloomstore import (
    Geometry,
)
from tests.bloomstore.helpers import (
    filled,
)


def test_false_positive_rate_is_near_the_configured_target(tmp_path: Path) -> None:
    geometry = Geometry(partitions=2, keys_per_page=64, bits_per_key=8, hashes=6)
    store = filled(tmp_path / "db", geometry, 64 * 2 * 70)
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
