"""bloomstore/partition.py: one partition's buffer, its flush into pages and filters
(invisible until committed), its candidates and its file names."""

from __future__ import annotations

from pathlib import Path

import pytest

from bloomstore import BloomStore, CorruptionError, Tuning
from bloomstore.filter import digests
from bloomstore.manifest import PartitionState
from bloomstore.partition import ENTRY_OVERHEAD, Partition, file_names
from tests.bloomstore.helpers import QUIET, SMALL


def test_file_names() -> None:
    assert file_names(3, 12) == ("p0003-000012.pages", "p0003-000012.chain")


def test_buffer_accounting_and_when_a_flush_is_due() -> None:
    part = Partition(0, PartitionState(), Path("/nonexistent"), SMALL)  # opens no file
    part.put(b"a", b"12345")
    part.put(b"a", b"1")  # replaced: counted once
    part.put(b"b", None)  # a tombstone
    assert part.buffer_bytes == 3 and part.buffer_ram() == 3 + 2 * ENTRY_OVERHEAD
    assert not part.due(QUIET)
    assert part.due(Tuning(page_bytes=256, fsync=False)) is False
    part.put(b"c", b"x" * 300)
    assert part.due(Tuning(page_bytes=256, fsync=False))  # bytes
    for i in range(SMALL.keys_per_page):
        part.put(b"k%02d" % i, b"")
    assert part.due(QUIET)  # keys


def test_flush_writes_pages_that_commit_makes_visible(tmp_path: Path) -> None:
    part = Partition(1, PartitionState(), tmp_path, SMALL)
    model = {b"k%03d" % i: b"v%d" % i for i in range(40)}
    for key, value in model.items():
        part.put(key, value)
    part.put(b"gone", None)
    edits = part.write_buffer(lsn=7, tuning=QUIET)
    assert len(edits) == 3  # 41 entries, at most 16 keys per page
    assert [e.page for e in edits] == [0, 1, 2] and edits[-1].flushed_lsn == 7
    assert edits[0].flushed_lsn == 0  # only the last page moves the flushed lsn
    assert len(part.state.table) == 0 and part.buffer  # nothing visible yet
    part.commit(edits)
    assert len(part.state.table) == 3 and not part.buffer and part.buffer_bytes == 0
    assert part.state.entries == 41 and part.state.tombstones == 1
    pages = [part.read_page(page).keys() for page in range(3)]
    assert [k for page in pages for k in page] == sorted([*model, b"gone"])
    lo, hi = digests(list(model))
    for key, cands in zip(model, part.candidates(lo, hi), strict=True):
        holder = next(p for p, keys in enumerate(pages) if key in keys)
        assert holder in cands
    assert (tmp_path / "p0001-000001.pages").exists()
    part.close()


def test_no_chain_no_candidates() -> None:
    part = Partition(0, PartitionState(), Path("/nonexistent"), SMALL)
    lo, hi = digests([b"a", b"b"])
    assert part.candidates(lo, hi) == [[], []]
    assert part.dead_ratio() == 0.0


def test_a_missing_page_file_is_corruption(tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "db", SMALL, QUIET)
    store.write({b"k%03d" % i: b"v" for i in range(100)})
    store.checkpoint()
    store.close()
    victim = sorted((tmp_path / "db").glob("p0002-*.pages"))[0]
    victim.unlink()
    with pytest.raises(CorruptionError, match=rf"{victim.name}: missing \(the manifest lists"):
        BloomStore(tmp_path / "db", None, QUIET)
