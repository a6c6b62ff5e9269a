"""SarpIndex: match / insert / remove / clear over a Backend.

Synchronous and pure: no I/O but the backend interface and the snapshot directory.
Not thread-safe: the daemon runs every batch (and snapshots) on one worker thread.

Match (DESIGN.md): for each query, ids -> for every 64-block window the deepest
routing point present in the directory (all lattice offsets of the batch probed in
one vectorised lookup) -> the `window_cap` strongest candidates by fingerprint
agreement -> ONE backend multi-get for every candidate of the batch -> verify full
ids and presence -> the longest gap-free run from position 0.

Routing invariant (kept by `register`): if a routing key k at offset o > 0 of window
w is in the directory, every live segment whose block at o has that id is listed
under k. Offset 0 of every segment is always listed. A base point (16, 32, 48) is
pruned for a segment while its predecessor lists <= `prune_max_pred` segments; when
the predecessor grows past it the earlier ones are added ("un-pruned"). A posting
list that reaches (T+1), 2(T+1), ... entries is refined at the next lattice midpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.base import Backend, WriteBatch
from sarpd.config import IndexConfig
from sarpd.core import verify
from sarpd.core.directory import Directory
from sarpd.core.ids import HASH_NAME, chain_ids, ns_root, salt_ids
from sarpd.core.routing import (
    Geometry,
    agreement,
    filter_at,
    filters_at,
    fingerprints,
    top_candidates,
)
from sarpd.core.segment import (
    COUNTERS_KEY,
    LOG_PREFIX,
    MANIFEST_KEY,
    SEG_PREFIX,
    SEGMENT_FORMAT,
    Counters,
    Segment,
    decode_segment,
    log_key,
    ns_count_key,
    seg_id_of_key,
    seg_key,
)
from sarpd.core.snapshot import (
    SnapshotMeta,
    list_snapshots,
    load_newest,
    read_snapshot,
    write_snapshot,
)
from sarpd.core.writer import WriteTxn
from sarpd.errors import CorruptData, FormatVersionError, SarpError, StorageError, TooLarge
from sarpd.model import (
    CheckReport,
    Clear,
    IdArray,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Remove,
    RemoveResult,
    SnapshotResult,
)

log = logging.getLogger(__name__)

WriteOp = Insert | Remove | Clear
FORMAT_VERSION = 1  # on-disk format of the whole data set (manifest)
RANKED_MAX = 65_536  # candidate rankings kept between writes (a bound for read-only runs)
SEGMENT_CACHE = 4096  # decoded segments kept in memory between batches (~7 MB)
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    seconds: float
    snapshot_segment_id: int  # newest segment in the snapshot used; 0 when none
    segments_rerouted: int
    full_scan: bool
    warning: str | None = None


class SarpIndex:
    def __init__(self, backend: Backend, config: IndexConfig,
                 snapshot_dir: Path | None = None, sync: bool = True) -> None:
        self.backend = backend
        self.cfg = config
        self.geo = Geometry.of(config)
        self.dir = Directory(config.delta_max_entries)
        self.snapshot_dir = snapshot_dir
        self.sync = sync
        self._check_manifest()
        raw = backend.get_many([COUNTERS_KEY])[0]
        self.counters = Counters.decode(raw)
        self.watermark = 0
        self.recovered_in_s: float | None = None
        self.matches = 0
        self.matched_blocks = 0
        self.queried_blocks = 0
        self.segment_reads = 0
        self.corrupt_segments = 0
        self.writes = 0
        self._seg_cache: OrderedDict[int, Segment] = OrderedDict()
        # candidates() rankings, valid while the directory's version is unchanged
        self._ranked: dict[bytes, list[int]] = {}
        self._ranked_at = -1
        self._ns_blocks: dict[int, int] = {}  # namespace tag -> indexed blocks (as stored)
        self._stale = False  # memory may differ from the disk: a commit failed
        self._resume = False  # the backend must be made writable before the next write

    # -- opening -------------------------------------------------------------------
    def _manifest(self) -> dict[str, object]:
        return {"format": FORMAT_VERSION, "segment_format": SEGMENT_FORMAT, "hash": HASH_NAME,
                "block_tokens": self.cfg.block_tokens, "segment_blocks": self.cfg.segment_blocks,
                "block_locators": self.cfg.block_locators}

    def _check_manifest(self) -> None:
        raw = self.backend.get_many([MANIFEST_KEY])[0]
        want = self._manifest()
        if raw is None:
            if self._holds_data():
                raise CorruptData(
                    f"the manifest (key {MANIFEST_KEY!r}) is missing but the backend holds "
                    "sarp data: its format is unknown, so it is not opened (restore the "
                    "manifest, or start on an empty data directory)")
            wb = WriteBatch()
            wb.put(MANIFEST_KEY, json.dumps(want, sort_keys=True).encode())
            self.backend.write(wb, True)
            return
        try:
            have = json.loads(raw)
        except ValueError as exc:
            raise CorruptData(f"manifest is not JSON: {raw[:64]!r}") from exc
        fmt = have.get("format") if isinstance(have, dict) else None
        if not isinstance(fmt, int):
            raise CorruptData(f"manifest has no integer format version: {raw[:64]!r}")
        if fmt != FORMAT_VERSION:
            side = "newer" if fmt > FORMAT_VERSION else "older"
            raise FormatVersionError(
                f"data format {fmt} was written by a {side} sarpd; this build reads format "
                f"{FORMAT_VERSION} only (no migration from {fmt}): refusing to open it, the "
                "data is left untouched")
        for k in ("hash", "block_tokens", "segment_blocks", "segment_format"):
            if have.get(k) != want[k]:
                raise FormatVersionError(f"data was written with {k}={have.get(k)!r}; "
                                         f"this configuration has {want[k]!r}")
        # data written before the setting existed has every block's locator
        if have.get("block_locators", True) != self.cfg.block_locators:
            raise FormatVersionError(
                f"data was written with block_locators={have.get('block_locators', True)}; "
                f"this configuration has {self.cfg.block_locators} (blocks indexed without "
                "locators cannot be found by bare id: rebuild the index to change it)")

    def _holds_data(self) -> bool:
        if self.backend.get_many([COUNTERS_KEY])[0] is not None:
            return True
        scan = iter(self.backend.scan(SEG_PREFIX, b"T"))
        try:
            return next(scan, None) is not None
        finally:
            close = getattr(scan, "close", None)
            if close is not None:
                close()

    def decode_or_none(self, sid: int, value: bytes | None) -> Segment | None:
        if value is None:
            return None
        try:
            return decode_segment(value, sid)
        except (CorruptData, FormatVersionError) as exc:
            self.corrupt_segments += 1
            log.error("segment %d not served: %s", sid, exc)
            return None

    def reload(self, resume: bool = True) -> None:
        """Memory := disk, after a failed commit: the directory may hold routing points
        of segments never written, and the disk (an engine that applied the batch and
        then failed its fsync, or replays it at a reopen) may hold more than memory.
        Counters, the decoded-segment cache and the directory are re-read; first, with
        `resume`, a backend whose write failed is made writable again (`resume()`)."""
        if self._resume and resume:
            resume_fn = getattr(self.backend, "resume", None)
            if resume_fn is not None:
                resume_fn()
            self._resume = False
        self._stale = True
        self._seg_cache.clear()
        self._ns_blocks.clear()
        self.counters = Counters.decode(self.backend.get_many([COUNTERS_KEY])[0])
        self.recover()
        self._stale = False

    # -- recovery ------------------------------------------------------------------
    def recover(self, progress: ProgressFn | None = None) -> RecoveryReport:
        """Load the newest valid snapshot and re-route the segments changed after it;
        without one, re-route every segment (full scan)."""
        t0 = time.perf_counter()
        warning: str | None = None
        snap_seg, full = 0, False
        meta, arrays = None, None
        if self.snapshot_dir is not None:
            loaded = load_newest(self.snapshot_dir, self.cfg.block_tokens, self.cfg.segment_blocks)
            if loaded[0] is not None:
                meta, arrays = loaded
            else:
                warning = loaded[1]
        txn = WriteTxn(self)
        n = 0
        if meta is not None and arrays is not None:
            self.dir.load_arrays(arrays)
            snap_seg = meta.newest_seg
            sids = [int.from_bytes(v, "big") for _, v in
                    self.backend.scan(log_key(meta.watermark + 1), LOG_PREFIX + b"\xff" * 8)]
            for sid in dict.fromkeys(sids):
                seg = txn.seg(sid)
                if seg is not None:
                    self.register(seg, txn)
                n += 1
                if n % 4096 == 0:
                    progress and progress(n, len(sids))
                    txn.cache.clear()
        else:
            if warning:
                log.warning("no usable snapshot (%s): full scan", warning)
            full = True
            self.dir.clear()
            total = self.counters.segments
            for key, value in self.backend.scan(SEG_PREFIX, b"T"):
                sid = seg_id_of_key(key)
                seg = self.decode_or_none(sid, value)
                if seg is not None:
                    txn.cache[sid] = seg
                    self.register(seg, txn)
                n += 1
                if n % 4096 == 0:
                    progress and progress(n, total)
                    txn.cache.clear()
        self.dir.merge()
        self.watermark = self.counters.next_version - 1
        self.recovered_in_s = time.perf_counter() - t0
        return RecoveryReport(self.recovered_in_s, snap_seg, n, full, warning)

    # -- routing -------------------------------------------------------------------
    def _ids(self, m: Match) -> IdArray:
        seq = m.seq
        if seq.tokens is not None:
            if len(seq.tokens) > self.cfg.max_sequence_tokens:
                raise TooLarge(f"tokens: {len(seq.tokens)} exceeds max_sequence_tokens "
                               f"({self.cfg.max_sequence_tokens})")
            return chain_ids(ns_root(seq.ns), seq.tokens, self.cfg.block_tokens)
        assert seq.hashes is not None
        return salt_ids(seq.ns, seq.hashes)

    def _deepest(self, qs: Sequence[IdArray]) -> list[list[int]]:
        """Per query, per window from 0: the deepest routing offset present, until the
        first window with none (later windows cannot extend a gap-free match).
        One vectorised directory probe for every lattice position of the batch."""
        gap, sb = self.geo.gap, self.geo.sb
        out: list[list[int]] = [[] for _ in qs]
        pos = [np.arange(0, len(q), gap) for q in qs]
        if not any(len(p) for p in pos):
            return out
        keys = np.concatenate([q[p, 0] for q, p in zip(qs, pos, strict=True)])
        owner = np.repeat(np.arange(len(qs)), [len(p) for p in pos])
        allpos = np.concatenate(pos)
        hit = np.asarray(self.dir.probe(keys.astype(np.uint64)), dtype=bool)
        hq, hp = owner[hit], allpos[hit]
        if not hq.size:
            return out
        group = hq * (1 << 40) + hp // sb
        last = np.flatnonzero(np.diff(group, append=-1) != 0)  # deepest hit per (query, window)
        for qi, p in zip(hq[last].tolist(), hp[last].tolist(), strict=True):
            w, o = divmod(p, sb)
            if w == len(out[qi]):  # windows must be contiguous from 0
                out[qi].append(o)
        return out

    def candidates(self, qw: IdArray, w: int, offset: int) -> list[int]:
        segs, filts = self.dir.posting(int(qw[offset, 0]))
        if segs.size <= self.cfg.window_cap:  # all of them are read: no ranking needed
            return segs.tolist()  # type: ignore[no-any-return]
        # a ranking depends only on the posting list and the 16 blocks after the point:
        # kept while the directory is unchanged (a turn's insert re-routes, before it
        # changes anything, what its match ranked); bounded for read-only stretches
        if self._ranked_at != self.dir.version or len(self._ranked) >= RANKED_MAX:
            self._ranked.clear()
            self._ranked_at = self.dir.version
        ck = qw[offset : offset + 17].tobytes()
        hit = self._ranked.get(ck)
        if hit is None:
            qf = filter_at(fingerprints(qw, self.geo.sb), offset)
            hit = self._ranked[ck] = top_candidates(segs, filts, qf, self.cfg.window_cap)
        return hit

    def route_window(self, qw: IdArray, w: int) -> list[int]:
        """Candidate segments for one window of a query (`qw`: its ids from the window start)."""
        offs = [o for o in self.geo.offsets if o < len(qw)]
        hits = self.dir.probe(qw[offs, 0].astype(np.uint64))
        for o, hit in zip(reversed(offs), reversed(hits), strict=True):
            if hit:
                return self.candidates(qw, w, o)
        return []

    # -- match ---------------------------------------------------------------------
    def match_many(self, reqs: Sequence[Match]) -> list[MatchResult | SarpError]:
        if self._stale:  # the reload after a failed commit failed too: retry it
            self._reload_or_raise(resume=False)
        sb = self.geo.sb
        qs: list[IdArray] = []
        errors: dict[int, SarpError] = {}
        for i, r in enumerate(reqs):
            try:
                qs.append(self._ids(r))
            except SarpError as exc:
                errors[i] = exc
                qs.append(np.empty((0, 2), np.uint64))
        plan: list[list[list[int]]] = []
        wanted: dict[int, None] = {}
        for q, deepest in zip(qs, self._deepest(qs), strict=True):
            per_window = [self.candidates(q[w * sb : (w + 1) * sb], w, d)
                          for w, d in enumerate(deepest)]
            for c in per_window:
                wanted.update(dict.fromkeys(c))
            plan.append(per_window)
        segs = self._read(list(wanted))
        runs = self._runs(qs, plan, segs)
        out: list[MatchResult | SarpError] = []
        for i, (r, q, per_window) in enumerate(zip(reqs, qs, plan, strict=True)):
            if i in errors:
                out.append(errors[i])
                continue
            out.append(self._result(i, r, q, per_window, segs, runs))
        return out

    def _runs(self, qs: Sequence[IdArray], plan: list[list[list[int]]],
              segs: dict[int, Segment]) -> dict[tuple[int, int, int], int]:
        """Verified run (ids equal AND present, from the window start) of every
        (query, window, candidate) of the batch: one vectorised verification."""
        sb = self.geo.sb
        keys: list[tuple[int, int, int]] = []
        cands: list[IdArray] = []
        queries: list[IdArray] = []
        for qi, per_window in enumerate(plan):
            q = qs[qi]
            for w, sids in enumerate(per_window):
                for sid in sids:
                    c = segs.get(sid)
                    if c is not None and c.window == w:
                        keys.append((qi, w, sid))
                        cands.append(c.ids)
                        queries.append(q[w * sb : (w + 1) * sb])
        mism = verify.first_mismatch_many(cands, queries)
        return {k: min(m, segs[k[2]].present_run(0))
                for k, m in zip(keys, mism, strict=True)}

    def _result(self, qi: int, r: Match, q: IdArray, per_window: list[list[int]],
                segs: dict[int, Segment], runs: dict[tuple[int, int, int], int]) -> MatchResult:
        sb = self.geo.sb
        metas = []
        total = 0
        for w, sids in enumerate(per_window):
            best, best_sid = 0, 0
            for sid in sids:
                run = runs.get((qi, w, sid), 0)
                if run > best:
                    best, best_sid = run, sid
            if best_sid:
                metas.append(segs[best_sid].meta[:best])
            total += best
            if best < min(sb, len(q) - w * sb):
                break
        self.matches += 1
        self.matched_blocks += total
        self.queried_blocks += len(q)
        meta = np.concatenate(metas) if metas else np.empty(0, np.uint64)
        ids = salt_ids(r.seq.ns, q[:total]) if r.with_ids else None
        return MatchResult(total, meta.astype(np.uint64), ids)

    def _read(self, sids: list[int]) -> dict[int, Segment]:
        return {sid: seg for sid, seg in self.fetch(sids).items() if seg is not None}

    def fetch(self, sids: list[int]) -> dict[int, Segment | None]:
        """Decoded segments (None: missing or corrupt): recently used ones from memory,
        the rest in ONE backend multi-get. The cache holds committed segments only
        (a write batch's working copies enter it when the batch is durable), so a
        turn's insert finds the segments its match just read."""
        out: dict[int, Segment | None] = {}
        missing = []
        cache = self._seg_cache
        for sid in sids:
            seg = cache.get(sid)
            if seg is None:
                missing.append(sid)
            else:
                cache.move_to_end(sid)
                out[sid] = seg
        if missing:
            try:
                values = self.backend.get_many([seg_key(s) for s in missing])
            except CorruptData:  # an engine page failed its checksum: find its segments
                values = [self._get_or_none(s) for s in missing]
            self.segment_reads += len(missing)
            for sid, value in zip(missing, values, strict=True):
                seg = out[sid] = self.decode_or_none(sid, value)
                if seg is not None:
                    self.remember(sid, seg)
        return out

    def _get_or_none(self, sid: int) -> bytes | None:
        """One segment's value; None (logged, counted) where the engine reports it corrupt."""
        try:
            return self.backend.get_many([seg_key(sid)])[0]
        except CorruptData as exc:
            self.corrupt_segments += 1
            log.error("segment %d not served: %s", sid, exc)
            return None

    def ns_blocks(self, tag: int) -> int:
        """Blocks indexed in the namespace with this tag, as committed (kept per
        namespace on the backend, read once; quotas count them)."""
        n = self._ns_blocks.get(tag)
        if n is None:
            raw = self.backend.get_many([ns_count_key(tag)])[0]
            n = self._ns_blocks[tag] = int.from_bytes(raw, "little") if raw else 0
        return n

    def remember(self, sid: int, seg: Segment) -> None:
        cache = self._seg_cache
        cache[sid] = seg
        cache.move_to_end(sid)
        if len(cache) > SEGMENT_CACHE:
            cache.popitem(last=False)

    # -- directory maintenance -------------------------------------------------------
    def register(self, seg: Segment, txn: WriteTxn, old_n: int | None = None,
                 fresh_from: int | None = None) -> None:
        """Enter (or refresh) the routing points of a new or grown segment.

        `old_n`: the segment's length when it was last registered (0: new; None:
        unknown, as in recovery: every point is looked up). `fresh_from`: blocks from
        this offset on are new content that no other segment holds, so a key there
        that is not in the directory yet has no siblings to list."""
        geo, d, sid = self.geo, self.dir, seg.seg_id
        if old_n == 0 and fresh_from == 0 and self.cfg.prune_max_pred >= 1:
            # all new content: only the head is listed (every later base point has a
            # predecessor listed once at most: pruned; refinement needs a long list)
            d.add(int(seg.ids[0, 0]), sid, filter_at(fingerprints(seg.ids[:17], 0), 0))
            return
        n = seg.nblocks
        offs = [o for o in geo.offsets if o < n]
        if old_n is not None:  # points whose filter cannot have changed are left alone
            offs = [o for o in offs if o + 16 >= old_n]
        if not offs:
            return
        fresh = n if fresh_from is None else fresh_from
        fp = fingerprints(seg.ids, geo.sb)
        filts = filters_at(fp, np.array(offs, dtype=np.int64)).tolist()
        keys = seg.ids[offs, 0].tolist()
        refine: list[tuple[int, int, int]] = []
        t = self.cfg.refine_threshold + 1
        for o, key, f in zip(offs, keys, filts, strict=True):
            if (old_n is None or o < old_n) and d.set_filter(key, sid, f):
                continue
            if o >= fresh and o and not geo.is_base(o):
                continue  # new content: no refinement point can exist for it yet
            count = 0 if o >= fresh else d.count(key)
            if o and count == 0:
                if not geo.is_base(o):
                    continue  # refinement points exist only where a posting list grew
                if o - geo.spacing >= fresh and self.cfg.prune_max_pred >= 1:
                    continue  # pruned: the predecessor is new content, listed once at most
                pred_key = int(seg.ids[o - geo.spacing, 0])
                if d.count(pred_key) <= self.cfg.prune_max_pred:
                    continue  # pruned: the predecessor's few candidates are read instead
                d.add(key, sid, f)
                if o < fresh:
                    pred_filt = filter_at(fp, o - geo.spacing)
                    self._list_siblings(pred_key, pred_filt, o, seg, txn)
                count = d.count(key)
            else:
                d.add(key, sid, f)
                count += 1
            if count >= t and count % t == 0 and (count // t) & (count // t - 1) == 0:
                refine.append((o, key, (count // t).bit_length()))
        for o, key, level in refine:
            steps = geo.refinements(o)
            if level <= len(steps) and self._splits(key, steps[level - 1] - o):
                self._add_point(key, steps[level - 1], txn)

    def _list_siblings(self, pred_key: int, pred_filt: int, o: int, seg: Segment,
                       txn: WriteTxn) -> None:
        """A key enters the directory at offset o for the first time: list every other
        segment under the predecessor that holds the same block there (only candidates
        whose fingerprints agree all the way to o are read)."""
        segs, filts = self.dir.posting(pred_key)
        need = self.geo.spacing  # blocks pred+1 .. o must all agree
        keep = segs != np.uint64(seg.seg_id)
        if need <= 16:
            keep &= agreement(filts, pred_filt) >= need
        same = segs[keep]
        if not same.size:
            return
        sids = [int(s) for s in same]
        txn.load(sids)
        want = seg.ids[o]
        for sid in sids:
            c = txn.cache.get(sid)
            if (c is not None and c.window == seg.window and o < c.nblocks
                    and bool((c.ids[o] == want).all())):
                self.dir.add(int(want[0]), sid, filter_at(fingerprints(c.ids, self.geo.sb), o))

    def _add_point(self, from_key: int, offset: int, txn: WriteTxn) -> None:
        """Refinement: list every segment under `from_key` at its own key at `offset`."""
        sids = [int(s) for s in self.dir.posting(from_key)[0]]
        txn.load(sids)
        for sid in sids:
            c = txn.cache.get(sid)
            if c is None or offset >= c.nblocks:
                continue
            key = int(c.ids[offset, 0])
            if not self.dir.has(key, sid):
                self.dir.add(key, sid, filter_at(fingerprints(c.ids, self.geo.sb), offset))

    def _splits(self, key: int, step: int) -> bool:
        """Would a point `step` blocks deeper split this posting list? Not when every
        candidate's fingerprints agree that far (they all share that block)."""
        if step > 16:
            return True
        filts = self.dir.posting(key)[1]
        return bool(filts.size) and bool((agreement(filts, int(filts[0])) < step).any())

    def _reload_or_raise(self, resume: bool) -> None:
        try:
            self.reload(resume)
        except Exception as exc:
            raise StorageError(f"the index could not reload from disk after a failed "
                               f"write: {exc}") from exc

    def write_many(self, ops: Sequence[WriteOp]) -> list[InsertResult | RemoveResult | SarpError]:
        if self._stale or self._resume:
            self._reload_or_raise(resume=True)
        txn = WriteTxn(self)
        out: list[InsertResult | RemoveResult | SarpError] = []
        try:
            txn.prefetch(ops)  # may reuse rankings of the batch's matches
            for op in ops:
                try:
                    out.append(txn.apply(op))
                except StorageError:
                    raise
                except SarpError as exc:
                    out.append(exc)
            self.counters = txn.commit(self.sync)
            self._ns_blocks.update(txn.ns_after)
        except Exception as exc:
            log.error("write batch failed (%s); reloading the index from disk", exc)
            self._stale, self._resume = True, hasattr(self.backend, "resume")
            try:
                self._reload_or_raise(resume=False)
            except StorageError as again:
                log.error("%s; retried before the next request", again.message)
            raise
        for sid in txn.dirty:
            seg = txn.cache[sid]
            if seg is not None:
                self.remember(sid, seg)
        self.writes += 1
        if self.dir.needs_merge():
            self.dir.merge()
        return out

    # -- snapshots -----------------------------------------------------------------
    def snapshot(self) -> SnapshotResult:
        if self.snapshot_dir is None:
            raise SarpError("snapshot: this index has no snapshot directory")
        if self._stale:
            self._reload_or_raise(resume=False)
        t0 = time.perf_counter()
        watermark = self.counters.next_version - 1
        meta = SnapshotMeta(watermark, self.counters.next_seg - 1,
                            self.cfg.block_tokens, self.cfg.segment_blocks)
        write_snapshot(self.snapshot_dir, self.dir.to_arrays(), meta, keep=2)
        self._gc_log()
        return SnapshotResult(meta.newest_seg, time.perf_counter() - t0)

    def _gc_log(self) -> None:
        """Drop change-log records that every kept snapshot already folds in."""
        assert self.snapshot_dir is not None
        snaps = list_snapshots(self.snapshot_dir)
        try:
            oldest = read_snapshot(snaps[-1])[0].watermark if snaps else 0
        except (OSError, CorruptData, FormatVersionError):
            return
        wb = WriteBatch()
        for key, _ in self.backend.scan(LOG_PREFIX, log_key(oldest + 1)):
            wb.delete(key)
        if len(wb):
            self.backend.write(wb, False)

    # -- check ---------------------------------------------------------------------
    def check(self, fix: bool = False) -> CheckReport:
        from sarpd.core.fsck import run_check

        return run_check(self, fix)

    def stats(self) -> dict[str, int | float | str]:
        blocks = self.counters.blocks
        dbytes = self.dir.nbytes
        out: dict[str, int | float | str] = {
            "blocks": blocks,
            "segments": self.counters.segments,
            "routing_points": self.dir.entries,
            "routing_keys": self.dir.keys_count,
            "directory_bytes": dbytes,
            "directory_bytes_per_block": round(dbytes / blocks, 4) if blocks else 0.0,
            "directory_merges": self.dir.merges,
            "directory_merge_s_max": round(self.dir.merge_s_max, 6),
            "directory_merge_s_total": round(self.dir.merge_s_total, 6),
            "hash": HASH_NAME,
            "verifier": verify.IMPLEMENTATION,
            "index_matches": self.matches,
            "matched_blocks": self.matched_blocks,
            "queried_blocks": self.queried_blocks,
            "segment_reads": self.segment_reads,
            "corrupt_segments": self.corrupt_segments,
            "write_batches": self.writes,
            "change_log_version": self.counters.next_version - 1,
        }
        for k, v in self.backend.stats().items():
            out[f"backend_{k}"] = v
        if self.recovered_in_s is not None:
            out["recovered_in_s"] = round(self.recovered_in_s, 6)
        return out

    def close(self) -> None:
        self._seg_cache.clear()
        self.backend.close()
