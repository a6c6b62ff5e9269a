"""`SarpIndex.checkpoint` (issue 15: what a new replica starts from): a sarpd data
directory holding a directory snapshot and the backend's consistent copy, with the
applied sequence; opened and recovered it answers as the index did at the call, on
every persistent backend, while the index goes on serving and writing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.memory import MemoryBackend
from backends.registry import backend_names
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.store import data_paths, open_backend
from sarpd.errors import ConfigError, StorageError
from sarpd.model import Insert, Match, MatchResult, Remove, SeqSpec

PERSISTENT = [n for n in backend_names() if n != "memory"]
CACHE = 32 << 20  # above every engine's floor (WiredTiger's is 32 MiB)


def hashes(xs: range | list[int]) -> np.ndarray:
    out = np.zeros((len(xs), 2), dtype=np.uint64)
    out[:, 0] = list(xs)
    return out


def answer(ix: SarpIndex, xs: range | list[int]) -> tuple[int, list[int]]:
    res = ix.match_many([Match(0, SeqSpec("", hashes=hashes(xs)))])[0]
    assert isinstance(res, MatchResult)
    return res.blocks, res.meta.tolist()


def open_index(data_dir: Path, backend: str) -> SarpIndex:
    backend_dir, snapshot_dir = data_paths(data_dir, backend)
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    return SarpIndex(open_backend(backend, backend_dir, cache_bytes=CACHE), IndexConfig(),
                     snapshot_dir, sync=True)


@pytest.mark.parametrize("backend", PERSISTENT)
def test_a_checkpoint_answers_as_the_index_did(backend: str, tmp_path: Path) -> None:
    ix = open_index(tmp_path / "live", backend)
    ix.recover()
    seqs = [range(1 + 1000 * i, 1 + 1000 * i + 70 + 9 * i) for i in range(12)]
    for n, s in enumerate(seqs, 1):
        ix.write_many([Insert(0, SeqSpec("", hashes=hashes(s)),
                              meta=np.full(len(s), n, np.uint64))], applied_seq=n)
    ix.write_many([Remove(0, ids=hashes(seqs[3][:5]))], applied_seq=13)
    ix.snapshot()  # an older snapshot and a change log after it, as in a running sarpd
    ix.write_many([Insert(0, SeqSpec("", hashes=hashes(range(50_000, 50_130))),
                          meta=np.ones(130, np.uint64))], applied_seq=14)
    before = [answer(ix, s) for s in [*seqs, range(50_000, 50_130)]]
    res = ix.checkpoint(tmp_path / "ckpt")
    assert res.applied_seq == 14 and res.seconds >= 0
    ix.write_many([Insert(0, SeqSpec("", hashes=hashes(range(90_000, 90_064))),
                          meta=np.ones(64, np.uint64))], applied_seq=15)  # after it
    assert answer(ix, range(90_000, 90_064))[0] == 64  # the index goes on
    copy = open_index(tmp_path / "ckpt", backend)
    try:
        report = copy.recover()
        assert not report.full_scan  # from the checkpoint's snapshot
        assert copy.applied_seq == 14
        assert [answer(copy, s) for s in [*seqs, range(50_000, 50_130)]] == before
        assert answer(copy, range(90_000, 90_064))[0] == 0  # nothing after the call
        assert copy.check(fix=False).clean
    finally:
        copy.close()
        ix.close()


def test_a_checkpoint_needs_a_new_directory_and_a_disk(tmp_path: Path) -> None:
    ix = open_index(tmp_path / "live", "rocksdb")
    ix.recover()
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match=r"checkpoint .*taken: it already exists"):
        ix.checkpoint(tmp_path / "taken")
    ix.close()
    mem = SarpIndex(MemoryBackend(), IndexConfig())
    with pytest.raises(StorageError, match="keeps nothing on disk"):
        mem.checkpoint(tmp_path / "mem")
