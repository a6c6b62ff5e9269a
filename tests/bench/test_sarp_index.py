"""sarp behind the harness interface (tools.bench.sarp_index): ids in as hashes,
first insert wins, a snapshot at flush, a cold recovery in a fresh process, and the
variant without block locators."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.bench.sarp_index import (
    SarpBench,
    as_hashes,
    as_hashes_many,
    no_locators,
    reference,
    segment_bytes,
)
from tools.bench.sarp_recover import OWN_CACHE_SHARE, split_budget

U64 = np.uint64


def test_as_hashes_zero_extends() -> None:
    h = as_hashes(np.array([5, 2**64 - 1], dtype=U64))
    assert h.shape == (2, 2) and h[:, 0].tolist() == [5, 2**64 - 1] and (h[:, 1] == 0).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=5), max_size=6))
def test_as_hashes_many_is_as_hashes_of_each(batch: list[list[int]]) -> None:
    prompts = [np.array(p, dtype=U64) for p in batch]  # empty prompts and batches too
    got = as_hashes_many(prompts)
    assert len(got) == len(prompts)
    for g, p in zip(got, prompts, strict=True):
        assert g.shape == (len(p), 2) and g.tolist() == as_hashes(p).tolist()


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


def test_memory_counts_the_engine_and_the_decoded_segments(tmp_path: Path) -> None:
    """memory_bytes = engine memory + decoded segments (within their share of the
    budget); routing_bytes = the directory; backend_reads = segments fetched."""
    budget = 1 << 20
    index = SarpBench()
    index.open(tmp_path / "sarp", "rocksdb", budget, direct_io=True)
    try:
        ix = index.ix
        assert ix is not None and ix.backend.direct_io
        assert ix.store.cache_segments == split_budget(budget)[1]
        assert ix.backend.stats()["cache_bytes_configured"] == split_budget(budget)[0]
        seqs = [np.arange(1 + 10_000 * i, 1 + 10_000 * i + 640, dtype=U64) for i in range(60)]
        index.insert_many(seqs, [""] * 60, [np.ones(640, U64)] * 60)
        index.flush()
        cached = segment_bytes(ix)
        assert 0 < cached <= budget * OWN_CACHE_SHARE
        engine = int(ix.backend.stats()["memory_bytes"])
        assert ix.store.blockmap is not None and 0 < ix.store.blockmap.nbytes <= budget // 10
        assert index.memory_bytes() == (engine + cached + ix.store.blockmap.nbytes
                                        + ix.store.pending_bytes)
        assert index.routing_bytes() == ix.dir.nbytes > 0
        index.recover()  # a reopen: the cache is empty, reads come from the backend
        before = index.backend_reads()
        assert index.match_many(seqs[:2], ["", ""])[0].tolist() == [1] * 640
        assert index.backend_reads() - before >= 20  # 10 segments per sequence
    finally:
        index.close()


def test_sarp_py_runs_the_references_and_answers_what_sarp_answers(tmp_path: Path) -> None:
    seqs = [np.arange(1, 300, dtype=U64), np.concatenate([np.arange(1, 150, dtype=U64),
                                                          np.arange(5000, 5100, dtype=U64)])]
    got = []
    for index in (SarpBench(), reference()):
        index.open(tmp_path / str(index.reference), "rocksdb", 1 << 20)
        try:
            index.insert_many(seqs, ["", ""], [np.full(len(s), i + 1, U64)
                                               for i, s in enumerate(seqs)])
            got.append([m.tolist() for m in index.match_many([*seqs, seqs[0][:70]], [""] * 3)])
            if index.reference:
                assert index.native() == {"match": False, "hash": False, "write": False}
                assert index.stats()["verifier"] == "numpy"
                assert index.recover().seconds > 0  # its recovery child runs the references
        finally:
            index.close()
    assert got[0] == got[1] and got[0][2] == [1] * 70


def test_bare_reread_reads_what_the_match_read(tmp_path: Path) -> None:
    index = SarpBench()
    index.open(tmp_path / "s", "rocksdb", 1 << 20)
    try:
        seq = np.arange(1, 200, dtype=U64)
        index.insert_many([seq], [""], [np.ones(199, U64)])
        index.match_many([seq], [""])
        keys = index._read.keys()
        assert len([k for k in keys if k[:1] == b"S"]) == 4  # 199 blocks: 4 segments
        assert index.bare_reread() > 0
        assert type(index.ix.store).fetch is index.ix.store.fetch.__func__  # type: ignore[union-attr]
    finally:
        index.close()
