"""The applied log sequence (sarpd/core/store.py `applied_seq`, `SarpIndex.write_many(...,
applied_seq)`): stored in the write batch of the write it applies, so after a crash
the data and the sequence agree; strictly increasing; unchanged by a failed commit;
read back on reopen and on a reload. The foundation of issue 15's replicas (a
restarted replica replays from `applied_seq + 1`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backends.base import WriteBatch
from backends.faulty import FaultyBackend
from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.segment import APPLIED_KEY
from sarpd.core.store import open_backend
from sarpd.errors import CorruptData, StorageError, UnknownParent
from sarpd.model import Insert, Match, SeqSpec

REPO = Path(__file__).resolve().parents[2]


def hashes(*xs: int) -> np.ndarray:
    out = np.zeros((len(xs), 2), dtype=np.uint64)
    out[:, 0] = xs
    return out


def insert(*xs: int, parent: int | None = None) -> Insert:
    return Insert(0, SeqSpec("", hashes=hashes(*xs)), meta=np.ones(len(xs), np.uint64),
                  parent=None if parent is None else hashes(parent))


def matched(ix: SarpIndex, *xs: int) -> int:
    res = ix.match_many([Match(0, SeqSpec("", hashes=hashes(*xs)))])[0]
    assert not isinstance(res, Exception)
    return res.blocks


def test_applied_seq_is_stored_with_its_write_and_increases() -> None:
    be = MemoryBackend()
    ix = SarpIndex(be, IndexConfig())
    assert ix.applied_seq == 0 and be.get_many([APPLIED_KEY]) == [None]
    ix.write_many([insert(1, 2, 3)], applied_seq=5)
    assert ix.applied_seq == 5 and be.get_many([APPLIED_KEY]) == [(5).to_bytes(8, "little")]
    ix.write_many([insert(4)])  # a write that is no log entry leaves it as it is
    assert ix.applied_seq == 5
    for bad in (5, 4, 0):
        with pytest.raises(ValueError, match=rf"applied_seq {bad} is not after .* 5"):
            ix.write_many([insert(9)], applied_seq=bad)
    assert matched(ix, 9) == 0  # refused before anything was applied
    # an entry whose every op is refused is applied all the same (its errors are its
    # deterministic outcome on every replica): the sequence moves on
    out = ix.write_many([insert(7, parent=999)], applied_seq=6)
    assert isinstance(out[0], UnknownParent) and ix.applied_seq == 6
    again = SarpIndex(be, IndexConfig())  # a reopen reads it back
    again.recover()
    assert again.applied_seq == 6 and matched(again, 1, 2, 3) == 3


def test_a_failed_commit_does_not_move_it() -> None:
    be = FaultyBackend(MemoryBackend())
    ix = SarpIndex(be, IndexConfig())
    ix.write_many([insert(1)], applied_seq=1)
    be.set_mode("enospc")
    with pytest.raises(StorageError):
        ix.write_many([insert(2)], applied_seq=2)
    be.set_mode("")
    assert ix.applied_seq == 1 and matched(ix, 2) == 0
    ix.write_many([insert(2)], applied_seq=2)  # the replica retries the same entry
    assert ix.applied_seq == 2 and matched(ix, 2) == 1


def test_a_record_of_the_wrong_size_is_corrupt() -> None:
    be = MemoryBackend()
    wb = WriteBatch()
    wb.put(APPLIED_KEY, b"\x01\x02")
    be.write(wb, True)
    with pytest.raises(CorruptData, match="applied sequence record: 2 bytes, expected 8"):
        SarpIndex(be, IndexConfig())


_WRITER = """
import sys, numpy as np
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.store import open_backend
from sarpd.model import Insert, SeqSpec
ix = SarpIndex(open_backend("rocksdb", sys.argv[1], cache_bytes=4 << 20), IndexConfig(),
               sync=True)
seq = ix.applied_seq
while True:
    seq += 1
    h = np.zeros((3, 2), dtype=np.uint64)
    h[:, 0] = [3 * seq, 3 * seq + 1, 3 * seq + 2]
    ix.write_many([Insert(0, SeqSpec("", hashes=h), meta=np.full(3, seq, np.uint64))],
                  applied_seq=seq)
    print(seq, flush=True)  # acknowledged: durable (sync always)
"""


def test_every_acknowledged_entry_survives_kill_9(tmp_path: Path) -> None:
    """A real writer process applying entries with sync always, SIGKILLed twice: on
    reopen the applied sequence is at least the last one acknowledged, and every entry
    up to it is matched in full (data and sequence are durable together)."""
    data = tmp_path / "rocksdb"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    acked = 0
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(data)], env=env,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        target = acked + 40
        for line in proc.stdout:
            acked = int(line)
            if acked >= target:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ix = SarpIndex(open_backend("rocksdb", data, cache_bytes=4 << 20), IndexConfig())
        try:
            ix.recover()
            assert ix.applied_seq >= acked
            for seq in range(1, ix.applied_seq + 1):
                assert matched(ix, 3 * seq, 3 * seq + 1, 3 * seq + 2) == 3, seq
            assert matched(ix, 3 * (ix.applied_seq + 1)) == 0  # nothing past it
        finally:
            ix.close()
