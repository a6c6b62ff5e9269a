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
    seconds: float  # cold start (process start or reopen) to the first answered match
    detail: str = ""


class BenchIndex(Protocol):
    """An index under test. One instance per run; `open` creates it under `data_dir`."""

    name: str

    def open(self, data_dir: Path, backend: str, cache_bytes: int) -> None: ...

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
        """Close, then measure a cold restart of this index on the same data: from
        process start (or reopen) to the first answered match."""
        ...

    def memory_bytes(self) -> int:
        """Resident memory of the index's own structures (not the backend cache)."""
        ...

    def disk_bytes(self) -> int: ...

    def close(self) -> None: ...
