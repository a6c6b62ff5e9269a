"""Torn or corrupt files are detected by their checksums, reported (log and `check`),
and never served as data.

- segments (CRC-32, sarpd/core/segment.py): a flipped or a torn value, on every backend;
- directory snapshots (CRC-32s, sarpd/core/snapshot.py): recovery falls back to the older
  snapshot, and `check` reports the bad file (`fix` deletes it);
- BloomStore pages (xxh3, bloomstore/pages.py) under sarp: the segments on the page
  are not served, every other segment still is, `check` reports the engine error;
- BloomStore's write-ahead log: a torn tail is cut (test_bloomstore.py); damage in
  the MIDDLE (a later record is intact) or in the header's first lsn refuses the
  open and cuts nothing, and a real sarpd exits 1 naming the file.
(test_recovery.py covers truncated, flipped and empty snapshots with no older one.)
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from backends.base import WriteBatch
from backends.registry import backend_names
from bloomstore import BloomStore, CorruptionError, Tuning
from sarpd.client import SyncClient
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.segment import SEG_PREFIX
from sarpd.core.snapshot import list_snapshots
from sarpd.core.store import open_backend
from sarpd.errors import CorruptData
from sarpd.model import Insert, Match, SeqSpec
from tests.daemon_helpers import Launcher
from tests.oracle import BT, Oracle

CFG = IndexConfig()
QUIET = Tuning(cache_bytes=1 << 20, fsync=False)


def sequences(seed: int, n: int = 10) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 1 << 20, BT * int(rng.integers(2, 150))).tolist())
            for _ in range(n)]


class Env:
    def __init__(self, root: Path, backend: str = "rocksdb") -> None:
        self.root, self.backend, self.oracle = root, backend, Oracle()
        self.seqs: list[tuple[int, ...]] = []
        self.ix = self.open()

    def open(self) -> SarpIndex:
        be = open_backend(self.backend, self.root / "db", cache_bytes=0 if
                          self.backend == "bloomstore" else 1 << 22)
        ix = SarpIndex(be, CFG, self.root / "snap")
        ix.recover()
        return ix

    def reopen(self) -> None:
        self.ix.close()
        self.ix = self.open()

    def insert(self, seqs: list[tuple[int, ...]]) -> None:
        ops = []
        for t in seqs:
            i = len(self.seqs)
            self.seqs.append(t)
            meta = [i * 1000 + j for j in range(len(t) // BT)]
            self.oracle.insert("", t, meta)
            ops.append(Insert(i, SeqSpec("", tokens=np.array(t, np.uint32)),
                              meta=np.array(meta, np.uint64)))
        self.ix.write_many(ops)

    def short_matches(self) -> int:
        """How many sequences match less than the truth (never anything else)."""
        res = self.ix.match_many([Match(0, SeqSpec("", tokens=np.array(t, np.uint32)))
                                  for t in self.seqs])
        short = 0
        for t, r in zip(self.seqs, res, strict=True):
            assert not isinstance(r, Exception), r
            want = self.oracle.match("", t)
            assert r.meta.tolist() == want[: r.blocks], "served wrong metadata"
            short += r.blocks < len(want)
        return short


@pytest.mark.parametrize("damage", ["flip_id", "torn"])
@pytest.mark.parametrize("backend", [n for n in backend_names() if n != "memory"])
def test_damaged_segment_is_never_served(tmp_path: Path, backend: str, damage: str) -> None:
    env = Env(tmp_path, backend)
    env.insert(sequences(1))
    key, value = next(iter(env.ix.backend.scan(SEG_PREFIX, b"T")))
    bad = bytearray(value)
    if damage == "flip_id":
        bad[48 + 3] ^= 0x10  # a block id: the CRC, not the id verification, must catch it
    else:
        bad = bad[: len(bad) - 100]
    wb = WriteBatch()
    wb.put(key, bytes(bad))
    env.ix.backend.write(wb, True)
    env.reopen()
    try:
        assert env.short_matches() >= 1
        assert env.ix.stats()["corrupt_segments"] >= 1
        report = env.ix.check()
        assert any(p.startswith(f"segment {int.from_bytes(key[1:], 'big')}:")
                   for p in report.problems), report.problems
    finally:
        env.ix.close()


def test_corrupt_newest_snapshot_falls_back_and_check_reports_it(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.insert(sequences(2, 5))
    env.ix.snapshot()
    env.insert(sequences(3, 5))
    env.ix.snapshot()
    env.insert(sequences(4, 5))  # after both snapshots: only in the change log
    newest = list_snapshots(tmp_path / "snap")[0]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    env.reopen()
    try:
        assert env.short_matches() == 0  # the older snapshot + the log: nothing lost
        report = env.ix.check()
        assert report.problems == [f"snapshot {newest.name}: {newest}: body checksum mismatch"]
        assert env.ix.check(fix=True).fixed == 1 and not newest.exists()
        assert env.ix.check().clean
    finally:
        env.ix.close()


def test_corrupt_bloomstore_page_under_sarp(tmp_path: Path) -> None:
    """A page goes bad under a running index: its segments are not served, every other
    one still is, `check` reports it; a restart refuses, naming the page (recovery
    cannot list the segments past the damage)."""
    env = Env(tmp_path, "bloomstore")
    env.insert(sequences(5, 40))
    env.ix.backend.engine.checkpoint()  # type: ignore[attr-defined]  # all on pages
    env.reopen()  # (cache_bytes=0: every read goes to the page files)
    try:
        assert env.short_matches() == 0
        victim = max((tmp_path / "db").glob("p*.pages"), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x40
        with open(victim, "r+b") as fh:  # in place: the store's open descriptor sees it
            fh.write(data)
        env.ix.store.forget_segments()  # what sarp decoded before the damage is not re-read
        short = env.short_matches()
        assert 1 <= short < len(env.seqs)  # the damaged page's segments only
        assert env.ix.stats()["corrupt_segments"] >= 1
        report = env.ix.check()
        assert len(report.problems) == 1 and report.problems[0].startswith("backend: ")
        assert str(victim) in report.problems[0] and "checksum" in report.problems[0]
        assert env.ix.check(fix=True).fixed == 0  # nothing repaired over unknown data
    finally:
        env.ix.close()
    with pytest.raises(CorruptData, match=f"{victim}.*checksum mismatch"):
        env.open()


def _wal_with_records(path: Path, n: int) -> tuple[Path, list[int]]:
    """A closed store whose log holds n records; the offset of each record."""
    store = BloomStore(path, None, QUIET)
    for i in range(n):
        store.write({b"k%03d" % i: b"v" * 50}, (), sync=True)
    store.close()  # (the buffers stay in the log: close does not flush them)
    [wal] = path.glob("wal-*.log")
    data = wal.read_bytes()
    offsets, pos = [], 24
    while pos < len(data):
        offsets.append(pos)
        pos += 24 + struct.unpack_from("<I", data, pos)[0]
    return wal, offsets


@pytest.mark.parametrize("where", ["middle_record", "header_first_lsn"])
def test_damaged_log_middle_refuses_open_and_cuts_nothing(tmp_path: Path, where: str) -> None:
    wal, offsets = _wal_with_records(tmp_path / "bs", 12)
    assert len(offsets) == 12
    data = bytearray(wal.read_bytes())
    if where == "middle_record":
        data[offsets[5] + 30] ^= 0x01  # a payload byte of record 6 of 12
        want = rf"offset {offsets[5]} .* record lsn \d+ at offset {offsets[6]} after it is intact"
    else:
        struct.pack_into("<Q", data, 16, struct.unpack_from("<Q", data, 16)[0] + 1)
        want = r"offset 24 .* intact with lsn \d+ \(out of sequence\)"
    wal.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=want):
        BloomStore(tmp_path / "bs", None, QUIET)
    assert wal.read_bytes() == bytes(data)  # nothing cut


def test_torn_log_tail_still_opens(tmp_path: Path) -> None:
    wal, offsets = _wal_with_records(tmp_path / "bs", 12)
    with wal.open("r+b") as fh:
        fh.truncate(offsets[-1] + 30)  # the last record torn
    store = BloomStore(tmp_path / "bs", None, QUIET)
    try:
        assert store.get_many([b"k010", b"k011"]) == [b"v" * 50, None]
    finally:
        store.close()


def test_daemon_refuses_a_damaged_log(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory(backend="bloomstore", config={"index": {"snapshot_interval_s": 0}})
    with SyncClient(proc.socket) as c:
        for i in range(5):
            c.insert(tokens=list(range(i, i + 64)), meta=i)
    assert proc.kill() == -9  # no checkpoint: the batches are only in the log
    [wal] = (proc.data_dir / "bloomstore").glob("wal-*.log")
    data = bytearray(wal.read_bytes())
    data[40] ^= 0x01  # inside the first record (the manifest write at open)
    wal.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    assert "the log is corrupt, not torn at its tail" in proc.log()
    assert str(wal) in proc.log()
