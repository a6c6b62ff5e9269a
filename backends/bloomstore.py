"""BloomStoreBackend: sarp's Backend protocol over the standalone `bloomstore` engine.

The engine (bloomstore/, see its README) hash-partitions keys, keeps one write buffer
per partition in RAM, flushes full buffers as immutable KV pages and keeps the pages'
Bloom filters on flash in bit-sliced chains; a write-ahead log makes every batch
atomic and, with sync=True, durable before `write` returns. No per-key index is held
in RAM. Ordered scans merge pages chosen by a per-page zone map (prefix bounds of
each key space), so sarp's b"L" change-log scans after a snapshot read only the
pages written since.

Error mapping (into backends/errors.py): engine corruption (checksum or layout) ->
BackendCorrupt; a file in a format version this build does not read ->
BackendFormatError; a limit or tunable out of range, or a geometry that differs from
the stored one -> BackendConfigError; every other engine failure (I/O, closed store,
directory already open) -> BackendIOError. Each message names the directory.

`cache_bytes` is the engine's page cache (verified pages); `direct_io` makes page
reads bypass the OS page cache (`Tuning.direct_io`: posix_fadvise DONTNEED after
each read and after each fsync of a page file). Other engine tunables can be passed
as keyword arguments (`Tuning` fields) by code that opens the class directly; the
registry passes only `cache_bytes` and `direct_io`. `stats()["memory_bytes"]`: the
page cache in use, the write buffers, the page tables and the mapped filter chains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from backends.base import WriteBatch, check_copy_dest, ingest_by_batches
from backends.errors import (
    BackendConfigError,
    BackendCorrupt,
    BackendError,
    BackendFormatError,
    BackendIOError,
)
from bloomstore import (
    BloomStore,
    BloomStoreError,
    ConfigError,
    CorruptionError,
    FormatError,
    Geometry,
    Tuning,
)

MiB = 1024 * 1024
T = TypeVar("T")
# the engine's memory (stats()["memory_bytes"]), from its own counters
_MEMORY = ("cache_used_bytes", "buffer_ram_bytes", "index_ram_bytes", "chain_mapped_bytes")


def _mapped(exc: BloomStoreError) -> BackendError:
    if isinstance(exc, CorruptionError):
        return BackendCorrupt(exc.message)
    if isinstance(exc, FormatError):
        return BackendFormatError(exc.message)
    if isinstance(exc, ConfigError):
        return BackendConfigError(exc.message)
    return BackendIOError(exc.message)


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except BloomStoreError as exc:
        raise _mapped(exc) from exc


class BloomStoreBackend:
    name = "bloomstore"
    persistent = True

    def __init__(self, path: Path, cache_bytes: int = 64 * MiB,
                 geometry: Geometry | None = None, *, direct_io: bool = False,
                 **tuning: Any) -> None:
        if cache_bytes < 0:
            raise BackendConfigError(f"bloomstore: cache_bytes {cache_bytes} must be >= 0")
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        self.direct_io = direct_io
        try:
            config = Tuning(cache_bytes=cache_bytes, direct_io=direct_io, **tuning)
        except ConfigError as exc:
            raise BackendConfigError(exc.message) from exc
        self._store = _call(lambda: BloomStore(self.path, geometry, config))

    @property
    def engine(self) -> BloomStore:
        return self._store

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return _call(lambda: self._store.get_many(keys))

    def write(self, batch: WriteBatch, sync: bool) -> None:
        _call(lambda: self._store.write(batch.puts, batch.deletes, sync))

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._store.scan(start, end)
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            except BloomStoreError as exc:
                raise _mapped(exc) from exc
            yield item

    def sync(self) -> None:
        _call(self._store.sync)

    def compact(self) -> None:
        _call(self._store.compact)

    def flush_buffers(self) -> None:
        """Every partition's write buffer to pages (a checkpoint of the log)."""
        _call(self._store.checkpoint)

    def resume(self) -> None:
        """Nothing to do: a failed write leaves this engine writable."""

    def copy_to(self, dest: Path) -> None:
        """BloomStore's own copy (a checkpoint, then its live files)."""
        check_copy_dest("bloomstore", self.path, dest)
        _call(lambda: self._store.copy_to(dest))

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Write batches (Backend.ingest's fallback)."""
        return ingest_by_batches(self, items)

    def close(self) -> None:
        _call(self._store.close)

    def stats(self) -> dict[str, int | float | str]:
        out: dict[str, int | float | str] = {"backend": self.name}
        out.update(_call(self._store.stats))
        out["cache_bytes_configured"] = self.cache_bytes
        out["direct_io"] = int(self.direct_io)
        out["memory_bytes"] = sum(int(out.get(k, 0)) for k in _MEMORY)
        return out
