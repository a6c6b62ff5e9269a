"""The one storage interface every engine implements.

Keys and values are opaque bytes. sarp uses a few key spaces, each a one-byte
prefix (see sarpd/core/segment.py): segments keyed by a big-endian segment id so that
"every segment newer than X" is an ordered range scan, and small per-block entries.
An implementation must:
- `get_many`: return one value (or None) per key, in order; one engine call where
  the engine has a multi-get.
- `write`: apply every put and delete of the batch atomically; when `sync` is true,
  return only once the batch is durable (fsync'd). Raise `BackendIOError`
  (backends/errors.py) when it could not persist (then nothing of the batch is visible).
- `scan`: yield (key, value) for start <= key < end in key order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(slots=True)
class WriteBatch:
    """Puts and deletes applied together; a later operation on the same key wins."""

    puts: dict[bytes, bytes] = field(default_factory=dict)
    deletes: set[bytes] = field(default_factory=set)

    def put(self, key: bytes, value: bytes) -> None:
        self.deletes.discard(key)
        self.puts[key] = value

    def put_many(self, items: dict[bytes, bytes]) -> None:
        """Many puts at once (one C-level update, no per-key Python work)."""
        if self.deletes:
            self.deletes.difference_update(items)
        self.puts.update(items)

    def delete(self, key: bytes) -> None:
        self.puts.pop(key, None)
        self.deletes.add(key)

    def __len__(self) -> int:
        return len(self.puts) + len(self.deletes)


@runtime_checkable
class Backend(Protocol):
    name: str
    # whether data written survives close() and a reopen (the in-memory test backend
    # does not: the contract suite then skips its reopen and crash cases)
    persistent: bool
    # whether reads bypass the OS page cache (opened with direct_io=True: the engine's
    # own cache is then the only cache; see `BackendFactory` in backends/registry.py)
    direct_io: bool

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    def write(self, batch: WriteBatch, sync: bool) -> None: ...

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def sync(self) -> None:
        """Make everything written so far durable."""
        ...

    def flush_buffers(self) -> None:
        """Write the engine's in-memory write buffers (memtables, dirty cache pages)
        to its files, so that later reads hit its cache or the disk (the bench calls
        it after filling an index)."""
        ...

    def resume(self) -> None:
        """Make the engine writable again after a failed write or sync (RocksDB stays
        read-only after a background error until reopened); a no-op where the engine
        needs nothing. Raises when the cause persists."""
        ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, int | float | str]:
        """Engine counters: at least `disk_bytes` and `memory_bytes` (what the engine
        holds in memory now: its cache in use, write buffers / memtables and any
        per-table index it keeps outside the cache)."""
        ...

