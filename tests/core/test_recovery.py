"""Recovery: snapshots + change log, corrupt snapshots fall back to a full scan,
corrupt segments are never served (format checks: test_manifest.py). Core level on
real RocksDB, and one daemon-level round on a real sarpd process."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from sarpd.client import SyncClient
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.segment import LOG_PREFIX, SEG_PREFIX
from sarpd.core.snapshot import list_snapshots
from sarpd.core.store import open_backend
from sarpd.model import Insert, Match, SeqSpec
from tests.daemon_helpers import Launcher
from tests.oracle import BT, Oracle

CFG = IndexConfig()


def workload(seed: int, sessions: int = 12) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    prompt = tuple(rng.integers(0, 1000, 16 * 37).tolist())
    out = []
    for _ in range(sessions):
        toks = prompt
        for _turn in range(3):
            toks = toks + tuple(rng.integers(0, 1000, int(rng.integers(5, 300))).tolist())
            out.append(toks)
    return out


def insert_all(ix: SarpIndex, oracle: Oracle, seqs: list[tuple[int, ...]]) -> None:
    ops = []
    for i, t in enumerate(seqs):
        n = len(t) // BT
        meta = [i * 1000 + j for j in range(n)]
        oracle.insert("", t, meta)
        ops.append(Insert(i, SeqSpec("", tokens=np.array(t, np.uint32)),
                          meta=np.array(meta, np.uint64)))
    ix.write_many(ops)


def assert_exact(ix: SarpIndex, oracle: Oracle, seqs: list[tuple[int, ...]]) -> None:
    res = ix.match_many([Match(0, SeqSpec("", tokens=np.array(t, np.uint32))) for t in seqs])
    for t, r in zip(seqs, res, strict=True):
        assert r.meta.tolist() == oracle.match("", t)


def open_index(root: Path, cfg: IndexConfig = CFG) -> SarpIndex:
    return SarpIndex(open_backend("rocksdb", root / "db", cache_bytes=1 << 22), cfg,
                     root / "snap")


def test_snapshot_then_change_log(tmp_path: Path) -> None:
    oracle = Oracle()
    ix = open_index(tmp_path)
    ix.recover()
    first, second = workload(1), workload(2)
    assert "snapshot_time" not in ix.stats()  # none written yet
    insert_all(ix, oracle, first)
    snap = ix.snapshot()
    assert snap.segment_id == ix.counters.next_seg - 1
    (newest,) = list_snapshots(tmp_path / "snap")
    assert ix.stats()["snapshot_time"] == newest.stat().st_mtime
    os.utime(newest, (1_000_000.0, 1_000_000.0))  # an old snapshot, as a restart finds it
    insert_all(ix, oracle, second)
    segments = ix.counters.segments
    ix.close()
    ix = open_index(tmp_path)
    rep = ix.recover()
    assert not rep.full_scan and rep.warning is None
    assert rep.snapshot_segment_id == snap.segment_id
    # only what changed after the snapshot is re-routed
    assert 0 < rep.segments_rerouted < segments
    assert_exact(ix, oracle, first + second)
    assert ix.check().clean
    assert ix.stats()["recovered_in_s"] >= 0
    assert ix.stats()["snapshot_time"] == 1_000_000.0  # the loaded one's
    ix.close()


def test_change_log_is_trimmed_to_the_oldest_kept_snapshot(tmp_path: Path) -> None:
    oracle = Oracle()
    ix = open_index(tmp_path)
    ix.recover()
    for seed in range(3):
        insert_all(ix, oracle, workload(seed, sessions=3))
        ix.snapshot()
    snaps = list_snapshots(tmp_path / "snap")
    assert len(snaps) == 2
    oldest_watermark = int(snaps[-1].name[4:20], 16)
    logs = [int.from_bytes(k[1:], "big") for k, _ in ix.backend.scan(LOG_PREFIX, b"M")]
    assert logs and min(logs) > oldest_watermark
    ix.close()


def test_a_snapshot_written_while_writes_go_on(tmp_path: Path) -> None:
    """`prepare_snapshot` copies the index's state; the writes applied while the file is
    written are not in it: they count as changed for the next snapshot, their change
    log is kept, and a restart from that snapshot re-routes them (exact answers)."""
    oracle = Oracle()
    ix = open_index(tmp_path)
    ix.recover()
    first, during = workload(3), workload(4)
    insert_all(ix, oracle, first)
    pending = ix.prepare_snapshot()
    assert ix.changed_segments == 0 and not ix.snapshot_current
    insert_all(ix, oracle, during)  # while the file is being written
    changed = ix.changed_segments
    assert changed > 0
    res = ix.finish_snapshot(pending, pending.write())
    assert res.segment_id == pending.meta.newest_seg < ix.counters.next_seg - 1
    assert ix.changed_segments == changed and not ix.snapshot_current  # the next one's
    logs = [int.from_bytes(k[1:], "big") for k, _ in ix.backend.scan(LOG_PREFIX, b"M")]
    assert logs and max(logs) > pending.meta.watermark  # the writes during it, kept
    ix.close()
    ix = open_index(tmp_path)
    rep = ix.recover()
    assert not rep.full_scan and rep.snapshot_segment_id == pending.meta.newest_seg
    assert rep.segments_rerouted >= changed
    assert_exact(ix, oracle, first + during)
    assert ix.check().clean
    ix.close()


@pytest.mark.parametrize("damage", ["truncate", "flip_body", "flip_header", "empty"])
def test_corrupt_snapshot_falls_back_to_full_scan(tmp_path: Path, damage: str) -> None:
    oracle = Oracle()
    ix = open_index(tmp_path)
    ix.recover()
    seqs = workload(3)
    insert_all(ix, oracle, seqs)
    ix.snapshot()
    ix.close()
    for path in list_snapshots(tmp_path / "snap"):
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "flip_body":
            data[-5] ^= 0x40
        elif damage == "flip_header":
            data[20] ^= 0x01
        else:
            data = bytearray()
        path.write_bytes(bytes(data))
    ix = open_index(tmp_path)
    rep = ix.recover()
    assert rep.full_scan and rep.warning
    assert "snapshot_time" not in ix.stats()  # nothing usable was loaded
    assert_exact(ix, oracle, seqs)
    problems = ix.check().problems  # the bad snapshot is reported until fixed
    assert problems and all(p.startswith("snapshot dir-") for p in problems), problems
    assert ix.check(fix=True).fixed == len(problems)
    assert ix.check().clean
    ix.close()


def test_corrupt_segment_is_never_served_and_check_reports_it(tmp_path: Path) -> None:
    oracle = Oracle()
    ix = open_index(tmp_path)
    ix.recover()
    seqs = workload(4, sessions=2)
    insert_all(ix, oracle, seqs)
    key, value = next(iter(ix.backend.scan(SEG_PREFIX, b"T")))
    bad = bytearray(value)
    bad[-3] ^= 0xFF  # a metadata byte: the id verification alone would not notice
    from backends.base import WriteBatch

    wb = WriteBatch()
    wb.put(key, bytes(bad))
    ix.backend.write(wb, True)
    ix.close()  # the damage is on disk: a fresh process reads it from there
    ix = open_index(tmp_path)
    ix.recover()
    res = ix.match_many([Match(0, SeqSpec("", tokens=np.array(t, np.uint32))) for t in seqs])
    for t, r in zip(seqs, res, strict=True):
        want = oracle.match("", t)
        assert r.meta.tolist() == want[: r.blocks]  # a prefix of the truth, never wrong meta
    assert ix.stats()["corrupt_segments"] >= 1
    report = ix.check()
    assert not report.clean and any("checksum" in p for p in report.problems)
    assert ix.backend.get_many([key])[0] == bytes(bad)  # check alone changes nothing
    fixed = ix.check(fix=True)
    assert fixed.fixed >= 1
    assert ix.backend.get_many([key])[0] is None and ix.check().clean
    ix.close()


def test_daemon_restarts_on_corrupt_snapshot(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory(backend="rocksdb")
    seqs = workload(5, sessions=4)
    with SyncClient(str(proc.socket)) as c:
        for i, t in enumerate(seqs):
            c.insert(tokens=list(t), meta=i)
        want = [c.match(tokens=list(t))["meta"] for t in seqs]
    assert proc.stop() == 0  # clean shutdown writes a snapshot
    snaps = list(proc.data_dir.rglob("dir-*.snap"))
    assert snaps
    for s in snaps:
        with open(s, "r+b") as fh:
            fh.seek(os.path.getsize(s) // 2)
            fh.write(b"\xde\xad\xbe\xef")
    proc.start()
    with SyncClient(str(proc.socket)) as c:
        assert [c.match(tokens=list(t))["meta"] for t in seqs] == want
        problems = c.check()["problems"]  # the bad snapshots are reported until fixed
        assert problems and all(p.startswith("snapshot dir-") for p in problems), problems
        c.check(fix=True)
        assert c.check()["clean"]
        assert c.stats()["recovered_in_s"] >= 0
    assert "snapshot skipped" in proc.log() or "full scan" in proc.log()
