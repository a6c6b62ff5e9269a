"""The harness's shared vocabulary: what a workload yields and what every index under
test (sarp and each baseline) implements.

Block ids in the harness are uint64 (engine-hash style: prefix-chained, so an id
alone identifies its whole prefix); sarp receives them as `hashes`. Every index sees
exactly the same ids, in the same order, in the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

Ids = npt.NDArray[np.uint64]  # 1-D: one uint64 block id per 16-token block

BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True, eq=False)
class Turn:
    """One request of a replay: match `prompt`, then insert `sequence`.

    `prompt` is a prefix of `sequence` (the accumulated history plus the new input);
    `sequence` adds what the turn produced (output blocks), if the workload indexes
    them. Metadata of a block is the workload's business (the runner uses the turn
    number)."""

    session: int
    ns: str
    prompt: Ids
    sequence: Ids


class Workload(Protocol):
    name: str

    def describe(self) -> str:
        """One line: the shape (sessions, turns, tokens per turn, sharing)."""
        ...

    def turns(self) -> Iterator[Turn]:
        """The replay order (sessions round-robin; trace rows in file order).
        Deterministic for a given seed."""
        ...


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """A cold restart on the data of a full index. `seconds`: in-process time to open
    the data, load what the index keeps in memory and answer the first match (timed
    inside a fresh process after its imports: no interpreter start); `spawn_s`: from
    spawning that process (redis: restarting redis-server) to its first answer."""

    seconds: float
    spawn_s: float
    detail: str = ""


def fastest(runs: Sequence[RecoveryResult]) -> RecoveryResult:
    """The fastest of repeated recoveries of one index (each timing's minimum, as
    timeit reports: interference on a shared machine only ever adds time), with the
    fastest run's detail and how many were timed."""
    if not runs:
        raise ValueError("fastest: no recovery was timed")
    best = min(runs, key=lambda r: r.seconds)
    spawn = min(r.spawn_s for r in runs)
    note = f"fastest of {len(runs)} recoveries" if len(runs) > 1 else "one recovery"
    return RecoveryResult(best.seconds, spawn, f"{best.detail}; {note}" if best.detail else note)


class BenchIndex(Protocol):
    """An index under test. One instance per run; `open` creates it under `data_dir`.

    `cache_bytes` is the run's ONE memory budget: the engine's memory (its cache, write
    buffers, index and filter blocks: the backend's `cache_bytes` is all of it) plus
    every cache the index keeps itself must fit in it. `direct_io`: the backend reads around the
    OS page cache (backends.registry), so that budget is the only cache of the data."""

    name: str

    def open(self, data_dir: Path, backend: str, cache_bytes: int,
             direct_io: bool = False) -> None: ...

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[npt.NDArray[np.uint64]]:
        """Per prompt: the metadata of every matched block, from position 0 (its length
        is the number of matched blocks)."""
        ...

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        """Index every block of every sequence (first insert wins), durably as the
        backend's sync policy of the run says, before returning."""
        ...

    def flush(self) -> None:
        """Make everything inserted durable and ready for a cold restart."""
        ...

    def recover(self) -> RecoveryResult:
        """Close, then measure a cold restart of this index on the same data (see
        RecoveryResult), then reopen it here."""
        ...

    def memory_bytes(self) -> int:
        """What the index holds in memory inside the budget, from the engine's and its
        own counters: the engine's cache in use, its write buffers / memtables and the
        index's own caches (in-memory indexes: their whole footprint)."""
        ...

    def routing_bytes(self) -> int:
        """Routing structures kept in memory outside the budget (sarp's directory,
        segment-radix's capped tree); 0 for an index that has none."""
        ...

    def backend_reads(self) -> int:
        """Backend point reads (keys or segments fetched) since open, cumulative."""
        ...

    def disk_bytes(self) -> int: ...

    def close(self) -> None: ...
