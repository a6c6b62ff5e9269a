"""sarp itself behind the harness interface (tools.bench.api.BenchIndex).

Block ids go in as `hashes` (64-bit engine-style ids, zero-extended), so sarp sees
the same ids as every baseline. `flush` writes a snapshot (what a clean shutdown of
sarpd does); `recover` measures a cold restart in a fresh process: open the backend,
load the snapshot, re-route what changed after it, answer one match.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from backends.base import Backend
from sarpd.config import IndexConfig
from sarpd.core.bulk import BulkBuilder
from sarpd.core.index import SarpIndex
from sarpd.core.store import open_backend
from sarpd.model import Insert, Match, MatchResult, SeqSpec
from tools.bench.api import Ids, RecoveryResult

U64 = npt.NDArray[np.uint64]


def as_hashes(ids: Ids) -> npt.NDArray[np.uint64]:
    out = np.zeros((len(ids), 2), dtype=np.uint64)
    out[:, 0] = ids
    return out


class SarpBench:
    """SARP: segments of 64 blocks on the backend, the routing directory in memory."""

    name = "sarp"

    def __init__(self, config: IndexConfig | None = None, sync: bool = False) -> None:
        self.config = config or IndexConfig()
        self.sync = sync
        self.ix: SarpIndex | None = None
        self.backend: Backend | None = None
        self.data_dir = Path()
        self.backend_name = "rocksdb"
        self.cache_bytes = 0

    def open(self, data_dir: Path, backend: str, cache_bytes: int) -> None:
        self.data_dir, self.backend_name, self.cache_bytes = data_dir, backend, cache_bytes
        self.ix = _open(data_dir, backend, cache_bytes, self.config, self.sync)
        self.ix.recover()

    def bulk_open(self, data_dir: Path, backend: str, cache_bytes: int,
                  batches: Iterable[tuple[Sequence[Ids], Sequence[str], Sequence[U64]]],
                  progress: Callable[[int], None] | None = None) -> None:
        """`open` on a directory built by sarp's bulk path (sarpd/core/bulk.py: the
        write path into staging, one sorted ingest, a snapshot) from `batches` of
        `insert_many` arguments."""
        builder = BulkBuilder(self.config, data_dir / "bulk.tmp")
        try:
            for seqs, ns, metas in batches:
                self.ix = builder.index
                self.insert_many(seqs, ns, metas)
                if progress is not None:
                    progress(sum(len(s) for s in seqs))
            be = open_backend(backend, data_dir / backend, cache_bytes=cache_bytes)
            try:
                builder.finish(be, data_dir / "snapshots")
            finally:
                be.close()
        finally:
            self.ix = None
            builder.close()
        self.open(data_dir, backend, cache_bytes)

    def _index(self) -> SarpIndex:
        assert self.ix is not None, "open() first"
        return self.ix

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        reqs = [Match(i, SeqSpec(n, hashes=as_hashes(p))) for i, (p, n) in
                enumerate(zip(prompts, ns, strict=True))]
        out: list[U64] = []
        for r in self._index().match_many(reqs):
            assert isinstance(r, MatchResult), r
            out.append(r.meta)
        return out

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str], metas: Sequence[U64]) -> None:
        reqs = [Insert(i, SeqSpec(n, hashes=as_hashes(s)), meta=m) for i, (s, n, m) in
                enumerate(zip(seqs, ns, metas, strict=True))]
        for r in self._index().write_many(reqs):
            assert not isinstance(r, Exception), r

    def flush(self) -> None:
        self._index().snapshot()

    def recover(self) -> RecoveryResult:
        """Timed like every baseline: from spawning a fresh process to its first
        answered match (interpreter start and imports included)."""
        self.close()
        cmd = [sys.executable, "-m", "tools.bench.sarp_index", "--data-dir", str(self.data_dir),
               "--backend", self.backend_name, "--cache-bytes", str(self.cache_bytes)]
        if not self.config.block_locators:
            cmd.append("--no-block-locators")
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
        self.open(self.data_dir, self.backend_name, self.cache_bytes)
        return RecoveryResult(seconds, f"after imports {out['seconds']:.4f} s; snapshot + "
                              f"change log, {out['rerouted']} segments re-routed")

    def memory_bytes(self) -> int:
        return self._index().dir.nbytes

    def disk_bytes(self) -> int:
        snaps = sum(p.stat().st_size for p in (self.data_dir / "snapshots").glob("*.snap"))
        return int(self._index().backend.stats().get("disk_bytes", 0)) + snaps

    def stats(self) -> dict[str, int | float | str]:
        return self._index().stats()

    def close(self) -> None:
        if self.ix is not None:
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


def _open(data_dir: Path, backend: str, cache_bytes: int, config: IndexConfig,
          sync: bool) -> SarpIndex:
    be = open_backend(backend, data_dir / backend, cache_bytes=cache_bytes)
    return SarpIndex(be, config, data_dir / "snapshots", sync=sync)


def _cold_recovery() -> None:
    """Child process: time from here (imports done) to the first answered match."""
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--backend", default="rocksdb")
    p.add_argument("--cache-bytes", type=int, default=8 << 20)
    p.add_argument("--no-block-locators", action="store_true")
    a = p.parse_args()
    t0 = time.perf_counter()
    config = IndexConfig(block_locators=not a.no_block_locators)
    ix = _open(a.data_dir, a.backend, a.cache_bytes, config, False)
    rep = ix.recover()
    ix.match_many([Match(0, SeqSpec("", hashes=as_hashes(np.arange(1, 5, dtype=np.uint64))))])
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "rerouted": rep.segments_rerouted,
                      "full_scan": rep.full_scan}), flush=True)
    ix.close()


if __name__ == "__main__":
    _cold_recovery()
