"""sarp behind the harness interface (tools.bench.sarp_index): ids in as hashes,
first insert wins, a snapshot at flush, a cold recovery in a fresh process, and the
variant without block locators."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tools.bench.sarp_index import SarpBench, as_hashes, no_locators

U64 = np.uint64


def test_as_hashes_zero_extends() -> None:
    h = as_hashes(np.array([5, 2**64 - 1], dtype=U64))
    assert h.shape == (2, 2) and h[:, 0].tolist() == [5, 2**64 - 1] and (h[:, 1] == 0).all()


def test_insert_match_flush_recover(tmp_path: Path) -> None:
    index = SarpBench()
    index.open(tmp_path / "sarp", "rocksdb", 1 << 20)
    a = np.arange(1, 101, dtype=U64)
    b = np.concatenate([a[:70], np.arange(1000, 1010, dtype=U64)])
    try:
        index.insert_many([a], ["x"], [np.full(100, 1, U64)])
        index.insert_many([b, a], ["x", "y"], [np.full(80, 2, U64), np.full(100, 3, U64)])
        got_a, got_b, got_y, none = index.match_many([a, b, a, a], ["x", "x", "y", "z"])
        assert got_a.tolist() == [1] * 100
        assert got_b.tolist() == [1] * 70 + [2] * 10
        assert got_y.tolist() == [3] * 100 and none.tolist() == []
        index.flush()
        assert list((tmp_path / "sarp" / "snapshots").glob("*.snap"))
        assert index.memory_bytes() > 0 and index.disk_bytes() > 0
        assert index.stats()["blocks"] == 100 + 10 + 100  # per namespace
        rec = index.recover()
        assert rec.seconds > 0 and "segments re-routed" in rec.detail
        assert index.match_many([b], ["x"])[0].tolist() == [1] * 70 + [2] * 10
    finally:
        index.close()
    index.close()  # twice is fine


def test_without_block_locators(tmp_path: Path) -> None:
    index = no_locators()
    assert not index.config.block_locators and index.name == "sarp"
    index.open(tmp_path / "nl", "memory", 0)
    try:
        ids = np.arange(1, 41, dtype=U64)
        index.insert_many([ids], [""], [np.arange(40, dtype=U64)])
        assert index.match_many([ids[:30]], [""])[0].tolist() == list(range(30))
    finally:
        index.close()
