"""On-disk format versions: every versioned file or record names its format; a newer
(or an older, unmigrated) format is refused with an error naming both versions, and
is never read as data. The data is left untouched by the refusal.

- the data set's manifest (key b"M", sarpd/core/manifest.py; the index's refusals
  are in test_manifest.py): a real sarpd exits 1 with the message in its log;
- a directory snapshot (sarpd/core/snapshot.py): skipped, recovery falls back to the
  log or a full scan, matching stays exact;
- a segment (sarpd/core/segment.py): not served, reported by `check`;
- BloomStore's MANIFEST and write-ahead log (bloomstore/manifest.py, wal.py):
  refused at open.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash

from backends.base import WriteBatch
from backends.registry import backend_names
from bloomstore import BloomStore, FormatError
from bloomstore import manifest as bs_manifest
from bloomstore import wal as bs_wal
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.manifest import FORMAT_VERSION
from sarpd.core.segment import SEG_PREFIX, SEGMENT_FORMAT
from sarpd.core.snapshot import SNAP_FORMAT, list_snapshots
from sarpd.core.store import open_backend
from sarpd.errors import FormatVersionError
from sarpd.model import Insert, Match, SeqSpec
from tests.core.test_manifest import set_manifest
from tests.daemon_helpers import Launcher
from tests.oracle import BT, Oracle

CFG = IndexConfig()
PERSISTENT = [n for n in backend_names() if n != "memory"]


def seqs() -> list[tuple[int, ...]]:
    rng = np.random.default_rng(11)
    return [tuple(rng.integers(0, 1000, BT * int(rng.integers(1, 90))).tolist())
            for _ in range(8)]


def build(root: Path, backend: str = "rocksdb") -> Oracle:
    """An index with a few sequences and a snapshot; closed."""
    oracle = Oracle()
    ix = SarpIndex(open_backend(backend, root / "db", cache_bytes=1 << 22), CFG, root / "snap")
    ix.recover()
    ops = []
    for i, t in enumerate(seqs()):
        meta = [i * 1000 + j for j in range(len(t) // BT)]
        oracle.insert("", t, meta)
        ops.append(Insert(i, SeqSpec("", tokens=np.array(t, np.uint32)),
                          meta=np.array(meta, np.uint64)))
    ix.write_many(ops)
    ix.snapshot()
    ix.close()
    return oracle


def test_daemon_refuses_a_newer_format(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory(backend="rocksdb")
    assert proc.stop() == 0
    set_manifest(proc.data_dir / "rocksdb", "rocksdb", FORMAT_VERSION + 1)
    with pytest.raises(RuntimeError, match="exited with 1"):
        proc.start()
    log = proc.log()
    assert f"data format {FORMAT_VERSION + 1} was written by a newer sarpd" in log, log


def test_snapshot_of_another_format_is_skipped(tmp_path: Path) -> None:
    oracle = build(tmp_path)
    for path in list_snapshots(tmp_path / "snap"):
        data = bytearray(path.read_bytes())
        struct.pack_into("<I", data, 8, SNAP_FORMAT + 1)  # a newer format, header CRC valid
        struct.pack_into("<I", data, 52, zlib.crc32(bytes(data[:52])))
        path.write_bytes(bytes(data))
    ix = SarpIndex(open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22), CFG,
                   tmp_path / "snap")
    try:
        rep = ix.recover()
        assert rep.full_scan and rep.warning and f"snapshot format {SNAP_FORMAT + 1}" in rep.warning
        assert f"reads {SNAP_FORMAT}/" in rep.warning
        res = ix.match_many([Match(0, SeqSpec("", tokens=np.array(t, np.uint32)))
                             for t in seqs()])
        for t, r in zip(seqs(), res, strict=True):
            assert r.meta.tolist() == oracle.match("", t)
    finally:
        ix.close()


def test_segment_of_another_format_is_not_served(tmp_path: Path) -> None:
    oracle = build(tmp_path)
    be = open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22)
    key, value = next(iter(be.scan(SEG_PREFIX, b"T")))
    bad = bytearray(value)
    bad[4] = SEGMENT_FORMAT + 1
    wb = WriteBatch()
    wb.put(key, bytes(bad))
    be.write(wb, True)
    ix = SarpIndex(be, CFG, tmp_path / "snap")
    try:
        ix.recover()
        res = ix.match_many([Match(0, SeqSpec("", tokens=np.array(t, np.uint32)))
                             for t in seqs()])
        short = 0
        for t, r in zip(seqs(), res, strict=True):
            want = oracle.match("", t)
            assert r.meta.tolist() == want[: r.blocks]  # a prefix of the truth, never misread
            short += r.blocks < len(want)
        assert short >= 1
        report = ix.check()
        assert any(f"has format {SEGMENT_FORMAT + 1}; this build reads formats 1, "
                   f"{SEGMENT_FORMAT}" in p for p in report.problems), report.problems
    finally:
        ix.close()


def _rewrite_first_frame(path: Path, offset_in_body: int, value: int) -> None:
    """Set a u16 in the first manifest record's body, keeping its checksum valid."""
    data = bytearray(path.read_bytes())
    blen, _kind, _ = bs_manifest.FRAME.unpack_from(data, 0)
    body = bs_manifest.FRAME.size
    struct.pack_into("<H", data, body + offset_in_body, value)
    digest = xxhash.xxh3_64(bytes(data[:8]))
    digest.update(bytes(data[body : body + blen]))
    struct.pack_into("<Q", data, 8, digest.intdigest())
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("version,side", [(bs_manifest.VERSION + 1, "newer"), (0, "older")])
def test_bloomstore_manifest_version_is_refused(tmp_path: Path, version: int,
                                                side: str) -> None:
    store = BloomStore(tmp_path / "bs")
    store.write({b"k": b"v"}, (), sync=True)
    store.close()
    _rewrite_first_frame(tmp_path / "bs" / "MANIFEST", 4, version)
    with pytest.raises(FormatError) as err:
        BloomStore(tmp_path / "bs")
    msg = err.value.message
    assert f"manifest format version {version} ({'a' if side == 'newer' else 'an'} {side}" \
        in msg
    assert f"version {version}" in msg and f"reads version {bs_manifest.VERSION}" in msg
    with pytest.raises(FormatVersionError, match=f"version {version}"):
        open_backend("bloomstore", tmp_path / "bs", cache_bytes=1 << 20)


def test_bloomstore_log_version_is_refused(tmp_path: Path) -> None:
    store = BloomStore(tmp_path / "bs")
    store.write({b"k": b"v"}, (), sync=True)
    store.close()
    [log] = (tmp_path / "bs").glob("wal-*.log")
    data = bytearray(log.read_bytes())
    struct.pack_into("<H", data, 4, bs_wal.VERSION + 1)
    log.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=f"log format version {bs_wal.VERSION + 1} "
                                          r"\(a newer format\)"):
        BloomStore(tmp_path / "bs")
    assert log.read_bytes() == bytes(data)  # refused, not cut
