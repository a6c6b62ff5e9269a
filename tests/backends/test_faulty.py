"""Disk faults: failed writes and fsyncs never leave memory ahead of (or behind) the disk.

In-process, on every backend: a FaultyBackend (backends/faulty.py) fails random write
batches, either before anything is applied (`enospc`) or after the engine applied the
batch without making it durable (`fsync`). After every batch, failed or not:
- matching equals the brute-force oracle, which holds the acknowledged batches (and,
  for `fsync`, the failed batch too: the engine shows it, unacknowledged);
- the counters in memory equal the counters on disk, every decoded segment the index
  caches equals its value on disk, and `check` is clean (no routing point names a
  segment that was never written).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from backends.errors import BackendIOError
from backends.faulty import FaultyBackend
from backends.registry import backend_names, open_backend
from sarpd.config import IndexConfig
from sarpd.core.delta import apply_delta, delta_key
from sarpd.core.index import SarpIndex
from sarpd.core.segment import COUNTERS_KEY, Counters, decode_segment, encode_segment, seg_key
from sarpd.errors import StorageError
from sarpd.model import Insert, InsertResult, Match, Remove, RemoveResult, SeqSpec
from tests.backends.helpers import batch_of
from tests.oracle import BT, Oracle

TINY = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=2,
                   prune_max_pred=1, window_cap=64, delta_max_entries=16)
STEPS = 40


@dataclass
class Workload:
    """Random multi-turn sessions over a few shared prompts (so that branches share
    heads and posting lists grow), as batches of write ops with their oracle effect."""

    rng: random.Random
    histories: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def blocks(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(6) for _ in range(n * BT))

    def op(self, oracle: Oracle) -> tuple[Insert | Remove, Callable[[], object]]:
        rng, hs = self.rng, self.histories
        kind = rng.choice(["new", "turn", "turn", "branch", "remove"]) if hs else "new"
        if kind == "remove":
            ns, toks = rng.choice(hs)
            start = rng.randrange(len(toks) // BT + 1)
            seq = SeqSpec(ns, tokens=np.array(toks, np.uint32))
            return Remove(0, seq=seq, start=start), lambda: oracle.remove(ns, toks, start)
        if kind == "new":
            ns = rng.choice(["", "b"])
            toks = (0,) * BT * rng.randrange(3) + self.blocks(rng.randrange(1, 5))
            hs.append((ns, toks))
        else:
            i = rng.randrange(len(hs))
            ns, toks = hs[i]
            if kind == "branch":
                toks = toks[: BT * rng.randrange(len(toks) // BT + 1)]
            toks = toks + self.blocks(rng.randrange(1, 4)) + (7,) * rng.randrange(BT)
            if kind == "turn":
                hs[i] = (ns, toks)
            else:
                hs.append((ns, toks))
        metas = [rng.randrange(1 << 40) for _ in range(len(toks) // BT)]
        seq = SeqSpec(ns, tokens=np.array(toks, np.uint32))
        op = Insert(0, seq, meta=np.array(metas, np.uint64))
        return op, lambda: oracle.insert(ns, toks, metas)


def assert_memory_is_disk(ix: SarpIndex) -> None:
    on_disk = Counters.decode(ix.backend.get_many([COUNTERS_KEY])[0])
    assert ix.counters == on_disk
    cached = ix.store.cached_segments()
    values = ix.backend.get_many([seg_key(sid) for sid, _ in cached])
    for (sid, seg), value in zip(cached, values, strict=True):
        assert value is not None, f"cached segment {sid} is not on the disk"
        disk = decode_segment(value, sid)  # its value, then its delta records (issue 24)
        key = delta_key(sid, 0)[:9]
        for _, record in ix.backend.scan(key, key + b"\xff"):
            disk = apply_delta(disk, record, f"segment {sid}")
        assert encode_segment(disk) == encode_segment(seg), \
            f"cached segment {sid} differs from the disk"
    report = ix.check()
    assert report.clean, report.problems


def assert_matches_oracle(ix: SarpIndex, wl: Workload, oracle: Oracle) -> None:
    reqs = [Match(0, SeqSpec(ns, tokens=np.array(t, np.uint32))) for ns, t in wl.histories]
    for (ns, t), r in zip(wl.histories, ix.match_many(reqs), strict=True):
        assert not isinstance(r, Exception), r
        want = oracle.match(ns, t)
        assert r.meta.tolist() == want, (ns, len(t) // BT, r.blocks, len(want))


def result_tuple(res: InsertResult | RemoveResult | Exception) -> object:
    if isinstance(res, InsertResult):
        return (res.blocks, res.new_blocks, res.matched_blocks)
    assert isinstance(res, RemoveResult), res
    return res.removed


@pytest.mark.parametrize("mode", ["enospc", "fsync"])
@pytest.mark.parametrize("backend_name", backend_names())
def test_failed_batches_leave_memory_equal_to_disk(backend_name: str, mode: str,
                                                   tmp_path: Path) -> None:
    rng = random.Random(f"{backend_name}/{mode}")
    backend = FaultyBackend(open_backend(backend_name, tmp_path / "db", cache_bytes=1 << 22))
    ix = SarpIndex(backend, TINY, tmp_path / "snap")
    ix.recover()
    oracle, wl = Oracle(), Workload(rng)
    failed = 0
    try:
        for step in range(STEPS):
            batch = [wl.op(oracle) for _ in range(rng.randrange(1, 5))]
            fail = step > 2 and rng.random() < 0.4
            backend.set_mode(mode if fail else "")
            injected = backend.faults
            try:
                results = ix.write_many([op for op, _ in batch])
            except StorageError as exc:
                assert fail and "injected fault" in exc.message, exc
                failed += 1
                if mode == "fsync":  # applied by the engine, though not acknowledged
                    for _, effect in batch:
                        effect()
            else:  # (a failing batch that changes nothing writes nothing: no fault)
                assert backend.faults == injected
                for (_, effect), res in zip(batch, results, strict=True):
                    assert result_tuple(res) == effect()
            backend.set_mode("")
            assert_memory_is_disk(ix)
            assert_matches_oracle(ix, wl, oracle)
            if step % 9 == 8:
                ix.snapshot()  # later reloads start from a snapshot plus the log
        assert failed >= 8 and backend.faults == failed
        assert ix.stats()["blocks"] == len(oracle.blocks)
    finally:
        ix.close()


def test_fault_file_switches_a_wrapped_backend(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """$SARPD_FAULT_FILE: open_backend wraps; the file's word is the fault, read at
    every write; reads pass through while writes fail."""
    control = tmp_path / "fault"
    monkeypatch.setenv("SARPD_FAULT_FILE", str(control))
    backend = open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22)
    try:
        assert isinstance(backend, FaultyBackend)
        backend.write(batch_of({b"a": b"v"}), True)
        control.write_text("enospc\n")
        with pytest.raises(BackendIOError, match=r"No space left on device \(injected"):
            backend.write(batch_of({b"b": b"v"}), True)
        assert backend.get_many([b"a", b"b"]) == [b"v", None]
        control.write_text("bogus")
        with pytest.raises(ValueError, match="bogus"):
            backend.write(batch_of({b"c": b"v"}), True)
        control.unlink()
        backend.write(batch_of({b"c": b"v"}), True)
        assert backend.get_many([b"c"]) == [b"v"]
        assert backend.stats()["faults_injected"] == 1
    finally:
        backend.close()



def test_each_mode_fails_as_documented(tmp_path: Path) -> None:
    """enospc and eio refuse the batch before the engine sees it; fsync applies it
    unsynced, then fails; sync() fails in every mode; reads always pass through."""
    backend = FaultyBackend(open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22))
    try:
        assert backend.name == "rocksdb" and backend.persistent is True
        for mode, key, visible, errno_text in [("enospc", b"a", False, "No space left"),
                                               ("eio", b"b", False, "Input/output error"),
                                               ("fsync", b"c", True, "Input/output error")]:
            backend.set_mode(mode)
            with pytest.raises(BackendIOError, match=errno_text) as err:
                backend.write(batch_of({key: b"v"}), True)
            assert "rocksdb" in err.value.message and "(injected fault)" in err.value.message
            assert (backend.get_many([key]) == [b"v"]) is visible
            with pytest.raises(BackendIOError, match=r"sync failed"):
                backend.sync()
            assert list(backend.scan(b"", b"\xff")) == ([(b"c", b"v")] if visible else [])
        assert backend.faults == 6 and backend.stats()["faults_injected"] == 6
        with pytest.raises(ValueError, match="not one of enospc, fsync, eio"):
            backend.set_mode("full")
        backend.set_mode("")
        backend.resume()
        backend.write(batch_of({b"d": b"v"}), True)
        backend.sync()
        assert backend.get_many([b"d"]) == [b"v"] and backend.faults == 6
    finally:
        backend.close()


def test_copy_to_fails_under_a_fault_and_copies_without_one(tmp_path: Path) -> None:
    inner = open_backend("rocksdb", tmp_path / "db", cache_bytes=8 << 20)
    fb = FaultyBackend(inner)
    fb.write(batch_of({b"k": b"v"}, []), sync=True)
    fb.set_mode("enospc")
    with pytest.raises(BackendIOError, match=r"copy_to .*No space left .*injected"):
        fb.copy_to(tmp_path / "copy")
    assert not (tmp_path / "copy").exists() and fb.faults == 1
    fb.set_mode("")
    fb.copy_to(tmp_path / "copy")
    fb.close()
    copy = open_backend("rocksdb", tmp_path / "copy", cache_bytes=8 << 20)
    assert copy.get_many([b"k"]) == [b"v"]
    copy.close()
