"""The store: the backend under the index, and everything read from it.

`Store` owns the backend handle, the decoded-segment cache, the on-disk `Counters`,
the per-namespace block counts (quotas), the index's `Activity` counters, and the
one rule that turns a sequence into block ids (`seq_ids`). Every backend call of
the core goes through it, and it maps the backends' own errors (backends/errors.py)
to sarp's in ONE place (`backend_errors`):

    BackendIOError     -> StorageError        (nothing of the batch persisted)
    BackendCorrupt     -> CorruptData         (never served as data)
    BackendFormatError -> FormatVersionError  (engine files of another format)
    BackendConfigError -> ConfigError         (an unknown engine, a bad tunable)

sarp's own errors pass through unchanged. `open_backend` opens an engine by name
with the same mapping, for the daemon and the tools.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends import registry
from backends.base import Backend, WriteBatch
from backends.errors import (
    BackendConfigError,
    BackendCorrupt,
    BackendError,
    BackendFormatError,
    BackendIOError,
)
from sarpd.config import IndexConfig
from sarpd.core import native
from sarpd.core.blockmap import MapArrays, Spill, block_map_generation
from sarpd.core.copies import Copies
from sarpd.core.delta import DELTA_PREFIX, by_segment, delta_key, merge
from sarpd.core.ids import (
    chain_ids,
    chain_ids_many,
    check_sequence_tokens,
    ns_root,
    salt_ids,
    salt_ids_many,
)
from sarpd.core.manifest import check_manifest, encode_manifest, missing_manifest
from sarpd.core.native import BlockMapLike, Kernels
from sarpd.core.segment import (
    APPLIED_KEY,
    BLOCK_PREFIX,
    COUNTERS_KEY,
    LOCATOR,
    MANIFEST_KEY,
    SEG_PREFIX,
    Counters,
    Loader,
    Segment,
    block_keys,
    decode_segment,
    encode_segment,
    locator_records,
    ns_count_key,
    seg_key,
)
from sarpd.errors import (
    ConfigError,
    CorruptData,
    FormatVersionError,
    SarpError,
    StorageError,
    TooLarge,
    missing_extra,
)
from sarpd.model import IdArray, SeqSpec, U64Array

log = logging.getLogger(__name__)

SEGMENT_CACHE = 4096  # decoded segments kept in memory between batches (~7 MB)
_AFTER_BLOCKS = bytes([BLOCK_PREFIX[0] + 1])  # the end of the locator records' key range

_MAPPED: tuple[tuple[type[BackendError], type[SarpError]], ...] = (
    (BackendIOError, StorageError),
    (BackendCorrupt, CorruptData),
    (BackendFormatError, FormatVersionError),
    (BackendConfigError, ConfigError),
)


@contextmanager
def backend_errors() -> Iterator[None]:
    """Raise a backend's error as the sarp error of the same meaning (same message)."""
    try:
        yield
    except BackendError as exc:
        for theirs, ours in _MAPPED:
            if isinstance(exc, theirs):
                raise ours(exc.message) from exc
        raise StorageError(exc.message) from exc


def data_paths(data_dir: Path, backend: str) -> tuple[Path, Path]:
    """THE layout of a sarpd data directory: (the engine's files, the directory
    snapshots) = DATA/<backend>, DATA/snapshots/<backend>. A checkpoint has it too."""
    return data_dir / backend, data_dir / "snapshots" / backend


def open_backend(name: str, path: Path, *, cache_bytes: int,
                 direct_io: bool = False) -> Backend:
    """`backends.registry.open_backend`, with the backends' errors mapped to sarp's (an
    engine whose optional package is missing: a ConfigError naming its extra)."""
    try:
        with backend_errors():
            return registry.open_backend(name, path, cache_bytes=cache_bytes,
                                         direct_io=direct_io)
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc.name)
        if extra is None:
            raise
        raise ConfigError(f"backend {name} {extra}") from exc


@dataclass(slots=True)
class Activity:
    """What the index has done since it was opened (read by `stats` and the metrics)."""

    matches: int = 0
    matched_blocks: int = 0
    queried_blocks: int = 0
    segment_reads: int = 0  # segments read from the backend (cache misses)
    corrupt_segments: int = 0  # values that failed their checks (not served)
    write_batches: int = 0
    extra_rounds: int = 0  # bound-and-verify rounds after the first (match and insert)
    locator_reads: int = 0  # next-block lookups that settle a tied window in one read


class Store:
    def __init__(self, backend: Backend, cfg: IndexConfig, kernels: Kernels | None = None
                 ) -> None:
        self.backend = backend
        self.cfg = cfg
        self.k = kernels or native.pick()  # the index's kernels (sarpd.core.native)
        self.activity = Activity()
        # decoded segments between batches (sarpd/core/segcache.py): the match kernel's
        # own when it is built, which it reads in C
        self.segment_cache = self.k.segment_cache(SEGMENT_CACHE)
        self.segment_cache.decoder = _decoder(self.k)  # what `read_views` puts becomes
        # matches may run on several threads at once (no write meanwhile, issue 25):
        # held while the cache changes and while `activity` counts reads
        self.lock = threading.Lock()
        self._ns_blocks: dict[int, int] = {}  # namespace tag -> indexed blocks (as stored)
        self.copies = Copies(cfg.segment_blocks)  # hot windows' copies (the writer's)
        # where recently stored blocks live, by id (issue 24): None without locators
        self.blockmap: BlockMapLike | None = self.k.block_map(
            cfg.block_map_bytes, block_map_generation(cfg.block_map_bytes)
        ) if cfg.block_locators else None
        # segments with delta records on the backend (sarpd/core/delta.py), merged, and
        # how many records each has: read from here, never from their base (issue 24)
        self.pending: dict[int, Segment | None] = {}  # None: a record failed its checks
        self.pending_records: dict[int, int] = {}
        self.pending_bytes = 0  # their memory (`seg_bytes` each), kept as they change
        self._open_manifest()
        # whether the backend may hold locator records (the map's spills, an import's,
        # data from before issue 24): until one is written, a block the map does not
        # hold is present nowhere, and `locate_arrays` reads nothing for it
        self.locators_written = self._has_keys(BLOCK_PREFIX, _AFTER_BLOCKS)
        self._counters = Counters.decode(self.get_one(COUNTERS_KEY))
        self._applied = self._read_applied()
        self._load_pending()

    # -- the backend, errors mapped ----------------------------------------------------
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with backend_errors():
            return self.backend.get_many(keys)

    def get_one(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def scan(self, start: bytes, end: bytes) -> Generator[tuple[bytes, bytes], None, None]:
        with backend_errors():
            yield from self.backend.scan(start, end)

    def indexed(self, ids: IdArray) -> list[bool]:
        """Whether each block (internal ids) may be present in a segment: held by the
        block map or by a locator record (only with `block_locators`; `locate`). False
        proves that no segment holds it present."""
        got: list[bool] = (self.locate_arrays(ids)[1] >= 0).tolist()
        return got

    def locate(self, ids: IdArray) -> list[tuple[int, int] | None]:
        """(head key, position) of each block (internal ids): `locate_arrays`, as
        tuples; None: present in no segment."""
        heads, pos = self.locate_arrays(ids)
        return [(h, p) if p >= 0 else None
                for h, p in zip(heads.tolist(), pos.tolist(), strict=True)]

    def locate_arrays(self, ids: IdArray, memo: dict[bytes, tuple[int, int]] | None = None,
                      leaving: bool = False) -> tuple[U64Array, npt.NDArray[np.int64]]:
        """(head keys, positions) of blocks (internal ids), position -1 where present in
        no segment: the block map's, else the locator record's (what the map spilled or
        the importer wrote; one multi-get for the batch's misses). `memo`: records read
        before (a write transaction's: the backend does not change within it), by key;
        the ones read now are added (-1: none). `leaving`: a removal's blocks, which the
        map does not refresh (`peek`)."""
        assert self.blockmap is not None
        heads, pos = (self.blockmap.peek if leaving else self.blockmap.lookup)(ids)
        if not self.locators_written:
            return heads, pos
        miss = np.flatnonzero(pos < 0)
        if not len(miss):
            return heads, pos
        keys = block_keys(ids[miss], self.k)
        memo = {} if memo is None else memo
        ask = [k for k in dict.fromkeys(keys) if k not in memo]
        if ask:
            with self.lock:
                self.activity.locator_reads += len(ask)
            for k, v in zip(ask, self.get_many(ask), strict=True):
                memo[k] = (0, -1) if v is None else LOCATOR.unpack(v)
        for i, k in zip(miss.tolist(), keys, strict=True):
            heads[i], pos[i] = memo[k]
        return heads, pos

    def hold(self, gone: IdArray | None, ids: IdArray | None, heads: U64Array | None,
             pos: npt.NDArray[Any] | None, batch: WriteBatch) -> None:
        """The block map forgets `gone` (blocks no segment holds present any more) and
        holds `ids` at (`heads`, `pos`); what it evicts goes into `batch` as locator
        records (the spill: written with the data, so the map or the records hold
        every present block at every point). Memory changes before the batch is
        written: a failed write reloads the index, the map included (`reset`)."""
        if self.blockmap is None:
            return
        if gone is not None and len(gone):
            self.blockmap.discard(gone)
        if ids is not None and len(ids):
            assert heads is not None and pos is not None
            self.put_spill(batch, self.blockmap.add(ids, heads, pos))

    def put_spill(self, batch: WriteBatch, spill: Spill | None) -> None:
        """Put the locator records of what the block map evicted into `batch` (THE
        place locator records are made: `locators_written` follows it)."""
        if spill is not None:
            self.locators_written = True
            batch.put_many(locator_records(spill.ids, spill.heads, spill.pos, self.k))

    def write(self, batch: WriteBatch, sync: bool) -> None:
        with backend_errors():
            self.backend.write(batch, sync)

    def sync(self) -> None:
        """Make everything written so far durable (`Backend.sync`)."""
        with backend_errors():
            self.backend.sync()

    def copy_to(self, dest: Path) -> None:
        """The backend's consistent copy of what is written (`Backend.copy_to`)."""
        with backend_errors():
            self.backend.copy_to(dest)

    def resume(self) -> None:
        """Make the backend writable again after a failed write (Backend.resume)."""
        with backend_errors():
            self.backend.resume()

    def backend_stats(self) -> dict[str, int | float | str]:
        with backend_errors():
            return self.backend.stats()

    @property
    def cache_segments(self) -> int:
        """The decoded-segment cache's size (the bench sizes it)."""
        return self.segment_cache.capacity

    @cache_segments.setter
    def cache_segments(self, value: int) -> None:
        self.segment_cache.capacity = value

    def close(self) -> None:
        self.segment_cache.clear()
        with backend_errors():
            self.backend.close()

    # -- the manifest --------------------------------------------------------------------
    def _open_manifest(self) -> None:
        raw = self.get_one(MANIFEST_KEY)
        if raw is not None and not check_manifest(raw, self.cfg):
            return
        if raw is None and self._holds_data():
            raise missing_manifest()
        wb = WriteBatch()
        wb.put(MANIFEST_KEY, encode_manifest(self.cfg))
        self.write(wb, True)

    def _holds_data(self) -> bool:
        return self.get_one(COUNTERS_KEY) is not None or self._has_keys(SEG_PREFIX, b"T")

    def _has_keys(self, start: bytes, end: bytes) -> bool:
        """Whether the backend holds a key in [start, end)."""
        scan = self.scan(start, end)
        try:
            return next(scan, None) is not None
        finally:
            scan.close()

    # -- state ---------------------------------------------------------------------------
    @property
    def counters(self) -> Counters:
        """The committed counters (as on the backend)."""
        return self._counters

    @property
    def applied_seq(self) -> int:
        """The last log sequence applied (as on the backend; 0: none)."""
        return self._applied

    def _read_applied(self) -> int:
        raw = self.get_one(APPLIED_KEY)
        if raw is None:
            return 0
        if len(raw) != 8:
            raise CorruptData(f"applied sequence record: {len(raw)} bytes, expected 8")
        return int.from_bytes(raw, "little")

    def commit(self, batch: WriteBatch, sync: bool, counters: Counters,
               ns_blocks: Mapping[int, int] | None = None,
               segments: Iterable[Segment] = (), applied_seq: int | None = None,
               records: Mapping[int, int] | None = None) -> None:
        """Write `batch` (which holds `counters` and the namespace counts where they
        changed, and `applied_seq` when given), then make memory follow: the counters,
        the namespace counts, the applied sequence and the committed `segments`
        (working copies enter the cache once durable); `records`: segment -> its delta
        records now (0: folded, none left)."""
        if applied_seq is not None:
            batch.put(APPLIED_KEY, applied_seq.to_bytes(8, "little"))
        if len(batch):
            self.write(batch, sync)
        if applied_seq is not None:
            self._applied = applied_seq
        self._counters = counters
        if ns_blocks:
            self._ns_blocks.update(ns_blocks)
        done = {seg.seg_id: seg for seg in segments}
        self.remember_many(done)
        for sid, k in (records or {}).items():
            self.pending_bytes -= seg_bytes(self.pending.pop(sid, None))
            if k:
                self.pending_records[sid] = k
                self.pending[sid] = done[sid]  # now the newest: folded last
                self.pending_bytes += seg_bytes(done[sid])
            else:
                self.pending_records.pop(sid, None)

    def reset(self) -> None:
        """Forget what memory holds of the disk and re-read the counters (a reload)."""
        self.segment_cache.clear()
        self.copies.clear()
        if self.blockmap is not None:
            self.blockmap.clear()
        self._ns_blocks.clear()
        self._counters = Counters.decode(self.get_one(COUNTERS_KEY))
        self._applied = self._read_applied()
        self._load_pending()

    # -- delta records -----------------------------------------------------------------
    def _load_pending(self) -> None:
        """Read every delta record (few: `[index] delta_bytes` bounds them) and merge each
        segment's onto its base."""
        self.pending.clear()
        self.pending_records.clear()
        self.pending_bytes = 0
        records = by_segment(self.scan(DELTA_PREFIX, DELTA_PREFIX + b"\xff"))
        if not records:
            return
        bases = dict(zip(records, self.get_many([seg_key(sid) for sid in records]),
                         strict=True))
        for sid, recs in records.items():
            self.pending_records[sid] = len(recs)
            seg = self.decode_or_none(sid, bases[sid])
            try:
                if seg is None:
                    raise CorruptData("delta records without a segment")
                seg = merge(seg, recs)
            except CorruptData as exc:
                self.activity.corrupt_segments += 1
                log.error("segment %d not served: %s", sid, exc)
                seg = None
            self.pending[sid] = seg
            self.pending_bytes += seg_bytes(seg)

    def fold(self, sync: bool) -> int:
        """Write every segment that has delta records whole again and delete its records,
        in one write batch (a segment whose records failed their checks is left as it
        is, for `check`). Returns how many were folded."""
        wb, done = WriteBatch(), []
        for sid, seg in self.pending.items():
            if seg is not None:
                self.fold_into(wb, seg)
                done.append(sid)
        if done:
            self.write(wb, sync)
        for sid in done:
            self.pending_bytes -= seg_bytes(self.pending.pop(sid))
            del self.pending_records[sid]
        return len(done)

    def fold_into(self, batch: WriteBatch, seg: Segment) -> None:
        """Put `seg` whole in `batch` and delete its delta records there (the one way a
        segment is folded: both in one write batch)."""
        batch.put(seg_key(seg.seg_id), encode_segment(seg, self.k))
        for k in range(self.pending_records.get(seg.seg_id, 0)):
            batch.delete(delta_key(seg.seg_id, k))

    def forget_segments(self) -> None:
        """Drop the decoded-segment cache (its segments are read again when needed)
        and the copies map (`check --fix` rebuilds routing points)."""
        self.segment_cache.clear()
        self.copies.clear()

    def cached_segments(self) -> list[tuple[int, Segment]]:
        """The segments the cache holds, least recently used first (read-only)."""
        with self.lock:
            return self.segment_cache.items()

    def ns_blocks(self, tag: int) -> int:
        """Blocks indexed in the namespace with this tag, as committed (kept per
        namespace on the backend, read once; quotas count them)."""
        n = self._ns_blocks.get(tag)
        if n is None:
            raw = self.get_one(ns_count_key(tag))
            n = self._ns_blocks[tag] = int.from_bytes(raw, "little") if raw else 0
        return n

    # -- sequences -----------------------------------------------------------------------
    def seq_ids(self, seq: SeqSpec, parent: bytes | None = None) -> IdArray:
        """THE sequence -> internal ids rule: tokens are chained after `parent` (an
        internal id's 16 bytes) or the namespace root; caller ids are salted."""
        if seq.tokens is not None:
            check_sequence_tokens(len(seq.tokens), self.cfg.max_sequence_tokens)
            return chain_ids(parent or ns_root(seq.ns), seq.tokens, self.cfg.block_tokens,
                             self.k)
        assert seq.hashes is not None
        return salt_ids(seq.ns, seq.hashes, self.k)

    def seq_ids_many(self, seqs: Sequence[SeqSpec]) -> Sequence[IdArray | TooLarge]:
        """`seq_ids` of a batch (no parents): every token sequence of it hashed in ONE
        call (native hashing: one C call per batch); a sequence `seq_ids` refuses gets
        its error in its place. A batch of caller ids only (a router's) is salted in one
        pass into one array: `salt_ids_many`'s `Joined`."""
        if len(seqs) == 1 and seqs[0].hashes is not None and seqs[0].tokens is None:
            return [salt_ids(seqs[0].ns, seqs[0].hashes, self.k)]  # a lone caller-id query
        hashes = [seq.hashes for seq in seqs if seq.tokens is None and seq.hashes is not None]
        if len(hashes) == len(seqs):
            return salt_ids_many([seq.ns for seq in seqs], hashes, self.k)
        out: dict[int, IdArray | TooLarge] = {}
        todo: list[int] = []
        salted: list[int] = []
        for i, seq in enumerate(seqs):
            if seq.tokens is None:
                salted.append(i)
                continue
            try:
                check_sequence_tokens(len(seq.tokens), self.cfg.max_sequence_tokens)
                todo.append(i)
            except TooLarge as exc:
                out[i] = exc
        if todo:
            tokens = [t for t in (seqs[i].tokens for i in todo) if t is not None]
            ids = chain_ids_many([ns_root(seqs[i].ns) for i in todo], tokens,
                                 self.cfg.block_tokens, self.k)
            out.update(zip(todo, ids, strict=True))
        if salted:  # caller ids: salted in one pass for the batch (`salt_ids_many`)
            hashes = [h for h in (seqs[i].hashes for i in salted) if h is not None]
            out.update(zip(salted, salt_ids_many([seqs[i].ns for i in salted], hashes, self.k),
                           strict=True))
        return [out[i] for i in range(len(seqs))]

    # -- segments ------------------------------------------------------------------------
    def decode_or_none(self, sid: int, value: bytes | None) -> Segment | None:
        if value is None:
            return None
        try:
            return decode_segment(value, sid, self.k)
        except (CorruptData, FormatVersionError) as exc:
            self.activity.corrupt_segments += 1
            log.error("segment %d not served: %s", sid, exc)
            return None

    def fetch(self, sids: list[int]) -> dict[int, Segment | None]:
        """Decoded segments (None: missing or corrupt): recently used ones from memory,
        the rest in ONE backend multi-get. The cache holds committed segments only
        (a write batch's working copies enter it when the batch is durable), so a
        turn's insert finds the segments its match just read."""
        cache, pending = self.segment_cache, self.pending
        with self.lock:  # a hit moves to the recent end: not while another thread trims
            hits, missing = cache.hits(sids)
        out: dict[int, Segment | None] = dict(hits)
        if pending and missing:  # base + delta records, merged
            out.update((sid, pending[sid]) for sid in missing if sid in pending)
            missing = [sid for sid in missing if sid not in pending]
        if missing:
            try:
                values = self.get_many([seg_key(s) for s in missing])
            except CorruptData:  # an engine page failed its checksum: find its segments
                values = [self._get_or_none(s) for s in missing]
            decode = self.decode_or_none
            for sid, value in zip(missing, values, strict=True):
                out[sid] = decode(sid, value)
            with self.lock:
                self.activity.segment_reads += len(missing)
                # not cached: in at the recent end, then `remember_many`'s trim
                cache.put_many({sid: seg for sid in missing if (seg := out[sid]) is not None})
        return out

    def read_views(self, sids: list[int]) -> dict[int, object]:
        """`fetch` for the match kernel (its `read`: the segments its cache lacks): the
        missing ones' stored values go into the cache as they are (`put_values`: checked
        there, decoded only when Python code asks for them) and to the kernel as its
        views of them; a value the cache refuses (corrupt, or not bytes) is decoded here
        as `fetch` does. No cache hits are looked for: the kernel found none."""
        out: dict[int, object] = {}
        pending, missing = self.pending, sids
        if pending:  # base + delta records, merged
            out.update((sid, pending[sid]) for sid in missing if sid in pending)
            missing = [sid for sid in missing if sid not in pending]
        if not missing:
            return out
        try:
            values = self.get_many([seg_key(s) for s in missing])
        except CorruptData:  # an engine page failed its checksum: find its segments
            values = [self._get_or_none(s) for s in missing]
        with self.lock:
            self.activity.segment_reads += len(missing)
            views = self.segment_cache.put_values(missing, values)
        out.update(views)
        if len(views) < len(missing):
            rest = {sid: seg for sid, value in zip(missing, values, strict=True)
                    if sid not in views and (seg := self.decode_or_none(sid, value)) is not None}
            self.remember_many(rest)
            out.update(rest)
        return out

    def read(self, sids: list[int]) -> dict[int, Segment]:
        """`fetch`, without the segments that are missing or corrupt."""
        return {sid: seg for sid, seg in self.fetch(sids).items() if seg is not None}

    def loader(self, cache: dict[int, Segment | None]) -> Loader:
        """A loader that keeps what it reads in `cache` (a batch's own segments: a
        write transaction's working copies, a recovery pass's reads) and reads the
        segments `cache` lacks through `fetch`."""
        def load(sids: Iterable[int]) -> Mapping[int, Segment | None]:
            missing = [s for s in dict.fromkeys(sids) if s not in cache]
            if missing:
                cache.update(self.fetch(missing))
            return cache

        return load

    def _get_or_none(self, sid: int) -> bytes | None:
        """One segment's value; None (logged, counted) where the engine reports it corrupt."""
        try:
            return self.get_one(seg_key(sid))
        except CorruptData as exc:
            self.activity.corrupt_segments += 1
            log.error("segment %d not served: %s", sid, exc)
            return None

    def remember_many(self, segs: Mapping[int, Segment]) -> None:
        """Put segments in the cache at its recent end, in order, and trim it once (the
        same cache as remembering each in turn: the trim takes the oldest first)."""
        with self.lock:
            self.segment_cache.put_many(segs)


def _decoder(k: Kernels) -> Callable[[int, bytes], Segment]:
    """The segment cache's decoder (`put_values`): decode_segment with the index's
    kernels. (Not a bound method of the store: the cache would hold the store.)"""
    def decode(sid: int, value: bytes) -> Segment:
        return decode_segment(value, sid, k)

    return decode


def seg_bytes(seg: Segment | None) -> int:
    """What a decoded segment with delta records is counted as (`Store.pending_bytes`)."""
    return 0 if seg is None else 48 + 24 * seg.nblocks + 16 * len(seg.xmeta)


class Held:
    """Recovery's feed of the block map (issue 24): starts it empty or from a snapshot's
    entries, then adds the present blocks of every re-routed segment, in chunks; what
    the map evicts meanwhile is written as locator records (`flush`: the last write
    synced), so that the map or the records hold every present block again."""

    CHUNK = 65_536  # blocks added to the map at once
    WRITE = 1 << 18  # locator records per write batch

    def __init__(self, store: Store) -> None:
        self.store, self.map = store, store.blockmap
        self._parts: list[tuple[IdArray, U64Array, npt.NDArray[Any]]] = []
        self._n = 0
        self._batch = WriteBatch()
        self._wrote = False
        if self.map is not None:
            self.map.clear()

    def load(self, arrays: MapArrays | None) -> None:
        """Start from a snapshot's entries (None: a format 1 snapshot, whose data has a
        locator record for every block: the map starts empty)."""
        if self.map is not None and arrays is not None:
            self._spill(self.map.load_arrays(arrays))

    def segment(self, seg: Segment) -> None:
        """Hold the segment's present blocks."""
        if self.map is None or not seg.presence:
            return
        n = seg.nblocks
        bits = np.unpackbits(np.frombuffer(seg.presence.to_bytes(8, "little"), np.uint8),
                             bitorder="little")[:n]
        offs = np.flatnonzero(bits)
        head = int(seg.ids[0, 0])
        self._parts.append((seg.ids[offs], np.full(len(offs), head, np.uint64),
                            seg.window * self.store.cfg.segment_blocks + offs))
        self._n += len(offs)
        if self._n >= self.CHUNK:
            self._add()

    def flush(self) -> None:
        self._add()
        if len(self._batch) or self._wrote:
            self.store.write(self._batch, True)
            self._batch = WriteBatch()

    def _add(self) -> None:
        if self.map is None or not self._parts:
            return
        ids, heads, pos = (np.concatenate(p) for p in zip(*self._parts, strict=True))
        self._parts, self._n = [], 0
        self._spill(self.map.add_bulk(ids, heads, pos))

    def _spill(self, spill: Spill | None) -> None:
        if spill is None:
            return
        self.store.put_spill(self._batch, spill)
        if len(self._batch) >= self.WRITE:
            self.store.write(self._batch, False)
            self._batch, self._wrote = WriteBatch(), True
