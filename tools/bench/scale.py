"""Recovery at scale: `sarpctl bench --recovery-only --blocks N`.

Fills each named index with N blocks (sessions of 1,024-block sequences that share
a few system prompts, inserted in large batches, no matching), flushes it (durable,
the engine's write buffers written out), then measures a cold recovery exactly as
the full benchmark does: in a fresh process (or a restarted redis-server), the time
to open, load and answer the first match (`recovery_s`) and the time from its spawn
(`recovery_spawn_s`). An index that fails gets an IndexFailure; the others go on.
sarp is filled by its bulk path (`SarpBench.bulk_open`: the same inserts, staged and
ingested as sorted table files) unless an SSD baseline runs too: every SSD index is
then filled by its own inserts (never an ingested store beside an LSM built by writes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.bench.api import BenchIndex, Ids
from tools.bench.preload import MEMORY_INDEXES
from tools.bench.runner import IndexFailure, failure, index_factories

SEQ_BLOCKS = 1024
BATCH = 32


@dataclass(frozen=True, slots=True)
class ScaleResult:
    index: str
    blocks: int
    build_s: float
    recovery_s: float
    memory_bytes: int
    disk_bytes: int
    detail: str
    recovery_spawn_s: float = 0.0
    routing_bytes: int = 0


def sequences(blocks: int, seed: int = 0) -> Iterator[Ids]:
    """Unique prefix-chained id sequences totalling `blocks`; 1 in 4 starts with one
    of 8 shared 64-block prompts (which are counted once)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, 2**63, 64, dtype=np.uint64) for _ in range(8)]
    done = 0
    while done < blocks:
        n = min(SEQ_BLOCKS, blocks - done)
        seq = rng.integers(1, 2**63, n, dtype=np.uint64)
        if n > 64 and rng.random() < 0.25:
            seq[:64] = prompts[int(rng.integers(0, 8))]
        done += n
        yield seq


def fill(index: BenchIndex, blocks: int, progress: Callable[[int], None] | None,
         seed: int = 0) -> None:
    for seqs, ns, metas in _batches(blocks, seed):
        index.insert_many(seqs, ns, metas)
        if progress is not None:
            progress(sum(len(s) for s in seqs))


def _batches(blocks: int, seed: int = 0) -> Iterator[tuple[list[Ids], list[str], list[Ids]]]:
    """`insert_many` arguments: BATCH sequences at a time, meta = block position."""
    batch: list[Ids] = []
    for seq in sequences(blocks, seed):
        batch.append(seq)
        if len(batch) == BATCH:
            yield batch, [""] * len(batch), [np.arange(len(s), dtype=np.uint64) for s in batch]
            batch = []
    if batch:
        yield batch, [""] * len(batch), [np.arange(len(s), dtype=np.uint64) for s in batch]


def scale_budget(blocks: int) -> int:
    """Every index's memory budget at `blocks`: 10 % of the uncompressed SSD-BlockHash
    store (16 B per block), at least 1 MiB, as in the full benchmark."""
    return max(1 << 20, blocks * 16 // 10)


def recovery_at_scale(names: Sequence[str], blocks: int, backend: str, data_dir: Path,
                      progress: Callable[[str, int], Callable[[int], None]] | None = None,
                      direct_io: bool = False) -> list[ScaleResult | IndexFailure]:
    factories = index_factories()
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(f"unknown index {', '.join(unknown)} (known: {', '.join(factories)})")
    cache = scale_budget(blocks)
    bulk = all(n in MEMORY_INDEXES or n.startswith("sarp") for n in names)
    out: list[ScaleResult | IndexFailure] = []
    for name in names:
        try:
            out.append(_one(name, factories[name](), blocks, backend, data_dir, cache,
                            progress(name, blocks) if progress else None, direct_io, bulk))
        except Exception as exc:  # one index failing must not cost the others' results
            out.append(failure(name, exc))
    return out


def _one(name: str, index: BenchIndex, blocks: int, backend: str, data_dir: Path, cache: int,
         progress: Callable[[int], None] | None, direct_io: bool, bulk: bool) -> ScaleResult:
    t0 = time.perf_counter()
    bulk_open = getattr(index, "bulk_open", None)
    if bulk and bulk_open is not None:
        bulk_open(data_dir / name, backend, cache, _batches(blocks), progress, direct_io)
    else:
        index.open(data_dir / name, backend, cache, direct_io)
    try:
        if not (bulk and bulk_open is not None):
            fill(index, blocks, progress)
        index.flush()
        build = time.perf_counter() - t0
        memory, disk = index.memory_bytes(), index.disk_bytes()
        rec = index.recover()
        routing = index.routing_bytes()
    finally:
        index.close()
    return ScaleResult(name, blocks, build, rec.seconds, memory, disk, rec.detail,
                       rec.spawn_s, routing)
