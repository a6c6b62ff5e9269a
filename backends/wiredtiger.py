"""WiredTigerBackend: MongoDB's storage engine, on the `wiredtiger` package (built from
source, see `make setup-wt`).

Configuration:
- one table, `key_format=u,value_format=u` (raw bytes), no block compressor (the PyPI
  build has none), 8 KB leaf pages instead of 32 KB: a cache miss reads 8 KB, which made
  multi-gets of 1.6 KB segments ~1.5x faster when the data outgrows the cache.
- `cache_size` = `cache_bytes`, at least 32 MiB: a batch's transaction must fit in
  WiredTiger's cache (with a few MiB, a batch of a few hundred segments is rolled
  back with WT_ROLLBACK because eviction cannot free its pinned pages; sarp's bulk
  batches of ~33k writes were rolled back at 2, 4, 8 and 16 MiB). So a budget under
  32 MiB does not bind this engine (backends.registry.CACHE_FLOORS; the bench says
  so). The cache holds everything else WiredTiger keeps (dirty pages and updates
  included), so from 32 MiB up `cache_bytes` is its whole budget.
- write-ahead log on, in 2 MB files, each removed once a checkpoint no longer needs it;
  a checkpoint every `checkpoint_wait_s` seconds or `checkpoint_log_bytes` of log,
  whichever comes first: recovery after a crash replays at most that much log.
  `close` checkpoints, so a clean reopen replays nothing.
- `write(sync=True)` commits with `sync=on` (the log is fsync'd before it returns);
  `write(sync=False)` commits, then writes the log buffer to the OS without fsync: the
  batch survives a crash of the process, not of the machine (as RocksDB's sync=False).
- `statistics=(fast)`: `stats()` reads WiredTiger's counters.
- `direct_io`: `direct_io=[data]`, data files are read and written with O_DIRECT
  (WiredTiger aligns its buffers), so its cache is the only cache of the table's
  pages; the log goes through the page cache as before.

Threading: the connection is shared, a session and its cursor are not thread-safe.
Every call takes a (session, cursor) pair from a pool and puts it back after, so the
pool holds as many pairs as threads ever called at once. Writers are serialised by a
lock: batches never conflict, so there is no WT_ROLLBACK to retry. A scan has a
session of its own holding a snapshot transaction, read in chunks. `close` waits for
the calls in progress, then closes the connection and with it every session.

WiredTiger refuses empty keys, and its Python binding turns the refusal into a
library panic, so an empty key never reaches it: a put of one is a ValueError (a
caller's bug, like a key that is not `bytes`: the binding misreads a bytearray), a get
of one finds nothing, a delete of one does nothing.

Failures (backends/errors.py): a tunable out of range is a BackendConfigError; a
WiredTigerError becomes BackendIOError naming the path and WiredTiger's message, and
the batch's transaction is rolled back. A WT_PANIC (e.g. the log could not be
written) leaves the connection unusable: the next call reopens it, and WiredTiger's
recovery brings back every committed batch and nothing of the failed one.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import wiredtiger

from backends._files import OpenPaths, copy_synced, dir_bytes, fsync_dir
from backends.base import WriteBatch, check_copy_dest, ingest_by_batches
from backends.errors import BackendConfigError, BackendIOError

MiB = 1024 * 1024
MIN_CACHE_BYTES = 32 * MiB  # room for one write batch's transaction (see the docstring)
TABLE = "table:sarp"
TABLE_CONFIG = "key_format=u,value_format=u,leaf_page_max=8KB"
LOG_FILE_MAX = "2MB"
CHECKPOINT_WAIT_S = 60
CHECKPOINT_LOG_BYTES = 64 * MiB
SESSION_MAX = 256
SCAN_CHUNK = 256
NOTFOUND: int = wiredtiger.WT_NOTFOUND
WiredTigerError: type[Exception] = wiredtiger.WiredTigerError

# stats() name -> description of a WiredTiger connection statistic
_STATISTICS = {
    "cache_bytes_inuse": "cache: bytes currently in the cache",
    "cache_bytes_max": "cache: maximum bytes configured",
    "cache_dirty_bytes": "cache: tracked dirty bytes in the cache",
    "cache_pages_read": "cache: pages read into cache",
    "cache_pages_written": "cache: pages written from cache",
    "cache_pages_evicted": "cache: unmodified pages evicted",
    "checkpoints": "checkpoint: total succeed number of checkpoints",
    "checkpoint_most_recent_ms": "checkpoint: most recent time (msecs)",
    "log_bytes_written": "log: log bytes written",
    "log_syncs": "log: log sync operations",
    "log_flushes": "log: log flush operations",
    "log_records_scanned": "log: records processed by log scan",
    "txn_commits": "transaction: transactions committed",
    "txn_rollbacks": "transaction: transactions rolled back",
}

_OPEN = OpenPaths("wiredtiger", "WiredTigerBackend")


def connection_config(cache_bytes: int, checkpoint_wait_s: int, checkpoint_log_bytes: int,
                      direct_io: bool = False) -> str:
    """The `wiredtiger_open` configuration of every open (new or existing directory)."""
    return (
        ("direct_io=[data]," if direct_io else "") +
        f"create,cache_size={max(cache_bytes, MIN_CACHE_BYTES)},"
        f"session_max={SESSION_MAX},"
        f"log=(enabled=true,file_max={LOG_FILE_MAX},remove=true),"
        f"checkpoint=(wait={checkpoint_wait_s},log_size={checkpoint_log_bytes}),"
        "statistics=(fast)"
    )


def _is_panic(exc: BaseException) -> bool:
    return "WT_PANIC" in str(exc) or "must exit and restart" in str(exc)


def _check_key(key: object) -> None:
    if type(key) is not bytes:
        raise TypeError(f"wiredtiger: key {key!r} must be bytes, not {type(key).__name__}")


class _Handle:
    """A session and its cursor on the table: used by one thread at a time."""

    __slots__ = ("cursor", "session")

    def __init__(self, session: Any, cursor: Any) -> None:
        self.session = session
        self.cursor = cursor


class _Scan:
    """The session, cursor and position of one scan (`generation` of its connection)."""

    __slots__ = ("end", "generation", "handle", "start", "started")

    def __init__(self, handle: _Handle, start: bytes, end: bytes, generation: int) -> None:
        self.handle: _Handle | None = handle
        self.start = start
        self.end = end
        self.generation = generation
        self.started = False


class WiredTigerBackend:
    name = "wiredtiger"
    persistent = True

    def __init__(
        self,
        path: Path,
        cache_bytes: int = 64 * MiB,
        *,
        checkpoint_wait_s: int = CHECKPOINT_WAIT_S,
        checkpoint_log_bytes: int = CHECKPOINT_LOG_BYTES,
        direct_io: bool = False,
    ) -> None:
        if cache_bytes < 0:
            raise BackendConfigError(f"wiredtiger: cache_bytes {cache_bytes} must be >= 0")
        if checkpoint_wait_s < 0 or checkpoint_log_bytes < 0:
            raise BackendConfigError(
                f"wiredtiger: checkpoint_wait_s {checkpoint_wait_s} and checkpoint_log_bytes "
                f"{checkpoint_log_bytes} must be >= 0"
            )
        self.path = Path(path)
        self.cache_bytes = max(cache_bytes, MIN_CACHE_BYTES)
        self.direct_io = direct_io
        self._config = connection_config(cache_bytes, checkpoint_wait_s, checkpoint_log_bytes,
                                         direct_io)
        self._lock = threading.Lock()  # guards the fields below; hot path: `with` it
        self._cond = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._active = 0  # calls between _enter and _leave
        self._closed = False
        self._panic: BaseException | None = None
        self._generation = 0  # +1 at every reopen and at close: outdates scans
        self._pool: list[_Handle] = []
        self.reopens = 0
        key = str(self.path.resolve())
        _OPEN.claim(key)
        self._release = weakref.finalize(self, _OPEN.release, key)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._conn = self._open_connection()
        except OSError as exc:
            self._release()
            raise self._error("open", exc) from exc
        except Exception:
            self._release()
            raise

    # -- connection and handles --------------------------------------------------------

    def _open_connection(self) -> Any:
        try:
            conn = wiredtiger.wiredtiger_open(str(self.path), self._config)
        except Exception as exc:
            raise self._error("open", exc) from exc
        try:
            session = conn.open_session()
            session.create(TABLE, TABLE_CONFIG)
            session.close()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.close()
            raise self._error(f"create {TABLE}", exc) from exc
        return conn

    def _error(self, action: str, exc: BaseException, note: str = "") -> BackendIOError:
        return BackendIOError(
            f"wiredtiger {self.path}: {action} failed: {type(exc).__name__}: {exc}{note}"
        )

    def _enter(self, action: str, when_closed: str = "{} after close") -> None:
        """Count a call in; reopen a panicked connection first (no call may use it)."""
        with self._lock:
            if not self._closed and self._panic is None:
                self._active += 1
                return
            while not self._closed and self._panic is not None and self._active:
                self._cond.wait()
            if self._closed:
                raise BackendIOError(f"wiredtiger {self.path}: {when_closed.format(action)}")
            if self._panic is not None:
                self._reopen_locked()
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if not self._active and (self._closed or self._panic is not None):
                self._cond.notify_all()

    def _reopen_locked(self) -> None:
        """After a WT_PANIC: drop the connection (its sessions go with it), open anew."""
        cause = self._panic
        with contextlib.suppress(Exception):
            self._conn.close()
        self._pool.clear()
        self._generation += 1
        try:
            self._conn = self._open_connection()
        except BackendIOError as exc:
            raise BackendIOError(f"{exc.message} (reopening after: {cause})") from exc
        self._panic = None
        self.reopens += 1

    def _acquire(self) -> _Handle:
        try:
            return self._pool.pop()
        except IndexError:
            pass
        session = self._conn.open_session()
        return _Handle(session, session.open_cursor(TABLE))

    def _failed(self, action: str, exc: BaseException) -> BackendIOError:
        """The BackendIOError of a WiredTigerError; remembers a panic for _enter."""
        if not _is_panic(exc):
            return self._error(action, exc)
        with self._lock:
            self._panic = exc
        return self._error(action, exc, " (its cause is on stderr; the next call reopens)")

    # -- reads ---------------------------------------------------------------------------

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """One sweep of one cursor over the sorted keys, in one snapshot."""
        for key in keys:
            _check_key(key)
        out: list[bytes | None] = [None] * len(keys)
        order = sorted(range(len(keys)), key=keys.__getitem__) if len(keys) > 1 else [0] * len(keys)
        self._enter("get_many")
        try:
            handle = self._acquire()
            try:
                self._sweep(handle, keys, order, out)
            finally:
                self._pool.append(handle)
        except WiredTigerError as exc:
            raise self._failed(f"get_many of {len(keys)} keys", exc) from exc
        finally:
            self._leave()
        return out

    @staticmethod
    def _sweep(
        handle: _Handle, keys: Sequence[bytes], order: list[int], out: list[bytes | None]
    ) -> None:
        cursor = handle.cursor
        many = len(order) > 1
        if many:
            handle.session.begin_transaction()
        try:
            last: bytes | None = None
            value: bytes | None = None
            for i in order:
                key = keys[i]
                if key != last:
                    last = key
                    value = None
                    if key:
                        cursor._set_key(key)
                        if cursor.search() == 0:
                            value = cursor._get_value()
                out[i] = value
        finally:
            cursor.reset()
            if many:
                handle.session.rollback_transaction()

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """start <= key < end in key order, from one snapshot (taken at the first item),
        read SCAN_CHUNK items at a time."""
        _check_key(start)
        _check_key(end)
        state = self._open_scan(start, end)
        if state is None:
            return
        try:
            while True:
                chunk, more = self._scan_chunk(state)
                yield from chunk
                if not more:
                    return
        finally:
            self._close_scan(state)

    def _open_scan(self, start: bytes, end: bytes) -> _Scan | None:
        self._enter("scan")
        try:
            if start >= end:
                return None
            session = self._conn.open_session()
            session.begin_transaction("isolation=snapshot")
            handle = _Handle(session, session.open_cursor(TABLE))
            return _Scan(handle, start, end, self._generation)
        except WiredTigerError as exc:
            raise self._failed("scan", exc) from exc
        finally:
            self._leave()

    def _scan_chunk(self, state: _Scan) -> tuple[list[tuple[bytes, bytes]], bool]:
        self._enter("scan", "closed during a scan")
        try:
            if state.handle is None or state.generation != self._generation:
                raise BackendIOError(f"wiredtiger {self.path}: closed during a scan")
            cursor = state.handle.cursor
            if state.started:
                rc = cursor.next()
            else:
                state.started = True
                rc = self._position(cursor, state.start)
            chunk: list[tuple[bytes, bytes]] = []
            end = state.end
            while rc == 0:
                key = cursor._get_key()
                if key >= end:
                    return chunk, False
                chunk.append((key, cursor._get_value()))
                if len(chunk) == SCAN_CHUNK:
                    return chunk, True
                rc = cursor.next()
            if rc != NOTFOUND:
                raise BackendIOError(f"wiredtiger {self.path}: scan: cursor.next returned {rc}")
            return chunk, False
        except WiredTigerError as exc:
            raise self._failed("scan", exc) from exc
        finally:
            self._leave()

    @staticmethod
    def _position(cursor: Any, start: bytes) -> int:
        """Put the cursor on the first key >= start; 0 if there is one."""
        if not start:
            return int(cursor.next())
        cursor._set_key(start)
        rc = int(cursor.search_near())
        if rc == NOTFOUND:
            return rc
        return int(cursor.next()) if rc < 0 else 0

    def _close_scan(self, state: _Scan) -> None:
        handle, state.handle = state.handle, None
        if handle is None:
            return
        with self._lock:  # not while close() or a reopen may free the session
            if self._closed or state.generation != self._generation:
                return
            self._active += 1
        try:
            handle.session.close()  # rolls the snapshot transaction back
        except WiredTigerError:
            pass  # nothing was written in it; the connection's close frees it anyway
        finally:
            self._leave()

    # -- writes --------------------------------------------------------------------------

    def write(self, batch: WriteBatch, sync: bool) -> None:
        if not batch:
            if sync:
                self.sync()
            else:
                self._enter("write")
                self._leave()
            return
        for key, value in batch.puts.items():
            _check_key(key)
            if not key:
                raise ValueError(f"wiredtiger {self.path}: empty key (WiredTiger has none)")
            if type(value) is not bytes:
                raise TypeError(f"wiredtiger: value of {key!r} must be bytes")
        for key in batch.deletes:
            _check_key(key)
        with self._write_lock:
            self._enter("write")
            try:
                handle = self._acquire()
                try:
                    self._commit(handle, batch, sync)
                finally:
                    self._pool.append(handle)
            except WiredTigerError as exc:
                raise self._failed(f"write of {len(batch)} ops (sync={sync})", exc) from exc
            finally:
                self._leave()

    @staticmethod
    def _commit(handle: _Handle, batch: WriteBatch, sync: bool) -> None:
        """One transaction; rolled back (or, if the commit failed, rolled back by
        WiredTiger) when anything raises."""
        session, cursor = handle.session, handle.cursor
        session.begin_transaction()
        try:
            for key in batch.deletes:
                if key:
                    cursor._set_key(key)
                    cursor.remove()  # WT_NOTFOUND for a missing key: nothing to do
            for key, value in batch.puts.items():
                cursor._set_key(key)
                cursor._set_value(value)
                cursor.insert()
            cursor.reset()
        except BaseException:
            with contextlib.suppress(WiredTigerError):
                cursor.reset()
                session.rollback_transaction()
            raise
        if sync:
            session.commit_transaction("sync=on")
        else:
            session.commit_transaction()
            session.log_flush("sync=off")  # to the OS: survives a crash of the process
        # A commit whose log write failed can return 0 (WiredTiger 11.3.1, release build:
        # the error is lost when the log slot is recycled) but the library has panicked
        # by then, and the next call says so.
        cursor.reset()

    def sync(self) -> None:
        """fsync the log: every batch committed so far is durable."""
        self._on_session("sync", "sync (log fsync)", lambda s: s.log_flush("sync=on"))

    def flush_buffers(self) -> None:
        """Checkpoint: every dirty page in the cache is written to the data files."""
        self._on_session("flush_buffers", "checkpoint", lambda s: s.checkpoint())

    def copy_to(self, dest: Path) -> None:
        """A hot backup into `dest`: every file a backup cursor lists (the metadata,
        the data files at their last checkpoint and the log files after it), copied
        and fsync'd while the cursor pins them; a checkpoint first keeps the log
        short."""
        check_copy_dest("wiredtiger", self.path, dest)

        def backup(session: Any) -> None:
            session.checkpoint()
            cursor = session.open_cursor("backup:", None, None)
            try:
                dest.mkdir()
                while cursor.next() == 0:
                    name = cursor.get_key()
                    copy_synced(self.path / name, dest / name)
                fsync_dir(dest)
            except OSError as exc:
                raise BackendIOError(f"wiredtiger {self.path}: copy_to {dest} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
            finally:
                cursor.close()

        self._on_session("copy_to", f"copy_to {dest}", backup)

    def _on_session(self, op: str, what: str, call: Callable[[Any], object]) -> None:
        """`call` on a pooled session, the failure named `what`."""
        self._enter(op)
        try:
            handle = self._acquire()
            try:
                call(handle.session)
            finally:
                self._pool.append(handle)
        except WiredTigerError as exc:
            raise self._failed(what, exc) from exc
        finally:
            self._leave()

    # -- close and stats -----------------------------------------------------------------

    def resume(self) -> None:
        """Nothing to do: a failed write leaves this engine writable."""

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Write batches (Backend.ingest's fallback)."""
        return ingest_by_batches(self, items)

    def close(self) -> None:
        """Wait for the calls in progress, checkpoint and close. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._cond.wait()
            self._generation += 1
            self._pool.clear()
        try:
            self._conn.close()
        except WiredTigerError as exc:
            raise self._error("close", exc) from exc
        finally:
            self._conn = None
            self._release()

    def stats(self) -> dict[str, int | float | str]:
        out: dict[str, int | float | str] = {
            "backend": self.name,
            "path": str(self.path),
            "disk_bytes": dir_bytes(self.path),
            "log_files": len(list(self.path.glob("WiredTigerLog.*"))),
            "open": int(not self._closed),
        }
        if self._closed:
            return out
        out.update(
            cache_bytes_configured=self.cache_bytes,
            direct_io=int(self.direct_io),
            engine_version=str(wiredtiger.wiredtiger_version()[0]),
            engine_diagnostic_build=int(wiredtiger.diagnostic_build()),
            reopens_after_panic=self.reopens,
        )
        self._enter("stats")
        try:
            handle = self._acquire()
            try:
                out.update(self._statistics(handle))
            finally:
                self._pool.append(handle)
        except WiredTigerError as exc:
            raise self._failed("stats", exc) from exc
        finally:
            self._leave()
        out["memory_bytes"] = int(out.get("cache_bytes_inuse", 0))  # dirty pages included
        return out

    @staticmethod
    def _statistics(handle: _Handle) -> dict[str, int]:
        wanted = {desc: name for name, desc in _STATISTICS.items()}
        found: dict[str, int] = {}
        cursor = handle.session.open_cursor("statistics:", None, None)
        try:
            while cursor.next() == 0:
                desc, _, value = cursor.get_values()
                name = wanted.get(desc)
                if name is not None:
                    found[name] = int(value)
        finally:
            cursor.close()
        return found
