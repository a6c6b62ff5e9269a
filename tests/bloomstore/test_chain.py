"""bloomstore/chain.py: the bit-sliced Bloom-filter chain: candidates are a superset
of the pages holding a key, newest first; committed bits are checksummed, the
columns of a crashed flush are ignored."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bloomstore import BloomStore, CorruptionError
from tests.bloomstore.helpers import QUIET, SMALL, assert_same


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
