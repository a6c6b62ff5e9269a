"""bloomstore/wal.py: the write-ahead log: records replay in order, a torn tail is
cut, a damaged middle or another format version is refused."""

from __future__ import annotations

import os
from pathlib import Path

from bloomstore import (
    BloomStore,
)
from tests.bloomstore.helpers import (
    QUIET,
    SMALL,
)


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
