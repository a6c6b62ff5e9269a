"""RocksDBBackend: the default engine, on `rocksdict` (RocksDB 9.x bundled in its wheel).

Options:
- raw mode: keys and values are bytes. A directory written in rocksdict's pickle mode
  is refused (a raw-mode open of one would silently read None everywhere).
- the budget: `cache_bytes` is the engine's WHOLE memory, not only its block cache:
  memtables + block cache (data blocks, index and filter partitions) + table readers.
  The memtables: WRITE_BUFFERS (2) of `write_buffer_bytes(cache_bytes)` =
  MEMTABLE_SHARE (1/4) of the budget split in two, at least 64 KiB (RocksDB's least)
  and at most 64 MiB (RocksDB's default); a full one is flushed while the other fills
  and writes wait while both are full, so they hold at most `memtable_limit_bytes` (2
  write buffers and RocksDB's over-allocation, OVER_ALLOCATION of each). The LRU block
  cache gets the rest (`block_cache_bytes`). `stats()["memory_bytes"]` = block cache
  in use + memtables + table readers. A budget under MIN_CACHE_BYTES (512 KiB) is
  refused.
  Slack, RocksDB's own: the table readers are outside the cache (with partitions, a
  few KB per table file: 25-45 KB at 4-20 table files); a write batch goes into one
  memtable whole, so a batch larger than a write buffer may let the memtables hold
  that much more; the cache may exceed its capacity by what is pinned there when
  nothing else is left to evict (blocks a read holds, the top-level index and filter
  blocks). Measured (100 MiB of writes in batches of 64 values of <= 1.6 KB, reads
  between them): memory_bytes at most the budget + the table readers from 2 MiB up
  (1.015x at 2 MiB, 0.99x at 4 MiB), 1.07-1.17x at 1-0.5 MiB (batches of ~52 KB
  against 64-128 KiB write buffers, 19 L0 files). Charging the memtables to the
  cache instead (a WriteBufferManager with the cache, as RocksDB offers) over-counts
  them (256 KiB dummy entries, released lazily) and its pinned charges overfilled
  the 512 KiB cache shards (1.12x at 4 MiB); write speed was the same either way.
  sarp's write path (write_many, 3M blocks, no sync) took 8.3 s in a 64 MiB budget
  (2 x 8 MiB memtables) and 8.7-10.4 s in 128 MiB, 11.5-14.5 s before (a 64 MiB cache
  and 2 x 64 MiB memtables outside it; a shared machine, noisy).
- block-based table: 10-bit bloom filters, partitioned (`partition_filters`, a
  two-level index, METADATA_BLOCK_BYTES partitions), index and filter blocks in the
  cache: only each table's top-level index and filter blocks are read at open (and
  pinned in the cache); the partitions are read on demand and compete with data
  blocks for the budget. Measured on a 2M-key store (606 MB, direct reads): table
  readers 21 KiB instead of 8.2 MiB (every filter and index read at open: ~1.5 GB at
  1e9 keys), open 14-28 ms vs 24-29 ms; at the same total memory (a 12.2 MiB budget vs
  a 4 MiB cache + 8.2 MiB of table readers) hits 87-89 us vs 67-82 us (median),
  misses 1.4 vs 0.6 us, the first 200 gets after open 164-257 vs 89-117 us (they
  read the partitions); with a budget smaller than the metadata (4 MiB) hits take
  ~190 us: what was outside the budget before is paid for now (unpartitioned index and
  filter blocks in a small cache doubled get time; partitioned, at the same memory,
  hits are 1.1-1.3x slower than with all of them outside the budget). L0 partitions are
  not pinned (`pin_l0_filter_and_index_blocks_in_cache`): in an 800 KB budget with 16
  L0 files they held 870 KB pinned, and gets were no faster with them. Hash index
  inside data blocks for cheaper point lookups.
- the same Options are passed as `column_families={"default": opts}`: without it a
  reopen silently loads the stored OPTIONS (8 MiB cache, no bloom filter).
- write-heavy, small values: level compaction with dynamic level sizes, LZ4 (cheap;
  RocksDB keeps a block uncompressed when that saves too little, as for hash ids),
  two background jobs (this is a 2-core machine), smoothed writeback of SST files.
- `direct_io`: SST reads bypass the OS page cache (`use_direct_reads`), so a read is
  served by the memtables, the block cache or the disk, nothing else; flushes and
  compactions write through the page cache unless DIRECT_FLUSH_AND_COMPACTION (see
  its comment).
- WAL on; recovery mode is RocksDB's default point-in-time recovery: after a crash the
  database holds exactly a prefix of the write batches, every synced one included.

After a failed write or sync RocksDB keeps refusing writes (a sticky background
error) even once space is back; `resume()` closes and reopens the database (RocksDB's
recovery replays its WAL, so a batch whose write failed after reaching the log may
reappear: the caller reloads its view afterwards). While a reopen cannot write (disk
still full) the database is opened read-only, so reads keep working, and writes are
refused without another attempt for RESUME_RETRY_S.

Thread safety: every call may come from any thread (RocksDB is thread-safe). `close`
drops the RocksDB iterators of unfinished scans (their next step raises BackendIOError)
so that the directory can be reopened at once.

Failures (backends/errors.py): a `cache_bytes` under MIN_CACHE_BYTES is a
BackendConfigError; a failed open (a file, a directory in pickle mode or already open
in this process), read, write, sync or reopen is a BackendIOError naming the path and
RocksDB's message.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import rocksdict

from backends._files import OpenPaths, dir_bytes
from backends.base import WriteBatch, check_copy_dest, sorted_items
from backends.errors import BackendConfigError, BackendIOError

KiB = 1024
MiB = 1024 * KiB
BLOOM_BITS_PER_KEY = 10
METADATA_BLOCK_BYTES = 4 * KiB  # index and filter partitions
MEMTABLE_SHARE = 0.25  # of the budget: the most the memtables take (WRITE_BUFFERS of them)
WRITE_BUFFERS = 2  # max_write_buffer_number (RocksDB's default)
MIN_WRITE_BUFFER_BYTES = 64 * KiB  # RocksDB raises a smaller write_buffer_size to this
MAX_WRITE_BUFFER_BYTES = 64 * MiB  # RocksDB's default write_buffer_size
# RocksDB flushes a memtable once it holds write_buffer_size + 0.6 of an arena block,
# and an arena block is write_buffer_size / 8 at most (memtable.cc ShouldFlushNow)
OVER_ALLOCATION = 0.6 / 8
# the least budget: the one whose memtable share is two of RocksDB's least memtables
MIN_CACHE_BYTES = int(WRITE_BUFFERS * MIN_WRITE_BUFFER_BYTES / MEMTABLE_SHARE)  # 512 KiB
COMPRESSION = "lz4"
BACKGROUND_JOBS = 2
RESUME_RETRY_S = 1.0  # after a reopen that failed, refuse writes this long
SST_FILE_BYTES = 256 * MiB  # ingest(): table files of about this size
# With direct_io, flushes and compactions could write with O_DIRECT too. They only
# keep written SST blocks out of the page cache (reads bypass it either way);
# measured with `sarpctl bench --recovery-only --blocks 300000 --index
# sarp,ssd-blockhash` twice each way: builds 0.81-0.84 s (sarp) and 0.54-0.56 s either
# way, recoveries within noise. Off: no gain, one more thing that differs from sarpd.
DIRECT_FLUSH_AND_COMPACTION = False

# stats() name -> RocksDB integer property (all cheap: no scan of the data)
_PROPERTIES = {
    "estimate_num_keys": "rocksdb.estimate-num-keys",
    "block_cache_bytes": "rocksdb.block-cache-capacity",
    "block_cache_usage": "rocksdb.block-cache-usage",
    "block_cache_pinned_usage": "rocksdb.block-cache-pinned-usage",
    "memtable_bytes": "rocksdb.cur-size-all-mem-tables",
    "sst_bytes": "rocksdb.total-sst-files-size",
    "live_data_bytes": "rocksdb.estimate-live-data-size",
    "table_readers_bytes": "rocksdb.estimate-table-readers-mem",
    "pending_compaction_bytes": "rocksdb.estimate-pending-compaction-bytes",
    "running_compactions": "rocksdb.num-running-compactions",
    "l0_files": "rocksdb.num-files-at-level0",
}
# the engine's memory (stats()["memory_bytes"]): the block cache in use (data blocks,
# index and filter partitions), the memtables and the table readers
_MEMORY = ("block_cache_usage", "memtable_bytes", "table_readers_bytes")
# stats() name -> RocksDB statistics ticker (only with statistics=True)
_TICKERS = {
    "block_cache_hits": "rocksdb.block.cache.hit",
    "block_cache_misses": "rocksdb.block.cache.miss",
    "bloom_useful": "rocksdb.bloom.filter.useful",
    "bloom_full_positive": "rocksdb.bloom.filter.full.positive",
    "bloom_true_positive": "rocksdb.bloom.filter.full.true.positive",
    "wal_syncs": "rocksdb.wal.synced",
    "bytes_written": "rocksdb.bytes.written",
}

_OPEN = OpenPaths("rocksdb", "RocksDBBackend")


def write_buffer_bytes(cache_bytes: int) -> int:
    """One memtable's size (`write_buffer_size`) for a budget: MEMTABLE_SHARE of it over
    WRITE_BUFFERS memtables, within [MIN_WRITE_BUFFER_BYTES, MAX_WRITE_BUFFER_BYTES]."""
    share = int(cache_bytes * MEMTABLE_SHARE) // WRITE_BUFFERS
    return min(MAX_WRITE_BUFFER_BYTES, max(MIN_WRITE_BUFFER_BYTES, share))


def memtable_limit_bytes(cache_bytes: int) -> int:
    """The most the memtables hold (batches smaller than a write buffer): WRITE_BUFFERS
    of them, each flushed once it holds its size and OVER_ALLOCATION more."""
    return int(WRITE_BUFFERS * write_buffer_bytes(cache_bytes) * (1 + OVER_ALLOCATION))


def block_cache_bytes(cache_bytes: int) -> int:
    """The block cache's capacity: the budget but what the memtables may hold."""
    return cache_bytes - memtable_limit_bytes(cache_bytes)


def build_options(cache_bytes: int, statistics: bool = False,
                  direct_io: bool = False) -> rocksdict.Options:
    """The Options of every open (new or existing directory): `cache_bytes` is the
    whole budget, memtables included (see the module docstring)."""
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(block_cache_bytes(cache_bytes)))
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(METADATA_BLOCK_BYTES)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(False)
    table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())
    table.set_data_block_hash_ratio(0.75)
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(write_buffer_bytes(cache_bytes))
    opts.set_max_write_buffer_number(WRITE_BUFFERS)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    opts.set_level_compaction_dynamic_level_bytes(True)
    opts.set_max_background_jobs(BACKGROUND_JOBS)
    opts.set_bytes_per_sync(1 * MiB)
    opts.set_keep_log_file_num(4)  # RocksDB's own LOG files, one per open otherwise
    if direct_io:
        opts.set_use_direct_reads(True)
        opts.set_use_direct_io_for_flush_and_compaction(DIRECT_FLUSH_AND_COMPACTION)
    if statistics:
        opts.enable_statistics()
    return opts


def read_table_options(path: Path) -> dict[str, str]:
    """The block-based table options RocksDB recorded in the newest OPTIONS file of
    `path`: what the running (or last) open really used."""
    files = sorted(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    if not files:
        return {}
    out: dict[str, str] = {}
    in_table = False
    for line in files[-1].read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            in_table = line.startswith('[TableOptions/BlockBasedTable "default"]')
        elif in_table and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


def _check_raw_mode(path: Path) -> None:
    config = path / "rocksdict-config.json"
    try:
        raw = json.loads(config.read_text()).get("raw_mode", True)
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError) as exc:
        raise BackendIOError(f"rocksdb {path}: unreadable {config.name}: {exc}") from exc
    if raw is not True:
        raise BackendIOError(
            f"rocksdb {path}: written in rocksdict pickle mode (raw_mode={raw!r}), "
            "sarp needs raw_mode=True"
        )


class _Cursor:
    """The RocksDB iterator of one scan; `close()` of the backend sets `it` to None."""

    __slots__ = ("__weakref__", "it", "read_opts")

    def __init__(self, it: Any, read_opts: rocksdict.ReadOptions) -> None:
        self.it: Any = it
        self.read_opts: rocksdict.ReadOptions | None = read_opts


class RocksDBBackend:
    name = "rocksdb"
    persistent = True

    def __init__(
        self, path: Path, cache_bytes: int = 64 * MiB, *, statistics: bool = False,
        direct_io: bool = False,
    ) -> None:
        if cache_bytes < MIN_CACHE_BYTES:
            raise BackendConfigError(f"rocksdb: cache_bytes {cache_bytes} is below the least "
                                     f"budget, {MIN_CACHE_BYTES} (the memtables and some blocks)")
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        self.direct_io = direct_io
        self._lock = threading.Lock()
        self._cursors: weakref.WeakSet[_Cursor] = weakref.WeakSet()
        self._closed = False
        key = str(self.path.resolve())
        _OPEN.claim(key)
        self._release = weakref.finalize(self, _OPEN.release, key)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            _check_raw_mode(self.path)
            self._opts = build_options(cache_bytes, statistics, direct_io)
            self._db = rocksdict.Rdict(
                str(self.path), self._opts, column_families={"default": self._opts}
            )
        except BackendIOError:
            self._release()
            raise
        except Exception as exc:
            self._release()
            raise BackendIOError(f"rocksdb {self.path}: open failed: {exc}") from exc
        self._statistics = statistics
        self._failed = ""  # why the first write or sync since resume() failed
        self._resume_failed_at = -RESUME_RETRY_S
        self._wo_sync = rocksdict.WriteOptions()
        self._wo_sync.sync = True
        self._wo_async = rocksdict.WriteOptions()
        self._wo_async.sync = False

    def _error(self, action: str, exc: BaseException) -> BackendIOError:
        why = f"{type(exc).__name__}: {exc}"
        first = self._failed if self._failed and self._failed != why else ""
        return BackendIOError(f"rocksdb {self.path}: {action} failed: {why}"
                              + (f" (after: {first})" if first else ""))

    def _fail(self, exc: BaseException) -> None:
        """Remember why writing failed (the first cause: RocksDB answers later calls
        "previous error", which names none)."""
        self._failed = self._failed or f"{type(exc).__name__}: {exc}"

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            if self._closed:
                raise BackendIOError(f"rocksdb {self.path}: get_many after close")
            return []
        try:
            values = cast("list[bytes | None]", self._db.get(list(keys)))
        except (KeyError, TypeError, ValueError):
            raise  # a caller's bug (non-bytes key), not a storage failure
        except Exception as exc:
            raise self._error(f"get_many of {len(keys)} keys", exc) from exc
        return values

    def write(self, batch: WriteBatch, sync: bool) -> None:
        if not batch:
            if sync:
                self.sync()
            elif self._closed:
                raise BackendIOError(f"rocksdb {self.path}: write after close")
            return
        wb = rocksdict.WriteBatch(raw_mode=True)
        for key in batch.deletes:
            wb.delete(key)
        for key, value in batch.puts.items():
            wb.put(key, value)
        try:
            self._db.write(wb, self._wo_sync if sync else self._wo_async)
        except Exception as exc:
            err = self._error(f"write of {len(batch)} ops (sync={sync})", exc)
            self._fail(exc)
            raise err from exc

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """start <= key < end in key order, from one consistent view (the RocksDB
        iterator's implicit snapshot, taken at the first `next`)."""
        cursor = self._open_cursor(start, end)
        if cursor is None:
            return
        try:
            while (item := self._step(cursor)) is not None:
                yield item
        finally:
            cursor.it = None
            cursor.read_opts = None

    def _open_cursor(self, start: bytes, end: bytes) -> _Cursor | None:
        with self._lock:
            if self._closed:
                raise BackendIOError(f"rocksdb {self.path}: scan after close")
            if start >= end:
                return None
            read_opts = rocksdict.ReadOptions()
            read_opts.set_iterate_upper_bound(end)
            try:
                it = self._db.iter(read_opts)
                it.seek(start)
            except Exception as exc:
                raise self._error("scan", exc) from exc
            cursor = _Cursor(it, read_opts)
            self._cursors.add(cursor)
            return cursor

    def _step(self, cursor: _Cursor) -> tuple[bytes, bytes] | None:
        # No reference to the iterator may outlive this call: close() must be able
        # to drop the last one.
        it = cursor.it
        if it is None:
            raise BackendIOError(f"rocksdb {self.path}: closed during a scan")
        try:
            if not it.valid():
                it.status()
                return None
            item: tuple[bytes, bytes] = (it.key(), it.value())
            it.next()
        except Exception as exc:
            raise self._error("scan", exc) from exc
        return item

    def sync(self) -> None:
        try:
            self._db.flush_wal(True)
        except Exception as exc:
            err = self._error("sync (WAL fsync)", exc)
            self._fail(exc)
            raise err from exc

    def resume(self) -> None:
        """After a failed write: reopen so that writes work again (RocksDB's error state
        is sticky). Nothing to do otherwise. Raises BackendIOError while the reopen cannot
        write (reads then go to a read-only open)."""
        with self._lock:
            if not self._failed or self._closed:
                return
            if time.monotonic() - self._resume_failed_at < RESUME_RETRY_S:
                raise BackendIOError(f"rocksdb {self.path}: writes refused: {self._failed} "
                                     f"(the next reopen is tried {RESUME_RETRY_S:g} s after "
                                     "the last one)")
            for cursor in list(self._cursors):
                cursor.it = None
                cursor.read_opts = None
            with contextlib.suppress(Exception):  # "Writer has previous error"
                self._db.close()
            cf = {"default": self._opts}
            try:
                self._db = rocksdict.Rdict(str(self.path), self._opts, column_families=cf)
            except Exception as exc:
                self._db = rocksdict.Rdict(str(self.path), self._opts, column_families=cf,
                                           access_type=rocksdict.AccessType.read_only())
                self._resume_failed_at = time.monotonic()
                raise self._error(f"reopen after a failed write ({self._failed})",
                                  exc) from exc
            self._failed = ""

    def copy_to(self, dest: Path) -> None:
        """RocksDB's checkpoint into `dest`: table files hard-linked (copied across
        file systems), the memtables flushed first, the WAL and MANIFEST copied; ~ms."""
        check_copy_dest("rocksdb", self.path, dest)
        with self._lock:
            if self._closed:
                raise BackendIOError(f"rocksdb {self.path}: copy_to after close")
            try:
                rocksdict.Checkpoint(self._db).create_checkpoint(str(dest))
            except Exception as exc:
                raise self._error(f"copy_to {dest}", exc) from exc

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Bulk load: `items` (sorted) go into table files of ~SST_FILE_BYTES written
        by SstFileWriter with this database's options (same bloom filter, compression,
        block format), in `<path>/ingest.tmp/`, then ONE `ingest_external_file` moves
        them in (non-overlapping files: into the bottommost level they fit, no
        compaction, no WAL). Durable on return (the ingestion syncs the files and the
        MANIFEST)."""
        tmp = self.path / "ingest.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        files: list[str] = []
        n = 0
        try:
            tmp.mkdir()
            writer: rocksdict.SstFileWriter | None = None
            for key, value in sorted_items(items):
                if writer is None:
                    files.append(str(tmp / f"{len(files):06d}.sst"))
                    writer = rocksdict.SstFileWriter(self._opts)
                    writer.open(files[-1])
                writer[key] = value
                n += 1
                if not n & 4095 and writer.file_size() >= SST_FILE_BYTES:
                    writer.finish()
                    writer = None
            if writer is not None:
                writer.finish()
            if files:
                opts = rocksdict.IngestExternalFileOptions()
                opts.set_move_files(True)
                self._db.ingest_external_file(files, opts)
        except ValueError:
            raise  # keys out of order: the caller's bug
        except Exception as exc:
            raise self._error(f"ingest of {n} items in {len(files)} table files", exc) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return n

    def flush_buffers(self) -> None:
        """Write the memtables to SST files (and fsync the WAL)."""
        try:
            self._db.flush_wal(True)
            self._db.flush(True)
        except Exception as exc:
            err = self._error("flush of the memtables", exc)
            self._fail(exc)
            raise err from exc

    def close(self) -> None:
        """Flush the memtables (a clean reopen then replays no WAL) and close.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cursors = list(self._cursors)
        for cursor in cursors:
            cursor.it = None
            cursor.read_opts = None
        error: Exception | None = None
        try:
            self._db.flush_wal(True)
            self._db.flush(True)
        except Exception as exc:
            error = exc
        try:
            self._db.close()
        except Exception as exc:
            error = error or exc
        finally:
            self._release()
        if error is not None:
            raise self._error("close", error) from error

    def stats(self) -> dict[str, int | float | str]:
        out: dict[str, int | float | str] = {
            "backend": self.name,
            "path": str(self.path),
            "disk_bytes": dir_bytes(self.path),
            "open": int(not self._closed),
        }
        if self._closed:
            return out
        out.update(
            cache_bytes_configured=self.cache_bytes,
            write_buffer_bytes=write_buffer_bytes(self.cache_bytes),
            write_buffers=WRITE_BUFFERS,
            memtable_limit_bytes=memtable_limit_bytes(self.cache_bytes),
            direct_io=int(self.direct_io),
            bloom_bits_per_key=BLOOM_BITS_PER_KEY,
            compression=COMPRESSION,
        )
        try:
            for name, prop in _PROPERTIES.items():
                value = self._db.property_int_value(prop)
                if value is not None:
                    out[name] = value
            out["latest_sequence_number"] = self._db.latest_sequence_number()
        except Exception as exc:
            raise self._error("stats", exc) from exc
        out["memory_bytes"] = sum(int(out.get(k, 0)) for k in _MEMORY)
        if self._statistics:
            out.update(self._tickers())
        return out

    def _tickers(self) -> dict[str, int]:
        text = self._opts.get_statistics() or ""
        counts: dict[str, int] = {}
        for line in text.splitlines():
            name, sep, rest = line.partition(" COUNT : ")
            if sep:
                counts[name] = int(rest.split()[0])
        return {key: counts.get(ticker, 0) for key, ticker in _TICKERS.items()}
