"""BloomStore: the store of one directory.

Directory layout (the formats are documented in the modules named):

    LOCK                 flock'ed while a process has the store open
    MANIFEST             pages of every partition, log generation (manifest.py)
    wal-GGGGGG.log       the write-ahead log of the current generation (wal.py)
    pPPPP-GGGGGG.pages   KV pages of partition PPPP, file generation GGGGGG (pages.py)
    pPPPP-GGGGGG.chain   their bit-sliced Bloom-filter chain (chain.py)

Other files of these name patterns (an older generation a compaction replaced, the
log a checkpoint retired, MANIFEST.tmp) are left by a crash and removed at open.

Write: one log record for the whole batch (fsync'd when sync=True), then each entry
goes to the write buffer of its partition (a dict); a buffer holding keys_per_page
keys or page_bytes bytes is flushed (partition.py). Past wal_bytes of log, a
checkpoint flushes every buffer and starts a new log generation. After a flush, a
partition whose estimated dead entries reach dead_ratio is compacted (compact.py).

Lookup: the key's partition buffer, else the chain's candidate pages newest first,
until a page holds the key (its value, or a tombstone = absent). Candidate pages that
do not hold the key are the false positives counted in `stats()`.

Open: load the manifest (no page is read), then replay the log into the buffers,
skipping the records each partition already flushed.

Thread safety: one lock around every call; a scan takes it at every step.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from bloomstore import compact, scan
from bloomstore.config import MAX_KEY_BYTES, MAX_VALUE_BYTES, Geometry, Tuning
from bloomstore.errors import (
    BloomStoreError,
    ConfigError,
    CorruptionError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
)
from bloomstore.files import copy_synced, file_bytes, fsync_dir
from bloomstore.filter import U64, digests, partitions_of
from bloomstore.manifest import NAME as MANIFEST_NAME
from bloomstore.manifest import FlushEdit, Manifest, PartitionState, StoreState
from bloomstore.pages import Page, PageCache
from bloomstore.partition import Partition, file_names
from bloomstore.wal import Op, Wal, encode_record, wal_name

_ORPHAN = re.compile(r"^(p\d{4}-\d{6}\.(pages|chain)|wal-\d{6}\.log|MANIFEST\.tmp)$")
_FIXED_RAM = 4096  # the store object, its lock, file objects: a rough constant

_open_lock = threading.Lock()
_open_paths: set[str] = set()


def _release(key: str) -> None:
    with _open_lock:
        _open_paths.discard(key)


class BloomStore:
    """A persistent key-value store (bytes -> bytes) after Lu, Nam and Du, BloomStore
    (MSST 2012). See the module docstring and bloomstore/README.md."""

    def __init__(self, path: Path | str, geometry: Geometry | None = None,
                 tuning: Tuning | None = None) -> None:
        self.path = Path(path)
        self.tuning = tuning or Tuning()
        self._lock = threading.RLock()
        self._closed = False
        self._lock_fd = -1
        self._counters = dict.fromkeys(
            ("writes", "lookups", "lookup_page_reads", "false_positive_reads",
             "negative_filter_tests", "page_reads", "flushes", "flush_errors",
             "checkpoints", "compactions", "compaction_errors", "scans"), 0)
        self._last_error = ""
        self._failed = ""
        self._cache = PageCache(self.tuning.cache_bytes)
        key = str(self.path.resolve())
        with _open_lock:
            if key in _open_paths:
                raise StoreLockedError(f"bloomstore {self.path}: already open in this "
                                       "process (close the other BloomStore on it first)")
            _open_paths.add(key)
        self._release = weakref.finalize(self, _release, key)
        self._parts: list[Partition] = []
        self._manifest = Manifest(self.path)
        try:
            self._open(geometry)
        except BaseException as exc:
            self._close_files()
            self._release()
            if isinstance(exc, BloomStoreError):
                raise
            if isinstance(exc, OSError):
                raise StoreIOError(f"bloomstore {self.path}: open failed: {exc}") from exc
            raise

    # -- open ------------------------------------------------------------------------
    def _open(self, geometry: Geometry | None) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StoreLockedError(
                f"bloomstore {self.path}: locked by another process") from exc
        fsync = self.tuning.fsync
        if not (self.path / MANIFEST_NAME).exists():
            if any(self.path.glob("p*.pages")):
                raise CorruptionError(f"bloomstore {self.path}: page files but no "
                                      f"{MANIFEST_NAME}")
            geo = geometry or Geometry()
            state = StoreState(geo, 1, 1, [PartitionState() for _ in range(geo.partitions)])
            self._wal = Wal(self.path, 1, 1, create=True)
            if fsync:
                self._wal.file.sync()
            self._manifest.create(state, fsync)
        else:
            state = self._manifest.load()
            if geometry is not None and geometry != state.geometry:
                raise ConfigError(f"bloomstore {self.path}: geometry {geometry} differs "
                                  f"from the stored {state.geometry}")
            exists = (self.path / wal_name(state.wal_gen)).exists()
            self._wal = Wal(self.path, state.wal_gen, state.next_lsn, create=not exists)
        self.geometry = state.geometry
        self._parts = [Partition(i, s, self.path, self.geometry, self.tuning.direct_io)
                       for i, s in enumerate(state.parts)]
        self._remove_orphans(state.wal_gen)
        self._replay(state)

    def _remove_orphans(self, wal_gen: int) -> None:
        keep = {wal_name(wal_gen)}
        for p in self._parts:
            if p.state.gen:
                keep.update(file_names(p.index, p.state.gen))
        for entry in os.scandir(self.path):
            if _ORPHAN.match(entry.name) and entry.name not in keep:
                os.unlink(entry.path)

    def _replay(self, state: StoreState) -> None:
        last = self._wal.first_lsn - 1
        parts, count = self._parts, self.geometry.partitions
        for record in self._wal.replay():
            _, hi = digests([k for k, _ in record.ops])
            for (key, value), p in zip(record.ops, partitions_of(hi, count).tolist(),
                                       strict=True):
                part = parts[p]
                if record.lsn > part.state.flushed_lsn:
                    part.put(key, value)
            last = record.lsn
        flushed = max(p.state.flushed_lsn for p in parts)
        self._next_lsn = max(last + 1, state.next_lsn, flushed + 1)
        if self._next_lsn != last + 1:
            # the log lost records that pages already hold (power loss with sync=False):
            # continue in a new generation so that the lsn sequence has no gap
            self._checkpoint(strict=True)
        else:
            self._flush([p for p in parts if p.due(self.tuning)], strict=True)

    # -- helpers ---------------------------------------------------------------------
    def _check_open(self, action: str) -> None:
        if self._closed:
            raise StoreClosedError(f"bloomstore {self.path}: {action} after close")

    def _io_error(self, action: str, exc: BaseException) -> StoreIOError:
        return StoreIOError(f"bloomstore {self.path}: {action} failed: "
                            f"{type(exc).__name__}: {exc}")

    def _state(self, wal_gen: int | None = None) -> StoreState:
        return StoreState(self.geometry, self._wal.gen if wal_gen is None else wal_gen,
                          self._next_lsn, [p.state for p in self._parts])

    def _read(self, part: Partition, page_no: int) -> Page:
        key = (part.index, part.state.gen, page_no)
        page = self._cache.get(key)
        if page is None:
            try:
                page = part.read_page(page_no)
            except OSError as exc:
                raise self._io_error(f"read of {part.where(page_no)}", exc) from exc
            self._counters["page_reads"] += 1
            self._cache.put(key, page)
        return page

    @staticmethod
    def _ops(puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> list[Op]:
        ops: list[Op] = [(k, None) for k in deletes]
        ops += [(k, v if type(v) is bytes else bytes(v)) for k, v in puts.items()]
        for key, value in ops:
            if type(key) is not bytes:
                raise TypeError(f"bloomstore: key {key!r} is {type(key).__name__}, not bytes")
            if len(key) >= MAX_KEY_BYTES:
                raise ConfigError(f"bloomstore: key of {len(key)} bytes, the limit is "
                                  f"{MAX_KEY_BYTES - 1}")
            if value is not None and len(value) > MAX_VALUE_BYTES:
                raise ConfigError(f"bloomstore: value of {len(value)} bytes, the limit is "
                                  f"{MAX_VALUE_BYTES}")
        return ops

    # -- write -----------------------------------------------------------------------
    def write(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes] = (),
              sync: bool = False) -> None:
        """Apply the puts and deletes (disjoint keys) atomically: one log record."""
        ops = self._ops(puts, deletes)
        with self._lock:
            self._check_open("write")
            if self._failed:
                raise StoreIOError(f"bloomstore {self.path}: write refused: {self._failed}")
            if not ops:
                if sync:
                    self._sync_locked()
                return
            self._make_room()
            wal = self._wal
            prev = wal.end
            try:
                wal.append(encode_record(self._next_lsn, ops))
                if sync:
                    wal.sync()
            except OSError as exc:
                wal.end = prev
                try:
                    os.ftruncate(wal.file.fd, prev)
                except OSError as cut:
                    self._failed = f"the log could not be cut after a failed write ({cut})"
                raise self._io_error(f"write of {len(ops)} ops (sync={sync})", exc) from exc
            self._next_lsn += 1
            self._counters["writes"] += 1
            touched = self._apply(ops)
            self._maintain(touched)

    def _apply(self, ops: list[Op]) -> set[int]:
        _, hi = digests([k for k, _ in ops])
        parts = self._parts
        indexes = partitions_of(hi, self.geometry.partitions).tolist()
        for (key, value), p in zip(ops, indexes, strict=True):
            parts[p].put(key, value)
        return set(indexes)

    def _make_room(self) -> None:
        limit = self.tuning.max_buffered_bytes
        if sum(p.buffer_bytes for p in self._parts) <= limit:
            return
        self._flush([p for p in self._parts if p.buffer])
        buffered = sum(p.buffer_bytes for p in self._parts)
        if buffered > limit:
            raise StoreIOError(
                f"bloomstore {self.path}: write refused: {buffered} bytes buffered, over "
                f"max_buffered_bytes {limit}, and flushes fail ({self._last_error})")

    def _maintain(self, touched: set[int]) -> None:
        """Flush full buffers, checkpoint a long log. The batch is already durable in
        the log: a failure here is recorded (stats: flush_errors, last_error) and
        retried at the next write, never raised."""
        try:
            self._flush([self._parts[i] for i in touched if self._parts[i].due(self.tuning)])
            if self._wal.end > self.tuning.wal_bytes:
                self._checkpoint()
        except (BloomStoreError, OSError) as exc:
            self._counters["flush_errors"] += 1
            self._last_error = f"{type(exc).__name__}: {exc}"

    def _flush(self, parts: list[Partition], strict: bool = False) -> bool:
        """Write the buffers of `parts` as pages, then one manifest append; False (or
        the error, if strict) when it failed: then nothing of it is visible."""
        parts = [p for p in parts if p.buffer]
        if not parts:
            return True
        done: list[tuple[Partition, list[FlushEdit]]] = []
        try:
            if self.tuning.fsync:
                self._wal.sync()  # pages never hold what the log could still lose
            for p in parts:
                done.append((p, p.write_buffer(self._next_lsn - 1, self.tuning)))
            if self.tuning.fsync:
                for p, _ in done:
                    p.sync_files()
            self._manifest.append([e for _, edits in done for e in edits])
        except OSError as exc:
            self._counters["flush_errors"] += 1
            self._last_error = f"flush: {type(exc).__name__}: {exc}"
            if strict:
                raise self._io_error("flush", exc) from exc
            return False
        for p, edits in done:
            p.commit(edits)
            self._counters["flushes"] += len(edits)
        for p, _ in done:
            self._maybe_compact(p)
        return True

    def _maybe_compact(self, part: Partition) -> None:
        """Compact `part` when its estimated dead ratio is over the threshold. Optional
        maintenance: a failure is recorded (stats: compaction_errors), never raised."""
        t = self.tuning
        if not (t.compact_min_pages and len(part.state.table) >= t.compact_min_pages
                and part.dead_ratio() >= t.dead_ratio):
            return
        try:
            self._compact(part)
        except BloomStoreError as exc:
            self._counters["compaction_errors"] += 1
            self._last_error = f"compaction: {exc}"

    def _checkpoint(self, strict: bool = False) -> bool:
        """Flush every buffer, start a new log generation, snapshot the manifest."""
        if not self._flush([p for p in self._parts if p.buffer], strict):
            return False
        old = self._wal
        new = Wal(self.path, old.gen + 1, self._next_lsn, create=True)
        try:
            if self.tuning.fsync:
                new.file.sync()
            self._manifest.write_snapshot(self._state(new.gen), self.tuning.fsync)
        except OSError as exc:
            new.close()
            new.path.unlink(missing_ok=True)
            self._last_error = f"checkpoint: {type(exc).__name__}: {exc}"
            if strict:
                raise self._io_error("checkpoint", exc) from exc
            return False
        self._wal = new
        old.close()
        old.path.unlink(missing_ok=True)
        self._counters["checkpoints"] += 1
        return True

    def copy_to(self, dest: Path) -> None:
        """A consistent copy into the new directory `dest` (its parent must exist):
        a checkpoint (every buffer to pages, a new empty log, the manifest), then the
        files a reopen reads (MANIFEST, the log, each partition's live pages and
        chain), each fsync'd, then `dest` itself. Writes wait meanwhile."""
        with self._lock:
            self._check_open("copy_to")
            self._checkpoint(strict=True)
            names = [MANIFEST_NAME, wal_name(self._wal.gen)]
            for p in self._parts:
                if p.state.gen:
                    names.extend(file_names(p.index, p.state.gen))
            try:
                dest.mkdir()
                for name in names:
                    copy_synced(self.path / name, dest / name)
                fsync_dir(dest)
            except OSError as exc:
                raise self._io_error(f"copy_to {dest}", exc) from exc

    # -- compaction ------------------------------------------------------------------
    def _compact(self, part: Partition) -> compact.CompactResult:
        before_pages, before_entries = len(part.state.table), part.state.entries
        before_bytes = part.state.table.end()
        if self.tuning.fsync:
            self._wal.sync()  # the snapshot's next lsn must not run ahead of the log
        keys, values = compact.live_entries(part, self._read)
        try:
            state, pages, chain = compact.write_generation(
                part, keys, values, self.tuning.page_bytes, self.tuning.fsync)
        except OSError as exc:
            raise self._io_error(f"compaction of partition {part.index}", exc) from exc
        snapshot = self._state()
        snapshot.parts = [state if p is part else p.state for p in self._parts]
        try:
            self._manifest.write_snapshot(snapshot, self.tuning.fsync)
        except OSError as exc:
            compact.discard(pages, chain)
            raise self._io_error(f"compaction of partition {part.index}", exc) from exc
        self._cache.drop_partition(part.index)
        part.adopt(state, pages, chain)
        self._counters["compactions"] += 1
        return compact.CompactResult(part.index, before_pages, len(state.table),
                                     before_entries, state.entries, before_bytes,
                                     state.table.end())

    def compact(self, partitions: Iterable[int] | None = None) -> list[compact.CompactResult]:
        """Compact the given partitions (default: every partition with pages)."""
        with self._lock:
            self._check_open("compact")
            chosen = range(len(self._parts)) if partitions is None else partitions
            return [self._compact(self._parts[i]) for i in chosen
                    if len(self._parts[i].state.table)]

    def checkpoint(self) -> None:
        """Flush every buffer to pages and start a new (empty) log."""
        with self._lock:
            self._check_open("checkpoint")
            self._checkpoint(strict=True)

    # -- read ------------------------------------------------------------------------
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The value of every key (None where absent), in order."""
        with self._lock:
            self._check_open("get_many")
            out: list[bytes | None] = [None] * len(keys)
            if not keys:
                return out
            lo, hi = digests(keys)
            groups: dict[int, list[int]] = {}
            for j, p in enumerate(partitions_of(hi, self.geometry.partitions).tolist()):
                groups.setdefault(p, []).append(j)
            for p, idxs in groups.items():
                part = self._parts[p]
                buf = part.buffer
                rest = []
                for j in idxs:
                    key = keys[j]
                    if key in buf:
                        out[j] = buf[key]
                    else:
                        rest.append(j)
                if rest and len(part.state.table):
                    self._lookup(part, [keys[j] for j in rest], lo[rest], hi[rest], rest, out)
            return out

    def _lookup(self, part: Partition, keys: list[bytes], lo: U64, hi: U64,
                slots: list[int], out: list[bytes | None]) -> None:
        """Read the candidate pages of `keys` newest first, in rounds: round r reads
        the r-th candidate of every key still unresolved, each page once."""
        cands = part.candidates(lo, hi)
        length = len(part.state.table)
        c = self._counters
        c["lookups"] += len(keys)
        active = [i for i in range(len(keys)) if cands[i]]
        c["negative_filter_tests"] += length * (len(keys) - len(active))
        depth = 0
        while active:
            by_page: dict[int, list[int]] = {}
            for i in active:
                by_page.setdefault(cands[i][depth], []).append(i)
            still: list[int] = []
            for page_no, members in by_page.items():
                page = self._read(part, page_no)
                c["lookup_page_reads"] += 1
                hits = page.find_many([keys[i] for i in members], lo[members])
                for i, e in zip(members, hits, strict=True):
                    if e < 0:
                        c["false_positive_reads"] += 1
                        if depth + 1 < len(cands[i]):
                            still.append(i)
                        else:
                            c["negative_filter_tests"] += length
                        continue
                    c["negative_filter_tests"] += length - 1 - page_no
                    out[slots[i]] = None if page.is_tombstone(e) else page.value(e)
            active = still
            depth += 1

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for start <= key < end in key order, as of the first step."""
        with self._lock:
            self._check_open("scan")
            if start >= end:
                return
            self._counters["scans"] += 1
            items = scan.collect(self._parts, start, end, self._read)
        for key, found in items:
            if isinstance(found, bytes):
                yield key, found
                continue
            with self._lock:
                if self._closed:
                    raise StoreClosedError(f"bloomstore {self.path}: closed during a scan")
                page = self._cache.get(found.page_key)
                try:
                    if page is not None:
                        value = page.data[found.offset : found.offset + found.length]
                    else:
                        value = found.file.read(found.length, found.page_offset + found.offset)
                except (OSError, EOFError) as exc:
                    raise self._io_error("scan", exc) from exc
            yield key, value

    # -- durability and shutdown -------------------------------------------------------
    def _sync_locked(self) -> None:
        try:
            self._wal.sync()
            self._manifest.sync()
        except OSError as exc:
            raise self._io_error("sync", exc) from exc

    def sync(self) -> None:
        """Make every write so far durable (fsync of the log)."""
        with self._lock:
            self._check_open("sync")
            self._sync_locked()

    def _close_files(self) -> None:
        for p in self._parts:
            p.close()
        for obj in (getattr(self, "_wal", None), self._manifest):
            if obj is not None:
                obj.close()
        self._cache.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def close(self) -> None:
        """fsync the log and the manifest's tail, close every file. The buffers are
        not flushed: the next open replays them from the log. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            error: OSError | None = None
            try:
                self._wal.sync()
                self._manifest.sync()
            except OSError as exc:
                error = exc
            finally:
                self._close_files()
                self._release()
            if error is not None:
                raise self._io_error("close", error) from error

    # -- introspection ---------------------------------------------------------------
    def partition_of(self, key: bytes) -> int:
        _, hi = digests([key])
        return int(partitions_of(hi, self.geometry.partitions)[0])

    def candidate_pages(self, key: bytes) -> list[int]:
        """The pages of the key's partition its chain lookup would read, newest first."""
        with self._lock:
            self._check_open("candidate_pages")
            lo, hi = digests([key])
            return self._parts[self.partition_of(key)].candidates(lo, hi)[0]

    def page_keys(self, partition: int, page: int) -> list[bytes]:
        with self._lock:
            self._check_open("page_keys")
            return self._read(self._parts[partition], page).keys()

    def page_counts(self) -> list[int]:
        return [len(p.state.table) for p in self._parts]

    def stats(self) -> dict[str, int | float | str]:
        with self._lock:
            out: dict[str, int | float | str] = {
                "path": str(self.path), "disk_bytes": file_bytes(self.path),
                "open": int(not self._closed)}
            if self._closed or not self._parts:
                return out
            out.update(self._stats())
            return out

    def _stats(self) -> dict[str, int | float | str]:
        g, c, parts = self.geometry, self._counters, self._parts
        chains = np.array(self.page_counts(), np.int64)
        on_pages = sum(p.state.entries for p in parts)
        buffered = sum(len(p.buffer) for p in parts)
        tables = sum(p.state.table.nbytes for p in parts)
        buffers = sum(p.buffer_ram() for p in parts)
        index_ram = tables + _FIXED_RAM + 512 * len(parts)
        keys = max(1, on_pages + buffered)
        negatives = c["negative_filter_tests"]
        return {
            **c,
            "partitions": g.partitions, "keys_per_page": g.keys_per_page,
            "bits_per_key": g.bits_per_key, "hashes": g.hashes,
            "filter_bits": g.filter_bits, "page_bytes": self.tuning.page_bytes,
            "target_fp_rate": g.target_fp_rate,
            "false_positive_rate": c["false_positive_reads"] / negatives if negatives else 0.0,
            "extra_page_reads_per_lookup":
                c["false_positive_reads"] / c["lookups"] if c["lookups"] else 0.0,
            "pages": int(chains.sum()), "chain_length_max": int(chains.max()),
            "chain_length_mean": float(chains.mean()),
            "chain_lengths": ",".join(map(str, chains.tolist())),
            "entries_on_pages": on_pages, "buffered_entries": buffered,
            "dead_estimate": sum(p.state.dead for p in parts),
            "tombstones_on_pages": sum(p.state.tombstones for p in parts),
            "ram_bytes": index_ram + buffers, "ram_bytes_per_key": (index_ram + buffers) / keys,
            "index_ram_bytes": index_ram, "index_ram_bytes_per_key": index_ram / keys,
            "buffer_ram_bytes": buffers, "cache_bytes": self._cache.capacity,
            "cache_used_bytes": self._cache.used,
            "chain_mapped_bytes": sum(p.chain.mapped_bytes() for p in parts if p.chain),
            "wal_bytes": self._wal.end, "wal_generation": self._wal.gen,
            "next_lsn": self._next_lsn, "last_error": self._last_error,
        }
