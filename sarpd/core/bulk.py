"""Bulk building of a new data set: `sarpctl import`, the bench's preload.

A `BulkBuilder` runs the ordinary write path (`SarpIndex.write_many`: the same
segments, block locators, counters, namespace counts and routing points as that
sequence of inserts) against a staging store, then writes the result into an empty
backend in ONE sorted pass (`Backend.ingest`: sorted table files that RocksDB
ingests; write batches elsewhere) and the routing directory, built as it went, as a
snapshot: the first start of sarpd on the data loads it and re-routes nothing.

Staging (`Staging`, a Backend that only the builder's index writes to):
- segments: appended to files of SEG_FILE_SIDS segment ids each (a value rewritten
  when its segment grows is appended again); memory holds only each segment's
  offset and length (12 B per segment, ~0.2 B per block): reads are `pread`s (the
  page cache keeps the recent ones). At the end each file is read whole, its
  segments yielded in id order, and the file deleted, so the disk holds each value
  about once (staged or ingested);
- counters, the manifest, the namespace counts: a dict in memory;
- block locators (one 29-byte record per block, too many to sort in memory at 1e8+
  blocks): a distribution sort on disk. Each write batch's records are appended
  (buffered) to one of RUNS run files chosen by the first byte of the id; at the
  end each run (~1/RUNS of them) is sorted in memory, the last record of a key
  winning, and the runs are read in order: one sorted stream;
- change-log records are dropped: the snapshot written at the end folds every one
  of them in (sarpd deletes them after its snapshot the same way); the counters
  keep the version they reached.

Run file `locators-XX.run` (XX: the id's first byte, hex): records in write order,
each RECORD bytes: the locator's key (17: b"B" + 16-byte id) then its value (12:
u64 head key + u32 position, sarpd/core/segment.py).
Segment file `segments-NNNNNN.log` (NNNNNN: seg id // SEG_FILE_SIDS): segment values
(sarpd/core/segment.py's format) back to back, in write order.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from backends.base import Backend, WriteBatch, ingest_by_batches
from backends.errors import BackendIOError
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.native import Kernels
from sarpd.core.segment import (
    BLOCK_KEY,
    BLOCK_KEY_ID_AT,
    BLOCK_PREFIX,
    LOCATOR,
    LOG_PREFIX,
    SEG_PREFIX,
    seg_id_of_key,
    seg_key,
)
from sarpd.core.store import backend_errors
from sarpd.errors import BadRequest, SarpError
from sarpd.model import Insert, InsertResult, RemoveResult

RUNS = 256
KEY_BYTES = BLOCK_KEY.itemsize  # 17
RECORD = KEY_BYTES + LOCATOR.size  # 29
FLUSH_BYTES = 64 << 20  # locator records buffered before they are appended to the runs
SEG_FILE_SIDS = 1 << 16  # segments per segment file (~100 MB of values)
_B, _L, _S = BLOCK_PREFIX[0], LOG_PREFIX[0], SEG_PREFIX[0]
_ID = BLOCK_KEY_ID_AT  # where a locator record's id starts
_MAYBE_LOCATOR = LOCATOR.pack(0, 0)  # what a staged locator lookup answers
_REC = np.dtype(f"V{RECORD}")
_KEY = np.dtype(f"V{KEY_BYTES}")
_VAL = np.dtype(f"V{LOCATOR.size}")

ProgressFn = Callable[[int], None]


class SegmentFiles:
    """Segment values in append-only files, their places in memory (module docstring)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self._fds: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._off = np.full(1024, -1, dtype=np.int64)
        self._len = np.zeros(1024, dtype=np.int32)
        self.count = 0

    def _path(self, f: int) -> Path:
        return self.work_dir / f"segments-{f:06d}.log"

    def _fd(self, f: int) -> int:
        fd = self._fds.get(f)
        if fd is None:
            fd = self._fds[f] = os.open(self._path(f), os.O_RDWR | os.O_CREAT | os.O_APPEND,
                                        0o600)
            self._sizes[f] = 0
        return fd

    def put_many(self, items: list[tuple[int, bytes]]) -> None:
        top = max(sid for sid, _ in items)
        if top >= len(self._off):
            grow = max(top + 1, 2 * len(self._off))
            self._off = np.concatenate([self._off, np.full(grow - len(self._off), -1, np.int64)])
            self._len = np.concatenate([self._len, np.zeros(grow - len(self._len), np.int32)])
        by_file: dict[int, list[tuple[int, bytes]]] = {}
        for sid, value in items:
            by_file.setdefault(sid // SEG_FILE_SIDS, []).append((sid, value))
        for f, group in by_file.items():
            fd, pos = self._fd(f), self._sizes[f]
            for sid, value in group:
                if self._off[sid] < 0:
                    self.count += 1
                self._off[sid], self._len[sid] = pos, len(value)
                pos += len(value)
            os.write(fd, b"".join(v for _, v in group))
            self._sizes[f] = pos

    def get(self, sid: int) -> bytes | None:
        if sid >= len(self._off) or self._off[sid] < 0:
            return None
        return os.pread(self._fds[sid // SEG_FILE_SIDS], int(self._len[sid]),
                        int(self._off[sid]))

    def delete(self, sid: int) -> None:
        if sid < len(self._off) and self._off[sid] >= 0:
            self._off[sid] = -1
            self.count -= 1

    def items(self, consume: bool) -> Iterator[tuple[bytes, bytes]]:
        """(segment key, value) in id order; with `consume`, each file is deleted once
        read."""
        for f in sorted(self._fds):
            fd = self._fds[f]
            data = os.pread(fd, self._sizes[f], 0)
            lo = f * SEG_FILE_SIDS
            hi = min(lo + SEG_FILE_SIDS, len(self._off))
            sids = np.flatnonzero(self._off[lo:hi] >= 0) + lo
            offs, lens = self._off[sids].tolist(), self._len[sids].tolist()
            if consume:
                os.close(self._fds.pop(f))
                self._path(f).unlink()
            for sid, off, n in zip(sids.tolist(), offs, lens, strict=True):
                yield seg_key(sid), data[off:off + n]
            del data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class Staging:
    """The write path's backend during a bulk build (module docstring)."""

    name = "staging"
    persistent = False
    direct_io = False  # memory and files of its own: no engine reads to bypass

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        self._data: dict[bytes, bytes] = {}
        self._segs = SegmentFiles(work_dir)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.locators = 0  # records appended (a key written twice counts twice)
        self.log_records = 0  # change-log records dropped

    def _run(self, i: int) -> Path:
        return self.work_dir / f"locators-{i:02x}.run"

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        data, segs = self._data, self._segs
        out: list[bytes | None] = []
        for k in keys:
            if k[0] == _S:
                out.append(segs.get(seg_id_of_key(k)))
            elif k[0] == _B:
                # locators are spilled to run files, not kept: a lookup cannot prove a
                # block absent, so it answers "may be indexed" (exact matching then reads
                # its rounds instead of settling by the locator; a bulk build takes no
                # parent inserts and no removal by id, the only readers of the value)
                out.append(_MAYBE_LOCATOR)
            else:
                out.append(data.get(k))
        return out

    def write(self, batch: WriteBatch, sync: bool) -> None:
        if any(k[0] == _B for k in batch.deletes):
            raise BadRequest("a bulk build removes no block locators")
        for k in batch.deletes:
            if k[0] == _S:
                self._segs.delete(seg_id_of_key(k))
            else:
                self._data.pop(k, None)
        puts = batch.puts
        locs = [k + v for k, v in puts.items() if k[0] == _B]
        if locs:
            joined = b"".join(locs)
            if len(joined) != RECORD * len(locs):
                raise ValueError(f"locator records of {len(joined) / len(locs):.1f} B, "
                                 f"expected {RECORD}")
            self._pending.append(joined)
            self._pending_bytes += len(joined)
            self.locators += len(locs)
        if len(locs) < len(puts):
            logs = 0
            segs: list[tuple[int, bytes]] = []
            for k, v in puts.items():
                if k[0] == _S:
                    segs.append((seg_id_of_key(k), v))
                elif k[0] == _L:
                    logs += 1
                elif k[0] != _B:
                    self._data[k] = v
            if segs:
                self._segs.put_many(segs)
            self.log_records += logs
        if self._pending_bytes >= FLUSH_BYTES:
            self._spill()

    def _spill(self) -> None:
        """Append the buffered locator records to their runs (by the id's first byte)."""
        if not self._pending:
            return
        recs = np.frombuffer(b"".join(self._pending), dtype=_REC)
        self._pending, self._pending_bytes = [], 0
        run = recs.view(np.uint8).reshape(-1, RECORD)[:, _ID]  # the id's first byte
        order = np.argsort(run, kind="stable")
        bounds = np.searchsorted(run[order], np.arange(RUNS + 1))
        recs = recs[order]
        for i in np.flatnonzero(np.diff(bounds)).tolist():
            with open(self._run(i), "ab") as fh:
                fh.write(recs[bounds[i]:bounds[i + 1]].tobytes())

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Keys outside the locators (what the write path and recovery scan)."""
        if start < SEG_PREFIX + b"\xff" * 8 and end > SEG_PREFIX:
            for k, v in self._segs.items(consume=False):
                if start <= k < end:
                    yield k, v
        for k in sorted(k for k in self._data if start <= k < end):
            yield k, self._data[k]

    def sync(self) -> None:
        """Nothing to make durable: the data set is written by `BulkBuilder.finish`."""

    def resume(self) -> None:
        """Nothing to do: staging writes do not fail half-way."""

    def flush_buffers(self) -> None:
        """Nothing to do: segment values are appended to their files as they come."""

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        return ingest_by_batches(self, items)

    def copy_to(self, dest: Path) -> None:
        raise BackendIOError(f"staging: copy_to {dest}: a bulk build's staging holds no "
                             "store yet (copy the built data directory)")

    def close(self) -> None:
        self._data = {}
        self._pending = []
        self._segs.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def stats(self) -> dict[str, int | float | str]:
        return {"backend": self.name, "disk_bytes": 0, "memory_bytes": 0,
                "keys": len(self._data),
                "locator_records": self.locators, "log_records_dropped": self.log_records}

    @property
    def items_total(self) -> int:
        """Items `sorted_items` yields at most (before duplicate locators are dropped)."""
        return len(self._data) + self._segs.count + self.locators

    def sorted_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every staged record in key order: the keys below the locators, the locator
        runs one by one (each sorted), the keys between, the segments in id order,
        the rest. Each run and segment file is deleted once read."""
        self._spill()
        data = self._data
        keys = sorted(data)
        for k in (k for k in keys if k[0] < _B):
            yield k, data[k]
        for i in range(RUNS):
            yield from self._sorted_run(i)
        for k in (k for k in keys if _B < k[0] < _S):
            yield k, data[k]
        yield from self._segs.items(consume=True)
        for k in (k for k in keys if k[0] > _S):
            yield k, data[k]

    def _sorted_run(self, i: int) -> Iterator[tuple[bytes, bytes]]:
        path = self._run(i)
        if not path.exists():
            return
        recs = np.fromfile(path, dtype=_REC)
        raw = recs.view(np.uint8).reshape(-1, RECORD)
        hi = raw[:, _ID:_ID + 8].copy().view(">u8").ravel()  # the id's bytes, as RocksDB
        lo = raw[:, _ID + 8:KEY_BYTES].copy().view(">u8").ravel()  # orders them
        order = np.lexsort((lo, hi))  # stable: equal keys stay in write order
        hi, lo, recs = hi[order], lo[order], recs[order]
        last = np.ones(len(recs), dtype=bool)  # the last record of each key wins
        last[:-1] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
        recs = recs[last]
        raw = recs.view(np.uint8).reshape(-1, RECORD)
        keys = np.ascontiguousarray(raw[:, :KEY_BYTES]).view(_KEY).ravel().tolist()
        vals = np.ascontiguousarray(raw[:, KEY_BYTES:]).view(_VAL).ravel().tolist()
        del recs, raw, hi, lo, order, last
        path.unlink()
        yield from zip(keys, vals, strict=True)


@dataclass(frozen=True, slots=True)
class BulkReport:
    blocks: int
    segments: int
    items: int  # backend records written
    locators: int
    routing_points: int
    directory_bytes: int


class BulkBuilder:
    """Inserts through the write path into staging (`insert_many`), then `finish`
    writes the data set into an empty backend and its snapshot. Not thread-safe."""

    def __init__(self, cfg: IndexConfig, work_dir: Path, kernels: Kernels | None = None
                 ) -> None:
        self.staging = Staging(work_dir)
        # no block map: every new block's locator record is staged (sorted on disk in
        # runs), as the map spills it; the data then needs no map (its snapshot's is empty)
        self.index = SarpIndex(self.staging, replace(cfg, block_map_bytes=0), None, sync=False,
                               kernels=kernels)
        self.index.recover()

    def insert_many(self, ops: Sequence[Insert]) -> list[InsertResult | RemoveResult | SarpError]:
        """`SarpIndex.write_many` of inserts from position 0 (a bulk build takes no
        `parent`: its blocks may be anywhere in what is staged)."""
        for op in ops:
            if op.parent is not None:
                raise BadRequest(f"insert {op.id}: parent: a bulk build takes whole "
                                 "sequences from position 0, not parent inserts")
        return self.index.write_many(ops)

    @property
    def blocks(self) -> int:
        return self.index.counters.blocks

    def finish(self, backend: Backend, snapshot_dir: Path,
               progress: ProgressFn | None = None) -> BulkReport:
        """Write everything staged into `backend` (empty: a new data set) in one sorted
        ingest, then the directory's snapshot into `snapshot_dir`; the staging files
        are removed. `progress(n)` counts records written."""
        total = self.staging.items_total
        items = self.staging.sorted_items()
        if progress is not None:
            items = _counted(items, progress)
        with backend_errors():
            written = backend.ingest(items)
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.index.snapshot_dir = snapshot_dir
        self.index.snapshot()
        ix = self.index
        report = BulkReport(ix.counters.blocks, ix.counters.segments, written,
                            self.staging.locators, ix.dir.entries, ix.dir.nbytes)
        if progress is not None and written < total:
            progress(total - written)  # duplicate locators (a key written twice)
        self.close()
        return report

    def close(self) -> None:
        self.staging.close()


def _counted(items: Iterator[tuple[bytes, bytes]], progress: ProgressFn,
             every: int = 65536) -> Iterator[tuple[bytes, bytes]]:
    n = 0
    for item in items:
        yield item
        n += 1
        if n == every:
            progress(n)
            n = 0
    if n:
        progress(n)
