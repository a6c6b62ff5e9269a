"""MemoryBackend: a dict plus a sorted key view. The oracle of the contract tests.

Nothing survives `close()` (`persistent = False`). Every call is thread-safe (one
lock). `scan` takes its snapshot of the range when the first item is requested, like
a RocksDB iterator: later writes do not show up in a scan already started.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from backends.base import WriteBatch, ingest_by_batches
from backends.errors import BackendIOError


class MemoryBackend:
    name = "memory"
    persistent = False

    def __init__(self, path: Path | None = None, cache_bytes: int = 0, *,
                 direct_io: bool = False) -> None:
        # path, cache_bytes and direct_io are accepted so that every registered backend
        # opens the same way; a memory backend reads no file, so it honours direct_io.
        self.path = path
        self.direct_io = direct_io
        self._data: dict[bytes, bytes] = {}
        self._sorted: list[bytes] = []
        self._sorted_valid = True
        self._lock = threading.Lock()
        self._closed = False
        self._writes = 0

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise BackendIOError(f"memory backend ({self.path}): {action} after close")

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self._lock:
            self._check_open("get_many")
            data = self._data
            return [data.get(k) for k in keys]

    def write(self, batch: WriteBatch, sync: bool) -> None:
        with self._lock:
            self._check_open("write")
            data = self._data
            for key in batch.deletes:
                if data.pop(key, None) is not None:
                    self._sorted_valid = False
            for key, value in batch.puts.items():
                if key not in data:
                    self._sorted_valid = False
                data[key] = bytes(value)
            self._writes += 1

    def _range(self, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        with self._lock:
            self._check_open("scan")
            if not self._sorted_valid:
                self._sorted = sorted(self._data)
                self._sorted_valid = True
            keys = self._sorted
            lo = bisect.bisect_left(keys, start)
            hi = bisect.bisect_left(keys, end, lo)
            return [(k, self._data[k]) for k in keys[lo:hi]]

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        yield from self._range(start, end)

    def sync(self) -> None:
        with self._lock:
            self._check_open("sync")

    def flush_buffers(self) -> None:
        """Nothing to do: there is no write buffer in front of the data."""
        with self._lock:
            self._check_open("flush_buffers")

    def resume(self) -> None:
        """Nothing to do: a failed write leaves this engine writable."""

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        return ingest_by_batches(self, items)

    def copy_to(self, dest: Path) -> None:
        raise BackendIOError(f"memory: copy_to {dest}: this backend keeps nothing on disk "
                             "(not persistent)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._data = {}
            self._sorted = []
            self._sorted_valid = True

    def stats(self) -> dict[str, int | float | str]:
        with self._lock:
            return {
                "backend": self.name,
                "disk_bytes": 0,
                "estimate_num_keys": len(self._data),
                "value_bytes": sum(len(v) for v in self._data.values()),
                "memory_bytes": sum(len(k) + len(v) for k, v in self._data.items()),
                "write_batches": self._writes,
                "open": int(not self._closed),
            }
