"""bloomstore/manifest.py: the snapshot and FLUSH records; lost FLUSH edits are
replayed from the log, a damaged or foreign manifest is refused."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bloomstore import BloomStore
from bloomstore.errors import CorruptionError, FormatError
from bloomstore.manifest import (
    FRAME,
    FlushEdit,
    Manifest,
    PartitionState,
    StoreState,
    apply_flush,
    decode_snapshot,
    encode_snapshot,
)
from bloomstore.pages import PageSpec
from tests.bloomstore.helpers import QUIET, SMALL, assert_same


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


def _state() -> StoreState:
    parts = [PartitionState() for _ in range(SMALL.partitions)]
    state = StoreState(SMALL, wal_gen=3, next_lsn=42, parts=parts)
    apply_flush(parts[1], _edit(1, page=0, offset=0))
    apply_flush(parts[1], _edit(1, page=1, offset=100))
    return state


def _edit(part: int, page: int, offset: int) -> FlushEdit:
    spec = PageSpec(offset, 100, 16, ((1, 2), (5, 9)))
    return FlushEdit(part, gen=1, page=page, spec=spec, flushed_lsn=10 + page, dead=2,
                     tombstones=1, slab_sum=0xABC + page)


def _same(a: StoreState, b: StoreState) -> None:
    assert (a.geometry, a.wal_gen, a.next_lsn) == (b.geometry, b.wal_gen, b.next_lsn)
    for p, q in zip(a.parts, b.parts, strict=True):
        assert (p.gen, p.flushed_lsn, p.entries, p.dead, p.tombstones) == (
            q.gen, q.flushed_lsn, q.entries, q.dead, q.tombstones)
        assert len(p.table) == len(q.table)
        assert [p.table.location(i) for i in range(len(p.table))] == [
            q.table.location(i) for i in range(len(q.table))]
        assert p.table.zone_low.view.tolist() == q.table.zone_low.view.tolist()
        assert p.table.slab_sums.view.tolist() == q.table.slab_sums.view.tolist()


def test_snapshot_and_flush_records_round_trip(tmp_path: Path) -> None:
    state = _state()
    assert state.parts[1].table.end() == 200 and state.parts[1].table.slab_sum(0) == 0xABD
    assert state.parts[1].table.pages_overlapping(6, 7) == [1, 0]  # newest first
    assert state.parts[1].table.pages_overlapping(3, 4) == []
    manifest = Manifest(tmp_path)
    manifest.create(state, fsync=False)
    manifest.append([_edit(2, page=0, offset=0)])
    manifest.sync()
    manifest.close()
    loaded = Manifest(tmp_path)
    got = loaded.load()
    apply_flush(state.parts[2], _edit(2, page=0, offset=0))
    _same(got, state)
    assert loaded.edits == 1 and loaded.bytes_dropped == 0
    loaded.close()


def test_a_flush_that_does_not_follow_is_refused() -> None:
    state = _state()
    with pytest.raises(ValueError, match="page 3 generation 1 does not follow page count 2"):
        apply_flush(state.parts[1], _edit(1, page=3, offset=200))
    with pytest.raises(ValueError, match="page offset 150 is not the file end 200"):
        apply_flush(state.parts[1], _edit(1, page=2, offset=150))


def test_a_foreign_or_newer_manifest_is_refused(tmp_path: Path) -> None:
    body = bytearray(encode_snapshot(_state())[FRAME.size:])
    with pytest.raises(CorruptionError, match="where: magic b'XXXX'"):
        decode_snapshot(memoryview(b"XXXX" + bytes(body[4:])), "where")
    struct.pack_into("<H", body, 4, 2)
    with pytest.raises(FormatError, match=r"manifest format version 2 \(a newer format\)"):
        decode_snapshot(memoryview(bytes(body)), "where")
    with pytest.raises(CorruptionError, match="stray bytes"):
        decode_snapshot(memoryview(encode_snapshot(_state())[FRAME.size:] + b"x"), "where")
    (tmp_path / "MANIFEST").write_bytes(b"\0" * 10)
    with pytest.raises(CorruptionError, match="no valid snapshot record"):
        Manifest(tmp_path).load()
