"""bloomstore/filter.py: key hashing (partition, bit positions, zone prefixes), and
the false-positive rate it gives a store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from bloomstore import Geometry
from bloomstore.filter import digests, filter_words, partitions_of, positions, prefix8
from tests.bloomstore.helpers import filled


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


def test_digests_are_deterministic_halves_of_xxh3_128() -> None:
    lo, hi = digests([b"a", b"b", b"a"])
    assert lo.dtype == hi.dtype == np.uint64
    assert lo[0] == lo[2] and hi[0] == hi[2] and lo[0] != lo[1]
    raw = xxhash.xxh3_128_intdigest(b"a")
    assert (int(hi[0]), int(lo[0])) == (raw >> 64, raw & (2**64 - 1))
    empty_lo, empty_hi = digests([])
    assert empty_lo.size == empty_hi.size == 0


def test_partitions_and_positions_stay_in_range_and_spread() -> None:
    keys = [b"key%05d" % i for i in range(20_000)]
    lo, hi = digests(keys)
    parts = partitions_of(hi, 7)
    assert parts.min() == 0 and parts.max() == 6
    counts = np.bincount(parts, minlength=7)
    assert counts.min() > 0.9 * len(keys) / 7  # multiply-shift spreads evenly
    pos = positions(lo, hi, 5, 1000)
    assert pos.shape == (20_000, 5) and pos.min() >= 0 and pos.max() < 1000
    assert len({tuple(row) for row in pos[:100].tolist()}) == 100


def test_filter_words_hold_exactly_the_bits_of_their_keys() -> None:
    lo, hi = digests([b"x", b"y"])
    pos = positions(lo, hi, 4, 256)
    words = filter_words(pos, 256)
    assert words.shape == (4,)
    bits = {j for j in range(256) if int(words[j >> 6]) >> (j & 63) & 1}
    assert bits == set(pos.ravel().tolist())


@given(st.binary(max_size=12), st.binary(max_size=12))
def test_prefix8_is_monotone_in_key_order(a: bytes, b: bytes) -> None:
    if a <= b:
        assert prefix8(a) <= prefix8(b)
    assert prefix8(a) == int.from_bytes(a[:8].ljust(8, b"\0"), "big")
