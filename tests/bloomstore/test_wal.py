"""bloomstore/wal.py: the write-ahead log: records replay in order, a torn tail is
cut, a damaged middle or another format version is refused."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from bloomstore import BloomStore
from bloomstore.errors import CorruptionError, FormatError
from bloomstore.wal import FILE_HEADER, RECORD, Wal, encode_record, wal_name
from tests.bloomstore.helpers import QUIET, SMALL


def _wal(path: Path) -> Path:
    [wal] = path.glob("wal-*.log")
    return wal


def test_torn_log_tail_is_ignored_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    for i in range(10):
        store.write({b"batch%02d" % i: b"x" * 100, b"last": b"%d" % i}, (), sync=True)
    store.close()
    wal = _wal(path)
    with wal.open("r+b") as fh:  # tear the last record
        fh.truncate(wal.stat().st_size - 30)
    with wal.open("ab") as fh:  # and leave garbage after it
        fh.write(os.urandom(200))
    store = BloomStore(path, None, QUIET)
    assert store.get_many([b"last", b"batch08", b"batch09"]) == [b"8", b"x" * 100, None]
    store.write({b"after": b"1"}, (), sync=True)  # appended after the cut
    store.close()
    store = BloomStore(path, None, QUIET)
    assert store.get_many([b"last", b"after", b"batch09"]) == [b"8", b"1", None]
    store.close()


OPS: list[list[tuple[bytes, bytes | None]]] = [
    [(b"a", b"1"), (b"b", None)], [(b"", b"empty key")], [(b"c", b"x" * 500), (b"a", None)]]


def _log(path: Path, first_lsn: int = 5) -> Path:
    wal = Wal(path, gen=2, first_lsn=first_lsn, create=True)
    for i, ops in enumerate(OPS):
        wal.append(encode_record(first_lsn + i, ops))
    wal.sync()
    wal.close()
    return path / wal_name(2)


def test_records_replay_in_order(tmp_path: Path) -> None:
    assert _log(tmp_path).name == "wal-000002.log"
    wal = Wal(tmp_path, gen=2, first_lsn=0, create=False)
    records = list(wal.replay())
    assert [(r.lsn, r.ops) for r in records] == [(5 + i, ops) for i, ops in enumerate(OPS)]
    assert wal.first_lsn == 5 and wal.records_replayed == 3 and wal.bytes_dropped == 0
    wal.append(encode_record(8, [(b"d", b"4")]))  # goes after the last good record
    wal.close()
    again = Wal(tmp_path, gen=2, first_lsn=0, create=False)
    assert [r.lsn for r in again.replay()] == [5, 6, 7, 8]
    again.close()


def test_a_damaged_middle_is_corruption_and_nothing_is_cut(tmp_path: Path) -> None:
    path = _log(tmp_path)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER.size + RECORD.size] ^= 0xFF  # the first record's payload
    path.write_bytes(bytes(data))
    wal = Wal(tmp_path, gen=2, first_lsn=0, create=False)
    with pytest.raises(CorruptionError, match=r"lsn 6 at offset \d+ after it is intact"):
        list(wal.replay())
    wal.close()
    assert path.read_bytes() == bytes(data)


def test_another_version_or_generation_is_refused(tmp_path: Path) -> None:
    path = _log(tmp_path)
    data = bytearray(path.read_bytes())
    (tmp_path / wal_name(3)).write_bytes(bytes(data))  # generation 2's log under 3's name
    wrong_gen = Wal(tmp_path, gen=3, first_lsn=0, create=False)
    with pytest.raises(CorruptionError, match=r"generation 2 \(expected b'BSWL' 1 3\)"):
        list(wrong_gen.replay())
    wrong_gen.close()
    struct.pack_into("<H", data, 4, 2)
    path.write_bytes(bytes(data))
    wal = Wal(tmp_path, gen=2, first_lsn=0, create=False)
    with pytest.raises(FormatError, match=r"log format version 2 \(a newer format\)"):
        list(wal.replay())
    wal.close()
