"""Directory snapshots (sarpd/core/snapshot.py): the file layout, the round trip, the
newest `keep` files kept, no partial file on a failed write, and every check on load
(the skip-and-fall-back behaviour of recovery is in test_recovery.py)."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from sarpd.core.blockmap import MapArrays
from sarpd.core.directory import DirectoryArrays
from sarpd.core.segment import SEGMENT_FORMAT
from sarpd.core.snapshot import (
    HEAD,
    MAGIC,
    MAP_ENTRY,
    MAP_HEAD,
    SNAP_FORMAT,
    Loaded,
    SnapshotMeta,
    list_snapshots,
    load_newest,
    read_meta,
    read_snapshot,
    write_snapshot,
)
from sarpd.errors import CorruptData, FormatVersionError, StorageError


def arrays(n: int, seed: int = 0) -> DirectoryArrays:
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.integers(0, 2**63, n).astype(np.uint64))
    return DirectoryArrays(keys, rng.integers(1, 1000, n).astype(np.uint64),
                           rng.integers(0, 2**63, n).astype(np.uint64))


def meta(watermark: int) -> SnapshotMeta:
    return SnapshotMeta(watermark, watermark * 2, 16, 64)


def test_round_trip_and_layout(tmp_path: Path) -> None:
    arr = arrays(100)
    path = write_snapshot(tmp_path / "snap", arr, meta(0x2A))
    assert path.name == "dir-000000000000002a.snap"
    data = path.read_bytes()
    assert len(data) == HEAD.size + 24 * 100 + MAP_HEAD.size  # an empty block map
    magic, fmt, seg_fmt, wm, newest, n, bt, sb, _crc, hcrc = HEAD.unpack_from(data)
    assert (magic, fmt, seg_fmt, wm, newest, n, bt, sb) == (
        MAGIC, SNAP_FORMAT, SEGMENT_FORMAT, 0x2A, 0x54, 100, 16, 64)
    assert hcrc == zlib.crc32(data[:52])
    got_meta, got = read_snapshot(path)
    assert got_meta == meta(0x2A)
    for a, b in zip((got.keys, got.segs, got.filts), (arr.keys, arr.segs, arr.filts),
                    strict=True):
        assert a.tolist() == b.tolist()


def test_the_block_map_round_trips_and_a_format_1_file_has_none(tmp_path: Path) -> None:
    ids = np.array([[5, 1], [2**64 - 1, 0], [7, 7]], dtype=np.uint64)
    m = MapArrays(ids, np.array([9, 8, 2**63], np.uint64), np.array([0, 63, 70_000], np.uint32))
    path = write_snapshot(tmp_path, arrays(10), meta(3), blockmap=m)
    data = path.read_bytes()
    assert len(data) == HEAD.size + 24 * 10 + MAP_HEAD.size + MAP_ENTRY * 3
    loaded = load_newest(tmp_path, 16, 64)
    assert isinstance(loaded, Loaded) and loaded.blockmap is not None
    assert loaded.blockmap.ids.tolist() == ids.tolist()
    assert loaded.blockmap.heads.tolist() == [9, 8, 2**63]
    assert loaded.blockmap.pos.tolist() == [0, 63, 70_000]
    old = bytearray(data[: HEAD.size + 24 * 10])  # what format 1 wrote: no map section
    struct.pack_into("<I", old, 8, 1)
    struct.pack_into("<I", old, 48, zlib.crc32(bytes(old[HEAD.size:])))
    struct.pack_into("<I", old, 52, zlib.crc32(bytes(old[:52])))
    path.write_bytes(bytes(old))
    loaded = load_newest(tmp_path, 16, 64)
    assert isinstance(loaded, Loaded) and loaded.blockmap is None
    assert len(loaded.arrays.keys) == 10


def test_the_newest_keep_files_are_kept(tmp_path: Path) -> None:
    for wm in (1, 5, 3, 9):
        write_snapshot(tmp_path, arrays(3, wm), meta(wm), keep=2)
    assert [p.name for p in list_snapshots(tmp_path)] == [
        "dir-0000000000000009.snap", "dir-0000000000000005.snap"]  # by watermark, not age
    assert list_snapshots(tmp_path / "missing") == []


def test_a_write_removes_what_dead_writers_left_and_reads_its_header_alone(
        tmp_path: Path) -> None:
    """Temp files of other processes (and the old single name) go; a temp file of this
    process may be another thread's snapshot in the writing: it stays."""
    dead = [tmp_path / "dir-0000000000000001.snap.999999999.7.tmp",
            tmp_path / "dir-0000000000000001.snap.tmp"]
    mine = tmp_path / f"dir-0000000000000002.snap.{os.getpid()}.8.tmp"
    for p in (*dead, mine):
        p.write_bytes(b"partial")
    path = write_snapshot(tmp_path, arrays(5), meta(3))
    assert sorted(tmp_path.iterdir()) == sorted([path, mine])
    assert read_meta(path) == meta(3)
    with pytest.raises(CorruptData, match="shorter than the header"):
        read_meta(mine)


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sarpd.core.snapshot.os.fsync", full_disk)
    with pytest.raises(StorageError, match=r"could not be written: .*No space left"):
        write_snapshot(tmp_path, arrays(10), meta(1))
    assert list(tmp_path.iterdir()) == []


def damaged(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "torn":
        data = data[: len(data) - 7]
    elif how == "short":
        data = data[:30]
    elif how == "magic":
        data[0:8] = b"NOTASNAP"
    elif how == "header":
        data[16] ^= 1
    elif how == "body":
        data[-1] ^= 1
    elif how == "format":
        struct.pack_into("<I", data, 8, SNAP_FORMAT + 1)
        struct.pack_into("<I", data, 52, zlib.crc32(bytes(data[:52])))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,error,want", [
    ("torn", CorruptData, "expected .* for 20 entries"),
    ("short", CorruptData, "shorter than the header"),
    ("magic", CorruptData, "bad magic"),
    ("header", CorruptData, "header checksum mismatch"),
    ("body", CorruptData, "body checksum mismatch"),
    ("format", FormatVersionError, f"snapshot format {SNAP_FORMAT + 1}/segment format"),
])
def test_every_check_on_load(tmp_path: Path, how: str, error: type[Exception],
                             want: str) -> None:
    path = write_snapshot(tmp_path, arrays(20), meta(4))
    damaged(path, how)
    with pytest.raises(error, match=want):
        read_snapshot(path)


def test_unsorted_keys_are_refused(tmp_path: Path) -> None:
    arr = arrays(5)
    bad = DirectoryArrays(arr.keys[::-1].copy(), arr.segs, arr.filts)
    path = write_snapshot(tmp_path, bad, meta(1))
    with pytest.raises(CorruptData, match="routing keys are not sorted"):
        read_snapshot(path)


def test_load_newest_skips_bad_files_and_other_geometries(tmp_path: Path) -> None:
    oldest = write_snapshot(tmp_path, arrays(4, 1), meta(1), keep=3)
    write_snapshot(tmp_path, arrays(4, 2), SnapshotMeta(2, 0, 32, 64), keep=3)
    newest = write_snapshot(tmp_path, arrays(4, 3), meta(3), keep=3)
    damaged(newest, "body")
    got = load_newest(tmp_path, 16, 64)
    assert isinstance(got, Loaded) and got.meta == meta(1) and got.path == oldest
    assert np.array_equal(got.arrays.keys, arrays(4, 1).keys)
    assert not isinstance(load_newest(tmp_path, 16, 32), Loaded)
    warning = load_newest(tmp_path, 8, 8)
    assert isinstance(warning, str)
    assert "body checksum mismatch" in warning and "geometry 32/64 differs from 8/8" in warning
    assert load_newest(tmp_path / "empty", 16, 64) is None
