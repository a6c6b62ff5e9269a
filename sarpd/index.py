"""SarpIndex: match / insert / remove / clear over a Backend. Synchronous and pure:
no I/O but the backend interface and the snapshot directory.

API SKELETON: being implemented.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.base import Backend
from sarpd.config import IndexConfig
from sarpd.errors import SarpError
from sarpd.model import (
    CheckReport,
    Clear,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Remove,
    RemoveResult,
    SnapshotResult,
)

WriteOp = Insert | Remove | Clear


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    seconds: float
    snapshot_segment_id: int  # 0 when no snapshot was usable
    segments_rerouted: int
    full_scan: bool
    warning: str | None = None


ProgressFn = Callable[[int, int], None]  # (done, total_estimate)


class SarpIndex:
    def __init__(
        self,
        backend: Backend,
        config: IndexConfig,
        snapshot_dir: Path | None = None,
        sync: bool = True,
    ) -> None:
        raise NotImplementedError

    def recover(self, progress: ProgressFn | None = None) -> RecoveryReport:
        """Load the newest valid snapshot, re-route newer segments (or full scan)."""
        raise NotImplementedError

    def match_many(self, reqs: Sequence[Match]) -> list[MatchResult | SarpError]:
        """One backend multi-get for all candidates of the batch."""
        raise NotImplementedError

    def write_many(self, ops: Sequence[WriteOp]) -> list[InsertResult | RemoveResult | SarpError]:
        """Apply inserts/removes/clears in order; ONE backend write batch (one fsync
        under sync=always) at the end. Per-op errors (bad meta length, unknown parent)
        are returned in place; a StorageError from the commit is raised and nothing
        of the batch is acknowledged."""
        raise NotImplementedError

    def snapshot(self) -> SnapshotResult:
        raise NotImplementedError

    def check(self, fix: bool = False) -> CheckReport:
        raise NotImplementedError

    def stats(self) -> dict[str, int | float | str]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
