"""`check` (sarpd/core/fsck.py): each kind of problem is found, reported naming what
is wrong, changed only with `fix`, and fixed so that a second check is clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from backends.base import WriteBatch
from backends.errors import BackendCorrupt
from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core.delta import delta_key
from sarpd.core.index import SarpIndex
from sarpd.core.segment import (
    COUNTERS_KEY,
    SEG_PREFIX,
    Counters,
    decode_segment,
    encode_segment,
    seg_key,
)
from sarpd.core.snapshot import list_snapshots
from sarpd.model import Insert, Match, SeqSpec

CFG = IndexConfig()


def seqs(n: int = 4) -> list[SeqSpec]:
    rng = np.random.default_rng(8)
    return [SeqSpec("", tokens=rng.integers(0, 1 << 30, 16 * 70).astype(np.uint32))
            for _ in range(n)]


def index(tmp_path: Path, backend: MemoryBackend | None = None) -> SarpIndex:
    ix = SarpIndex(backend or MemoryBackend(), CFG, tmp_path / "snap")
    ix.recover()
    if backend is None:
        ix.write_many([Insert(i, s, meta=i) for i, s in enumerate(seqs())])
    return ix


def head(ix: SarpIndex, sid: int) -> int:
    seg = ix.store.fetch([sid])[sid]
    assert seg is not None
    return int(seg.ids[0, 0])


def test_a_clean_index_is_clean(tmp_path: Path) -> None:
    report = index(tmp_path).check()
    assert report.clean and report.segments == 8 and report.routing_points > 0


def test_a_corrupt_segment_is_deleted(tmp_path: Path) -> None:
    ix = index(tmp_path)
    value = ix.backend.get_many([seg_key(3)])[0]
    assert value is not None
    wb = WriteBatch()
    wb.put(seg_key(3), value[:-8])
    ix.backend.write(wb, True)
    report = ix.check()
    assert report.problems[0].startswith("segment 3: segment 3: nblocks")
    assert ix.backend.get_many([seg_key(3)])[0] is not None  # check alone changes nothing
    # its directory entries point at a segment check cannot read, and the counters
    # are short by one once it is gone: all fixed together
    fixed = ix.check(fix=True)
    assert fixed.fixed >= 2
    assert ix.backend.get_many([seg_key(3)])[0] is None
    assert ix.check().clean and ix.counters.segments == 7


def test_an_unrouted_segment_is_registered(tmp_path: Path) -> None:
    ix = index(tmp_path)
    assert ix.dir.drop(head(ix, 2), 2)
    assert ix.check().problems == ["segment 2 (window 1) is not routed"]
    assert ix.check(fix=True).fixed == 1
    assert ix.check().clean and ix.dir.has(head(ix, 2), 2)
    [r] = ix.match_many([Match(0, seqs()[0])])  # segments 1 and 2: its windows 0 and 1
    assert r.blocks == 70  # type: ignore[union-attr]


def test_bad_directory_entries_are_dropped(tmp_path: Path) -> None:
    ix = index(tmp_path)
    ix.dir.add(head(ix, 1), 999, 0)
    ix.dir.add(0x1234, 1, 0)
    problems = ix.check().problems
    assert f"routing key {head(ix, 1):016x} points at missing segment 999" in problems
    assert f"routing key {0x1234:016x} is not a routing point of segment 1" in problems
    assert ix.check(fix=True).fixed == 2
    assert ix.check().clean and not ix.dir.has(0x1234, 1)


def test_wrong_counters_are_rewritten(tmp_path: Path) -> None:
    be = MemoryBackend()
    index(tmp_path, be).write_many([Insert(i, s, meta=i) for i, s in enumerate(seqs())])
    good = Counters.decode(be.get_many([COUNTERS_KEY])[0])
    wb = WriteBatch()
    wb.put(COUNTERS_KEY, Counters(2, good.next_version, good.blocks, 5).encode())
    be.write(wb, True)
    ix = index(tmp_path, be)
    assert ix.check().problems == [
        f"counters: 5 segments, next id 2; found {good.segments} segments, newest 8"]
    assert ix.check(fix=True).fixed == 1
    assert ix.counters == Counters(9, good.next_version, good.blocks, good.segments)
    assert Counters.decode(be.get_many([COUNTERS_KEY])[0]) == ix.counters  # on the disk


def test_a_bad_snapshot_is_deleted(tmp_path: Path) -> None:
    ix = index(tmp_path)
    ix.snapshot()
    [snap] = list_snapshots(tmp_path / "snap")
    snap.write_bytes(snap.read_bytes()[:100])
    [problem] = ix.check().problems
    assert problem.startswith(f"snapshot {snap.name}: ")
    assert ix.check(fix=True).fixed == 1 and not snap.exists() and ix.check().clean


class CorruptScan(MemoryBackend):
    """An engine that reports a corrupt page part-way through a scan of the segments."""

    broken = False

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        for i, item in enumerate(super().scan(start, end)):
            if self.broken and start == SEG_PREFIX and i == 3:
                raise BackendCorrupt("page p0007.pages: checksum mismatch")
            yield item


def test_an_engine_error_stops_the_check_and_every_repair(tmp_path: Path) -> None:
    be = CorruptScan()
    ix = index(tmp_path, be)
    ix.write_many([Insert(i, s, meta=i) for i, s in enumerate(seqs())])
    ix.dir.add(0x1234, 1, 0)  # a problem that would otherwise be fixed
    be.broken = True
    report = ix.check(fix=True)
    assert report.problems == ["backend: page p0007.pages: checksum mismatch (segments after 3 "
                               "not examined; nothing else is checked or fixed until the "
                               "engine is repaired)"]
    assert report.fixed == 0 and report.segments == 3 and ix.dir.has(0x1234, 1)


def test_a_long_list_of_problems_is_cut(tmp_path: Path) -> None:
    ix = index(tmp_path)
    for k in range(60):
        ix.dir.add(0x10000 + k, 1, 0)
    problems = ix.check().problems
    assert len(problems) == 51 and problems[-1] == "... and 10 more"
    assert ix.check(fix=True).fixed == 60 and ix.check().clean


def test_a_holder_listed_twice_is_reported(tmp_path: Path) -> None:
    """A holder table entry that repeats a block's first holder (no write path makes
    one; a bad copy or a bug could) is reported, naming the block and the holder."""
    ix = index(tmp_path)
    ix.write_many([Insert(9, seqs()[0], meta=77, add_holder=True)])
    assert ix.check().clean  # a real holder table
    ix.fold()  # its segment whole again: the value below is all of it
    value = ix.backend.get_many([seg_key(1)])[0]
    assert value is not None
    seg = decode_segment(value, 1).writable()
    assert seg.xmeta.tolist() == [77]
    seg.xmeta[0] = seg.meta[5]  # block 5's first holder, again in the table
    wb = WriteBatch()
    wb.put(seg_key(1), encode_segment(seg))
    ix.backend.write(wb, True)
    ix.store.forget_segments()
    report = ix.check()
    assert any(p == f"segment 1: block 0 lists its first holder {int(seg.meta[5]):#x} again "
               "in the holder table (reported, not fixed)" for p in report.problems), report


def test_delta_records_are_checked_against_what_the_index_serves(tmp_path: Path) -> None:
    """A segment grown after it was written has a delta record; check re-applies it to
    the segment's value. A damaged record (its checksum, its presence word) and one
    whose segment is gone are each reported (issue 24)."""
    ix = index(tmp_path, MemoryBackend())  # empty
    first = seqs(1)[0]
    assert first.tokens is not None
    ix.write_many([Insert(1, SeqSpec("", tokens=first.tokens[:32]), meta=5)])
    ix.write_many([Insert(2, first, meta=5)])  # grows segment 1: a delta record
    assert ix.stats()["delta_records"] == 1 and ix.check().clean
    key = delta_key(1, 0)
    good = ix.backend.get_many([key])[0]
    assert good is not None
    for bad, want in ((good[:-1] + bytes([good[-1] ^ 1]), "segment 1: delta record 0: "
                       "checksum mismatch"),
                      (good[:8] + bytes([good[8] ^ 1]) + good[9:], "segment 1: delta record 0")):
        wb = WriteBatch()
        wb.put(key, bad)
        ix.backend.write(wb, True)
        assert any(p.startswith(want) for p in ix.check().problems), ix.check().problems
    wb = WriteBatch()
    wb.put(key, good)
    wb.put(delta_key(99, 0), good)
    ix.backend.write(wb, True)
    assert ix.check().problems == ["segment 99: 1 delta records without a segment"]
