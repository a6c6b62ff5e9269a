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
- `ingest`: load many (key, value) pairs given in strictly increasing key order (a
  bulk load of a new data set: `sarpctl import`, the bench's preload). RocksDB writes
  them as sorted table files and ingests those; every other engine honours it through
  `ingest_by_batches` (write batches of INGEST_BATCH_BYTES, one sync at the end).
  Durable when it returns. Keys out of order raise ValueError (a caller's bug) before
  anything of the offending item is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from backends.errors import BackendIOError


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

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Put every (key, value) of `items` (strictly increasing keys; need not fit in
        memory), durably; returns how many. The optional bulk ability: an engine
        without a faster way returns `ingest_by_batches(self, items)`."""
        ...

    def copy_to(self, dest: Path) -> None:
        """A consistent copy of everything written so far into the new directory
        `dest` (which must not exist; its parent must), that this engine opens as it
        would reopen its own directory; this backend stays open and writable. The
        checkpoint a new replica starts from (issue 15). RocksDB: its checkpoint (hard
        links); WiredTiger: a hot backup (backup cursor); BloomStore: its files after
        a checkpoint. An engine that keeps nothing on disk raises BackendIOError."""
        ...


def check_copy_dest(engine: str, path: Path, dest: Path) -> None:
    """`Backend.copy_to`'s rule for `dest`: new, in an existing directory, not inside
    the store it copies (BackendIOError naming both)."""
    if dest.exists():
        raise BackendIOError(f"{engine} {path}: copy_to {dest}: it already exists")
    if not dest.parent.is_dir():
        raise BackendIOError(f"{engine} {path}: copy_to {dest}: no directory {dest.parent}")
    if dest.resolve().is_relative_to(path.resolve()):
        raise BackendIOError(f"{engine} {path}: copy_to {dest}: inside the store itself")


INGEST_BATCH_BYTES = 8 << 20  # the fallback's write batches (keys + values)


def sorted_items(items: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """`items`, checked to be in strictly increasing key order (ValueError naming the
    first pair out of order)."""
    last: bytes | None = None
    for key, value in items:
        if last is not None and key <= last:
            raise ValueError(f"ingest: key {key.hex()} does not follow {last.hex()} "
                             "(keys must be strictly increasing)")
        last = key
        yield key, value


def ingest_by_batches(backend: Backend, items: Iterable[tuple[bytes, bytes]],
                      batch_bytes: int = INGEST_BATCH_BYTES) -> int:
    """The fallback of `Backend.ingest`: write batches of about `batch_bytes`, unsynced,
    then one `sync` (durable on return)."""
    n = size = 0
    wb = WriteBatch()
    for key, value in sorted_items(items):
        wb.puts[key] = value
        n += 1
        size += len(key) + len(value)
        if size >= batch_bytes:
            backend.write(wb, False)
            wb, size = WriteBatch(), 0
    if len(wb):
        backend.write(wb, False)
    backend.sync()
    return n

