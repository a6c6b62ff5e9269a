"""sarp itself behind the harness interface (tools.bench.api.BenchIndex).

Block ids go in as `hashes` (64-bit engine-style ids, zero-extended), so sarp sees
the same ids as every baseline. `flush` writes a snapshot (what a clean shutdown of
sarpd does) and the engine's write buffers; `recover` measures a cold restart in a
fresh process (tools.bench.sarp_recover, which imports only what a restart needs):
open the backend, load the snapshot, re-route what changed after it, answer one
match (`seconds` from after the child's imports, `spawn_s` from its spawn).

The budget (tools.bench.sarp_recover.split_budget): sarp's decoded-segment cache is
its own cache, so it is sized from the run's budget and the engine gets the rest
as its `cache_bytes`, which is its whole memory (RocksDB: block cache, memtables,
index and filter partitions; backends/rocksdb.py), also for the bulk build's
backend. memory_bytes = the engine's memory (backends.base stats)
+ the decoded segments held (measured) + the block map and the segments with delta
records (their own byte counts, issue 24); routing_bytes = the directory;
backend_reads = `activity.segment_reads` (segments fetched from the backend).

`sarp-py` (`reference()`) is sarp with every native path replaced by its reference
(its index, bulk builder and recovery child are built with
`sarpd.core.native.pick(reference=True)`): same build, same run, same process.
`native()` says which paths run natively for the index (match, hash, write; a path
the install does not know reads False). Kernel efficiency: every
match call records the keys it read (segments asked of the store, cached or not,
and locators looked up); `bare_reread()` re-reads them with ONE bare backend
multi-get right after (warm), timed: sarp's match time over that time is the CPU it
spends beyond its reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path

import numpy as np
import numpy.typing as npt

from backends.base import Backend
from sarpd.config import IndexConfig
from sarpd.core import BulkBuilder, SarpIndex, Segment, Store, block_keys, open_backend, seg_key
from sarpd.core import native as native_paths
from sarpd.model import IdArray, Insert, Match, MatchResult, SeqSpec
from tools.bench.api import Ids, RecoveryResult
from tools.bench.sarp_recover import (
    ARRAY_HEADER,
    open_index,
    split_budget,
)
from tools.bench.spawn import compile_bytecode

U64 = npt.NDArray[np.uint64]
NATIVE_PATHS = ("match", "hash", "write")  # what the bench's `native` field reports
def segment_bytes(ix: SarpIndex) -> int:
    """What the decoded-segment cache holds now (measured per segment, with the view the
    match kernel keeps on it: `Segment._cview`)."""
    return sum(sys.getsizeof(seg) + 2 * ARRAY_HEADER + seg.ids.nbytes + seg.meta.nbytes
               + (0 if seg._cview is None else sys.getsizeof(seg._cview))
               for _, seg in ix.store.cached_segments())


def as_hashes(ids: Ids) -> npt.NDArray[np.uint64]:
    out = np.zeros((len(ids), 2), dtype=np.uint64)
    out[:, 0] = ids
    return out


def as_hashes_many(batch: Sequence[Ids]) -> list[npt.NDArray[np.uint64]]:
    """`as_hashes` of every prompt of a batch: views of one array (two numpy calls a
    batch, not two a prompt: the adapter's cost stays out of the match it times)."""
    at = [0, *accumulate(len(ids) for ids in batch)]
    out = np.zeros((at[-1], 2), dtype=np.uint64)
    if batch:
        out[:, 0] = np.concatenate(batch)
    return [out[lo:hi] for lo, hi in pairwise(at)]


class SarpBench:
    """SARP: segments of 64 blocks on the backend, the routing directory in memory."""

    name = "sarp"

    def __init__(self, config: IndexConfig | None = None, sync: bool = False,
                 reference: bool = False) -> None:
        self.config = config or IndexConfig()
        self.sync = sync
        self.reference = reference  # every native path replaced by its reference (sarp-py)
        self.kernels = native_paths.pick(reference=reference)
        self._read = Reads()  # what the last match call read
        self.ix: SarpIndex | None = None
        self.backend: Backend | None = None
        self.data_dir = Path()
        self.backend_name = "rocksdb"
        self.cache_bytes = 0
        self.direct_io = False
        self._reads_before = 0  # segment reads of indexes closed by recover()

    def open(self, data_dir: Path, backend: str, cache_bytes: int,
             direct_io: bool = False) -> None:
        self.data_dir, self.backend_name, self.cache_bytes = data_dir, backend, cache_bytes
        self.direct_io = direct_io
        self.ix = open_index(data_dir, backend, cache_bytes, self.config, self.sync, direct_io,
                             self.kernels)
        self.ix.recover()

    def native(self) -> dict[str, bool]:
        """Per path (match, hash, write): whether it runs natively for this index."""
        status = self.kernels.status()
        return {p: bool(status.get(p, False)) for p in NATIVE_PATHS}

    def bulk_open(self, data_dir: Path, backend: str, cache_bytes: int,
                  batches: Iterable[tuple[Sequence[Ids], Sequence[str], Sequence[U64]]],
                  progress: Callable[[int], None] | None = None,
                  direct_io: bool = False) -> None:
        """`open` on a directory built by sarp's bulk path (sarpd/core/bulk.py: the
        write path into staging, one sorted ingest, a snapshot) from `batches` of
        `insert_many` arguments."""
        self._bulk(data_dir, backend, cache_bytes, batches, progress)
        self.open(data_dir, backend, cache_bytes, direct_io)

    def _bulk(self, data_dir: Path, backend: str, cache_bytes: int,
              batches: Iterable[tuple[Sequence[Ids], Sequence[str], Sequence[U64]]],
              progress: Callable[[int], None] | None) -> None:
        builder = BulkBuilder(self.config, data_dir / "bulk.tmp", self.kernels)
        try:
            for seqs, ns, metas in batches:
                self.ix = builder.index
                self.insert_many(seqs, ns, metas)
                if progress is not None:
                    progress(sum(len(s) for s in seqs))
            be = open_backend(backend, data_dir / backend,
                              cache_bytes=split_budget(cache_bytes)[0])
            try:
                builder.finish(be, data_dir / "snapshots")
            finally:
                be.close()
        finally:
            self.ix = None
            builder.close()

    def _index(self) -> SarpIndex:
        assert self.ix is not None, "open() first"
        return self.ix

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        reqs = [Match(i, SeqSpec(n, hashes=h)) for i, (h, n) in
                enumerate(zip(as_hashes_many(prompts), ns, strict=True))]
        out: list[U64] = []
        self._read.clear()
        with Recording(self._index().store, self._read):
            results = self._index().match_many(reqs)
        for r in results:
            assert isinstance(r, MatchResult), r
            out.append(r.meta)
        return out

    def bare_reread(self) -> float:
        """Seconds of ONE bare backend multi-get of the keys the last match call read."""
        keys = self._read.keys()
        be = self._index().backend
        t0 = time.perf_counter()
        be.get_many(keys)
        return time.perf_counter() - t0

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str], metas: Sequence[U64]) -> None:
        reqs = [Insert(i, SeqSpec(n, hashes=as_hashes(s)), meta=m) for i, (s, n, m) in
                enumerate(zip(seqs, ns, metas, strict=True))]
        results = self._index().write_many(reqs)
        for r in results:
            assert not isinstance(r, Exception), r

    def flush(self) -> None:
        ix = self._index()
        ix.snapshot()
        ix.backend.flush_buffers()

    def recover(self) -> RecoveryResult:
        """Timed like every baseline: in a fresh process, from after its imports to
        its first answered match (`seconds`) and from its spawn (`spawn_s`)."""
        self.close()
        cmd = [sys.executable, "-m", "tools.bench.sarp_recover", "--data-dir", str(self.data_dir),
               "--backend", self.backend_name, "--cache-bytes", str(self.cache_bytes)]
        if not self.config.block_locators:
            cmd.append("--no-block-locators")
        if self.direct_io:
            cmd.append("--direct-io")
        if self.reference:
            cmd.append("--references")
        compile_bytecode()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        seconds = time.perf_counter() - t0
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0 or not line:
            raise RuntimeError(f"sarp: recovery process failed (exit {proc.returncode}): "
                               f"{err[-2000:]}")
        out = json.loads(line)
        self.open(self.data_dir, self.backend_name, self.cache_bytes, self.direct_io)
        return RecoveryResult(out["seconds"], seconds,
                              f"spawn to first match {seconds:.4f} s; snapshot + change log, "
                              f"{out['rerouted']} segments re-routed")

    def memory_bytes(self) -> int:
        ix = self._index()
        held = ix.store.blockmap.nbytes if ix.store.blockmap is not None else 0
        return (int(ix.backend.stats().get("memory_bytes", 0)) + segment_bytes(ix) + held
                + ix.store.pending_bytes)

    def routing_bytes(self) -> int:
        return self._index().dir.nbytes

    def backend_reads(self) -> int:
        reads = self._reads_before
        return reads + (self.ix.activity.segment_reads if self.ix is not None else 0)

    def disk_bytes(self) -> int:
        snaps = sum(p.stat().st_size for p in (self.data_dir / "snapshots").glob("*.snap"))
        return int(self._index().backend.stats().get("disk_bytes", 0)) + snaps

    def stats(self) -> dict[str, int | float | str]:
        return self._index().stats()

    def close(self) -> None:
        if self.ix is not None:
            self._reads_before += self.ix.activity.segment_reads
            self.ix.close()
            self.ix = None


def no_locators(sync: bool = False) -> SarpBench:
    """sarp without per-block locator records (`block_locators = false`): no bare-id
    removal or parent inserts; inserts write one record per segment, not per block."""
    return SarpBench(IndexConfig(block_locators=False), sync=sync)


def capped(sync: bool = False) -> SarpBench:
    """sarp with the paper's capped matching (`exact_match = false`): one round of
    `window_cap` (4) candidates per window, so the price of exactness is measured."""
    return SarpBench(IndexConfig(exact_match=False), sync=sync)


def reference(sync: bool = False) -> SarpBench:
    """sarp-py: sarp with every native path replaced by its reference, same build."""
    return SarpBench(sync=sync, reference=True)


@dataclass(slots=True)
class Reads:
    """What a match call read: segments asked of the store and locators looked up."""

    sids: list[int] = field(default_factory=list)
    ids: list[IdArray] = field(default_factory=list)

    def keys(self) -> list[bytes]:
        """Their backend keys, each once (built after the timed call)."""
        keys = dict.fromkeys(seg_key(s) for s in self.sids)
        for ids in self.ids:
            keys.update(dict.fromkeys(block_keys(ids)))
        return list(keys)

    def clear(self) -> None:
        self.sids.clear()
        self.ids.clear()


class Recording:
    """While inside: every segment the store is asked for (through `fetch` or
    `read_views`, or taken from its segment cache by the match kernel: the cache's
    `trace`) and every locator
    it looks up is recorded in `reads` (list appends: the timed match stays sarp's)."""

    def __init__(self, store: Store, reads: Reads) -> None:
        self.store, self.reads = store, reads

    def __enter__(self) -> None:
        store, reads = self.store, self.reads
        fetch, read_views, indexed = store.fetch, store.read_views, store.indexed

        def fetch_rec(sids: list[int]) -> dict[int, Segment | None]:
            reads.sids.extend(sids)
            return fetch(sids)

        def read_views_rec(sids: list[int]) -> dict[int, object]:
            reads.sids.extend(sids)
            return read_views(sids)

        def indexed_rec(ids: IdArray) -> list[bool]:
            reads.ids.append(ids)
            return indexed(ids)

        store.fetch = fetch_rec  # type: ignore[method-assign]
        store.read_views = read_views_rec  # type: ignore[method-assign]
        store.indexed = indexed_rec  # type: ignore[method-assign]
        store.segment_cache.trace = reads.sids  # the cache's hits, the kernel's included

    def __exit__(self, *exc: object) -> None:
        del self.store.fetch, self.store.read_views, self.store.indexed  # the class's again
        self.store.segment_cache.trace = None


