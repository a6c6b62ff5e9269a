"""SarpIndex: match / insert / remove / clear over a Backend.

Synchronous and pure: no I/O but the backend interface and the snapshot directory.
`match_many` may run on several threads at once while nothing else runs (no write,
snapshot, check or reload: the daemon's `worker_threads` split a read phase's
matches); everything else runs on one thread at a time.

The index is a `Store` (sarpd/core/store.py: the backend, the segment cache, the
counters, the sequence -> ids rule) and a `Router` (sarpd/core/router.py: the
routing directory, candidates, `register`). Writes run in a `WriteTxn`
(sarpd/core/writer.py), `check` in sarpd/core/fsck.py.

Match (docs/DECISIONS.md): for each query, ids -> for every 64-block window the
deepest routing point present in the directory (all lattice offsets of the batch
probed in one vectorised lookup) -> the `window_cap` strongest candidates by
fingerprint agreement -> ONE backend multi-get for every candidate of the batch ->
verify full ids and presence -> with exact matching, further rounds where an unread
candidate's bound beats the best run (sarpd/core/plan.py) -> the longest gap-free
run from position 0. With the match kernel built (native path "match",
sarpd/core/kernel.py) the batch is routed in one native call, its first rounds
verified in one after the multi-get and its answers assembled in one; plans and
further rounds are made only for the queries that need them. The reference
(`plan_many`, `_verify_round`, `_result`) gives the same answers.

After a failed commit memory may differ from the disk: the index reloads (counters,
segment cache, directory) before it answers again, and makes the backend writable
again (`Backend.resume`) before the next write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.base import Backend, WriteBatch
from sarpd.config import IndexConfig
from sarpd.core import kernel, native, verify
from sarpd.core.blockmap import MapArrays
from sarpd.core.directory import DirectoryArrays
from sarpd.core.fsck import run_check
from sarpd.core.holders import match_holders, spans, tables
from sarpd.core.ids import HASH_NAME, Joined, salt_ids
from sarpd.core.native import DirectoryLike, Kernels, MatchKernel
from sarpd.core.plan import WindowPlan
from sarpd.core.router import Router
from sarpd.core.segment import LOG_PREFIX, SEG_PREFIX, Counters, Segment, log_key, seg_id_of_key
from sarpd.core.snapshot import (
    Loaded,
    PendingSnapshot,
    SnapshotMeta,
    list_snapshots,
    load_newest,
    read_meta,
    write_snapshot,
)
from sarpd.core.store import Activity, Held, Store, data_paths
from sarpd.core.writer import WriteTxn
from sarpd.errors import ConfigError, CorruptData, FormatVersionError, SarpError, StorageError
from sarpd.model import (
    CheckpointResult,
    CheckReport,
    Clear,
    IdArray,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Remove,
    RemoveResult,
    SeqSpec,
    SnapshotResult,
)

log = logging.getLogger(__name__)

WriteOp = Insert | Remove | Clear
Run = tuple[int, int, int]  # a window's best candidate (0: none), its run, the window's blocks
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    seconds: float
    snapshot_segment_id: int  # newest segment in the snapshot used; 0 when none
    segments_rerouted: int
    full_scan: bool
    warning: str | None = None


class SarpIndex:
    """The index: a `Store` (the backend and what is read from it) and a `Router`
    (the routing directory), with match, write, recovery, snapshots, check and stats."""

    def __init__(self, backend: Backend, config: IndexConfig,
                 snapshot_dir: Path | None = None, sync: bool = True,
                 kernels: Kernels | None = None) -> None:
        self.cfg = config
        self.snapshot_dir = snapshot_dir
        self.sync = sync
        # which implementation runs each hot path, picked once (None: the process
        # default, sarpd.core.native); the store and the router call through it
        self.k = kernels or native.pick()
        self.store = Store(backend, config, self.k)
        self.router = Router(config, self.k)
        self.watermark = 0
        self.recovered_in_s: float | None = None
        # when the newest directory snapshot was written (its file's mtime, epoch s)
        self.snapshot_time: float | None = None
        self.snapshot_watermark: int | None = None  # the change-log version it holds
        # segments created or changed since the newest snapshot: what a restart would
        # re-route (the daemon snapshots past `snapshot_changed_segments`)
        self.changed_segments = 0
        self._stale = False  # memory may differ from the disk: a commit failed
        self._resume = False  # the backend must be made writable before the next write

    # -- what others read ------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self.store.backend

    @property
    def counters(self) -> Counters:
        return self.store.counters

    @property
    def applied_seq(self) -> int:
        """The last log sequence applied (`write_many(..., applied_seq)`; 0: none)."""
        return self.store.applied_seq

    @property
    def activity(self) -> Activity:
        return self.store.activity

    @property
    def dir(self) -> DirectoryLike:
        return self.router.dir

    def reload(self, resume: bool = True) -> None:
        """Memory := disk, after a failed commit: the directory may hold routing points
        of segments never written, and the disk (an engine that applied the batch and
        then failed its fsync, or replays it at a reopen) may hold more than memory.
        Counters, the decoded-segment cache and the directory are re-read; first, with
        `resume`, a backend whose write failed is made writable again (`resume()`)."""
        if self._resume and resume:
            self.store.resume()
            self._resume = False
        self._stale = True
        self.store.reset()
        self.recover()
        self._stale = False

    # -- recovery ------------------------------------------------------------------
    def recover(self, progress: ProgressFn | None = None) -> RecoveryReport:
        """Load the newest valid snapshot and re-route the segments changed after it;
        without one, re-route every segment (full scan)."""
        t0 = time.perf_counter()
        self.store.copies.clear()  # the directory is rebuilt: posting order may change
        warning: str | None = None
        meta = None
        held = Held(self.store)
        if self.snapshot_dir is not None:
            loaded = load_newest(self.snapshot_dir, self.cfg.block_tokens, self.cfg.segment_blocks)
            if isinstance(loaded, Loaded):
                meta = loaded.meta
                self.dir.load_arrays(loaded.arrays)
                held.load(loaded.blockmap)
                self.snapshot_time = _mtime(loaded.path)
            else:
                warning = loaded
        self.snapshot_watermark = meta.watermark if meta is not None else None
        if meta is not None:
            n = self._reroute_logged(meta.watermark, held, progress)
        else:
            if warning:
                log.warning("no usable snapshot (%s): full scan", warning)
            n = self._reroute_all(held, progress)
        held.flush()
        self.changed_segments = n
        self.dir.merge()
        self.watermark = self.counters.next_version - 1
        self.recovered_in_s = time.perf_counter() - t0
        return RecoveryReport(self.recovered_in_s, meta.newest_seg if meta else 0, n,
                              meta is None, warning)

    def _reroute_logged(self, watermark: int, held: Held, progress: ProgressFn | None) -> int:
        """Re-route every segment the change log lists after `watermark`; the block map
        holds their present blocks again."""
        cache: dict[int, Segment | None] = {}
        load = self.store.loader(cache)
        sids = [int.from_bytes(v[i : i + 8], "big") for _, v in
                self.store.scan(log_key(watermark + 1), LOG_PREFIX + b"\xff" * 8)
                for i in range(0, len(v), 8)]
        n = 0
        for sid in dict.fromkeys(sids):
            seg = load([sid]).get(sid)
            if seg is not None:
                self.router.register(seg, load)
                held.segment(seg)
            n += 1
            if n % 4096 == 0:
                progress and progress(n, len(sids))
                cache.clear()
        return n

    def _reroute_all(self, held: Held, progress: ProgressFn | None) -> int:
        """Rebuild the directory and the block map from every segment on the backend
        (no snapshot)."""
        self.dir.clear()
        cache: dict[int, Segment | None] = {}
        load = self.store.loader(cache)
        total = self.counters.segments
        n = 0
        pending = self.store.pending
        for key, value in self.store.scan(SEG_PREFIX, b"T"):
            sid = seg_id_of_key(key)
            seg = pending[sid] if sid in pending else self.store.decode_or_none(sid, value)
            if seg is not None:
                cache[sid] = seg
                self.router.register(seg, load)
                held.segment(seg)
            n += 1
            if n % 4096 == 0:
                progress and progress(n, total)
                cache.clear()
        return n

    def seq_ids(self, seq: SeqSpec, limit: int | None = None) -> IdArray:
        """A sequence's internal ids (THE rule: `Store.seq_ids`), its first `limit`
        blocks only when given."""
        if limit is not None:
            if seq.tokens is not None:
                seq = SeqSpec(seq.ns, tokens=seq.tokens[: limit * self.cfg.block_tokens])
            elif seq.hashes is not None:
                seq = SeqSpec(seq.ns, hashes=seq.hashes[:limit])
        return self.store.seq_ids(seq)

    # -- match ---------------------------------------------------------------------
    def match_many(self, reqs: Sequence[Match]) -> list[MatchResult | SarpError]:
        if self._stale:  # the reload after a failed commit failed too: retry it
            self._reload_or_raise(resume=False)
        errors: dict[int, SarpError] = {}
        got = self.store.seq_ids_many([r.seq for r in reqs])
        k = self.k.match
        if k is not None and isinstance(got, Joined):  # salted into one array: the kernel's
            return self._match_native(reqs, got, errors, k, got)
        qs: list[IdArray] = []
        for i, q in enumerate(got):
            if isinstance(q, SarpError):
                errors[i] = q
                q = np.empty((0, 2), np.uint64)
            qs.append(q)
        if k is not None:
            return self._match_native(reqs, qs, errors, k)
        plans = self.router.plan_many(qs)
        first = [(qi, p, p.first) for qi, windows in enumerate(plans) for p in windows]
        segs = self._verify_round(qs, first, {})
        if self.cfg.exact_match:
            self._exact_rounds(qs, plans, segs)
        return [errors[i] if i in errors else
                self._result(r, q, [(p.best_sid, p.best, p.length) for p in windows], segs)
                for i, (r, q, windows) in enumerate(zip(reqs, qs, plans, strict=True))]

    def _match_native(self, reqs: Sequence[Match], qs: Sequence[IdArray],
                      errors: dict[int, SarpError], k: MatchKernel,
                      joined: Joined | None = None) -> list[MatchResult | SarpError]:
        """`match_many` with the match kernel (module `kernel`): ONE call routes the
        batch, reads every first round (what the store's segment cache holds taken from it
        in C, the rest in one multi-get), verifies it, runs the
        bound-and-verify rounds (`_exact_rounds`' twin: their reads and locator checks
        call back into the store) and assembles every answer, holders and spans included.
        `joined`: the queries' ids already one array (qs itself)."""
        geo = self.router.geo
        spanned = (np.fromiter((r.spans for r in reqs), np.int64, len(reqs))
                   if any(r.spans for r in reqs) else None)
        if joined is not None:
            lens, qids = joined.lens, joined.flat
            ks = np.fromiter((r.holders for r in reqs), np.int64, len(reqs))
        elif len(qs) == 1:  # a lone query (the fleet's): no generator, no concatenation
            lens, ks = np.array([len(qs[0])], np.int64), np.array([reqs[0].holders], np.int64)
            qids = np.ascontiguousarray(qs[0], np.uint64)
        else:
            lens = np.fromiter((len(q) for q in qs), np.int64, len(qs))
            ks = np.fromiter((r.holders for r in reqs), np.int64, len(reqs))
            qids = np.ascontiguousarray(np.concatenate(qs), np.uint64)
        cache = self.store.segment_cache  # read in C when it is the kernel's own type
        own = isinstance(cache, k.SegmentCache)  # ... whose misses go in as stored values
        res, meta, tops, hspans, rounds = kernel.match(
            k, qids, lens, self.router.dir.flat(), geo.sb, geo.gap, self.cfg.window_cap,
            self.store.read_views if own else self.store.fetch,
            self._indexed if self.cfg.block_locators else None, ks,
            self.cfg.exact_match, cache if own else None, spanned)
        out: list[MatchResult | SarpError] = []
        matched = 0
        for i, (r, (total, start, tstart, ntop, sstart, nspans)) in enumerate(
                zip(reqs, res.tolist(), strict=True)):
            if i in errors:
                out.append(errors[i])
                continue
            matched += total
            top = ([(h, run) for h, run in tops[tstart : tstart + ntop].tolist()]
                   if r.holders else None)
            ids = salt_ids(r.seq.ns, qs[i][:total], self.k) if r.with_ids else None
            held = ([(h, a, n) for h, a, n in hspans[sstart : sstart + nspans].tolist()]
                    if r.spans else None)
            out.append(MatchResult(total, meta[start : start + total], ids, top, held))
        self._count(len(reqs) - len(errors), matched, len(qids), rounds)
        return out

    def _indexed(self, raw: bytes) -> list[bool]:
        """`Store.indexed` of 16-byte ids (the match kernel's callback)."""
        return self.store.indexed(np.frombuffer(raw, np.uint64).reshape(-1, 2))

    def _exact_rounds(self, qs: Sequence[IdArray], plans: list[list[WindowPlan]],
                      segs: dict[int, Segment]) -> None:
        """Bound-and-verify: while a query's first window short of its end may still be
        beaten by an unread candidate, read another round (ONE multi-get for every such
        window of the batch); later windows of that query wait, since they only count if
        it is full. With block locators, a window whose next block is indexed nowhere
        is settled first by one point read (one multi-get for the batch)."""
        sb = self.router.geo.sb
        while True:
            open_: list[tuple[int, WindowPlan]] = []
            for qi, windows in enumerate(plans):
                for p in windows:
                    if p.best >= p.length:
                        continue  # full: the next window counts
                    if p.open(p.best):
                        open_.append((qi, p))
                    break
            if self.cfg.block_locators:
                ask = [(qi, p) for qi, p in open_ if p.checked_at != p.best]
                if ask:
                    nxt = np.stack([qs[qi][p.window * sb + p.best] for qi, p in ask])
                    for (_, p), held in zip(ask, self.store.indexed(nxt), strict=True):
                        p.checked_at = p.best
                        if not held:
                            p.settle()
            todo = [(qi, p, more) for qi, p in open_ if (more := p.more(p.best))]
            if not todo:  # `more` settles a plan it has nothing for: no plan is open
                return
            with self.store.lock:  # matches may run on several threads (issue 25)
                self.store.activity.extra_rounds += 1
            self._verify_round(qs, todo, segs)

    def _verify_round(self, qs: Sequence[IdArray], todo: list[tuple[int, WindowPlan, list[int]]],
                      segs: dict[int, Segment]) -> dict[int, Segment]:
        """Read the round's candidates (one multi-get) and offer each plan the verified
        run (ids equal AND present, from the window start) of each of its candidates:
        one vectorised verification. `segs` gathers what was read."""
        wanted = [sid for _, _, sids in todo for sid in sids if sid not in segs]
        segs.update(self.store.read(list(dict.fromkeys(wanted))))
        sb = self.router.geo.sb
        offers: list[tuple[WindowPlan, int]] = []
        cands: list[IdArray] = []
        queries: list[IdArray] = []
        for qi, p, sids in todo:
            qw = qs[qi][p.window * sb : (p.window + 1) * sb]
            for sid in sids:
                c = segs.get(sid)
                if c is not None and c.window == p.window:
                    offers.append((p, sid))
                    cands.append(c.ids)
                    queries.append(qw)
        mism = verify.first_mismatch_many(cands, queries, self.k)
        for (p, sid), m in zip(offers, mism, strict=True):
            p.offer(sid, min(m, segs[sid].present_run(0)))
        return segs

    def _result(self, r: Match, q: IdArray, windows: list[Run],
                segs: dict[int, Segment]) -> MatchResult:
        matched: list[tuple[Segment, int]] = []
        total = 0
        for sid, best, length in windows:
            if sid:
                matched.append((segs[sid], best))
            total += best
            if best < length:
                break
        self._count(1, total, len(q))
        meta, top = match_holders(matched, r.holders)
        ids = salt_ids(r.seq.ns, q[:total], self.k) if r.with_ids else None
        return MatchResult(total, meta, ids, top, spans(tables(matched)) if r.spans else None)

    def _count(self, matches: int, matched: int, queried: int, rounds: int = 0) -> None:
        """Count answered matches, their blocks and the extra rounds they read."""
        act = self.store.activity
        with self.store.lock:  # matches may run on several threads (issue 25)
            act.matches += matches
            act.matched_blocks += matched
            act.queried_blocks += queried
            act.extra_rounds += rounds

    def _reload_or_raise(self, resume: bool) -> None:
        try:
            self.reload(resume)
        except Exception as exc:
            raise StorageError(f"the index could not reload from disk after a failed "
                               f"write: {exc}") from exc

    def write_many(self, ops: Sequence[WriteOp], applied_seq: int | None = None,
                   sync: bool | None = None) -> list[InsertResult | RemoveResult | SarpError]:
        """Apply a batch of writes in ONE backend write batch; each op gets its result
        or its error. `applied_seq` (a replica applying log entries, issue 15): the
        log sequence this batch brings the index to, stored in the same write batch
        (durable with the data, `applied_seq`); it must be past the last one. `sync`:
        this batch's (None: the index's); False leaves it to a later `sync_now`
        (the daemon's group commit)."""
        if self._stale or self._resume:
            self._reload_or_raise(resume=True)
        if applied_seq is not None and applied_seq <= self.store.applied_seq:
            raise ValueError(f"applied_seq {applied_seq} is not after the last applied "
                             f"sequence {self.store.applied_seq}")
        txn = WriteTxn(self.store, self.router)
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
            txn.commit(self.sync if sync is None else sync, applied_seq)
            self.changed_segments += len(set(txn.logged))
        except Exception as exc:
            log.error("write batch failed (%s); reloading the index from disk", exc)
            self._stale, self._resume = True, True
            try:
                self._reload_or_raise(resume=False)
            except StorageError as again:
                log.error("%s; retried before the next request", again.message)
            raise
        self.store.activity.write_batches += 1
        if self.dir.needs_merge():
            self.dir.merge()
        return out

    def sync_now(self) -> None:
        """Make every write so far durable (group commit's one sync for several write
        batches). A failure leaves the index to reload from the disk before its next
        write, as a failed write does."""
        try:
            self.store.sync()
        except StorageError:
            self._stale, self._resume = True, True
            raise

    def fold(self) -> int:
        """Fold every segment's delta records into it (`Store.fold`; with the index's
        sync): what `write_many` deferred, written now. Returns the segments folded."""
        if self._stale or self._resume:
            self._reload_or_raise(resume=True)
        return self.store.fold(self.sync)

    # -- snapshots -----------------------------------------------------------------
    def snapshot(self) -> SnapshotResult:
        pending = self.prepare_snapshot()
        return self.finish_snapshot(pending, pending.write())

    def prepare_snapshot(self) -> PendingSnapshot:
        """A snapshot's first step, with the index to itself: what it will hold is made
        durable and copied. `PendingSnapshot.write` then writes it from any thread
        while the index serves (a daemon's worker is not held for the file: under the
        fleet bench's events that held every request up to 135 ms); `finish_snapshot`
        ends it, again with the index to itself. Changes made meanwhile count for the
        next one."""
        if self.snapshot_dir is None:
            raise SarpError("snapshot: this index has no snapshot directory")
        if self._stale:
            self._reload_or_raise(resume=False)
        t0 = time.perf_counter()
        self.store.sync()  # what the snapshot holds is durable first (group commit)
        d = self.dir.to_arrays()
        arrays = DirectoryArrays(d.keys.copy(), d.segs.copy(), d.filts.copy())
        pending = PendingSnapshot(self.snapshot_dir, arrays, self._map_arrays(),
                                  self._snapshot_meta(), t0)
        self.changed_segments = 0
        return pending

    def finish_snapshot(self, pending: PendingSnapshot, path: Path) -> SnapshotResult:
        """After `pending` was written to `path`: the index knows its newest snapshot,
        and drops the change-log records every kept snapshot folds in."""
        if self.snapshot_watermark is None or pending.meta.watermark >= self.snapshot_watermark:
            self.snapshot_time = _mtime(path)
            self.snapshot_watermark = pending.meta.watermark
        if not self._stale:  # a failed commit since: the next snapshot collects
            self._gc_log()
        return SnapshotResult(pending.meta.newest_seg, time.perf_counter() - pending.started)

    @property
    def snapshot_current(self) -> bool:
        """The newest snapshot holds every change (no write since; or no snapshot and
        no write ever): another one would add nothing."""
        held = self.snapshot_watermark or 0
        return not self._stale and held == self.counters.next_version - 1

    def _map_arrays(self) -> MapArrays | None:
        bm = self.store.blockmap
        return bm.to_arrays() if bm is not None else None

    def _snapshot_meta(self) -> SnapshotMeta:
        return SnapshotMeta(self.counters.next_version - 1, self.counters.next_seg - 1,
                            self.cfg.block_tokens, self.cfg.segment_blocks)

    def checkpoint(self, dest: Path) -> CheckpointResult:
        """What a new replica starts from (issue 15): the new directory `dest` gets a
        sarpd data directory (`data_paths`) holding a directory snapshot and the
        backend's consistent copy (`Backend.copy_to`), both of the index after its last
        write batch, with its `applied_seq`. Opened there and recovered, it answers
        as this index answers now; this index goes on serving."""
        if self._stale:
            self._reload_or_raise(resume=False)
        if dest.exists():
            raise ConfigError(f"checkpoint {dest}: it already exists (a checkpoint goes "
                              "into a new directory)")
        t0 = time.perf_counter()
        backend_dir, snapshot_dir = data_paths(dest, self.backend.name)
        snapshot_dir.mkdir(parents=True)
        meta = self._snapshot_meta()
        write_snapshot(snapshot_dir, self.dir.to_arrays(), meta, keep=1,
                       blockmap=self._map_arrays())
        self.store.copy_to(backend_dir)
        return CheckpointResult(self.applied_seq, meta.newest_seg, time.perf_counter() - t0)

    def _gc_log(self) -> None:
        """Drop change-log records that every kept snapshot already folds in."""
        assert self.snapshot_dir is not None
        snaps = list_snapshots(self.snapshot_dir)
        try:
            oldest = read_meta(snaps[-1]).watermark if snaps else 0
        except (OSError, CorruptData, FormatVersionError):
            return
        wb = WriteBatch()
        for key, _ in self.store.scan(LOG_PREFIX, log_key(oldest + 1)):
            wb.delete(key)
        if len(wb):
            self.store.write(wb, False)

    # -- check and stats -------------------------------------------------------------
    def check(self, fix: bool = False) -> CheckReport:
        return run_check(self.store, self.router, self.snapshot_dir, fix)

    def stats(self) -> dict[str, int | float | str]:
        blocks = self.counters.blocks
        d = self.dir
        act = self.store.activity
        out: dict[str, int | float | str] = {
            "blocks": blocks,
            "holdings": self.counters.holdings,
            "segments": self.counters.segments,
            "routing_points": d.entries,
            "routing_keys": d.keys_count,
            "directory_bytes": d.nbytes,
            "directory_bytes_per_block": round(d.nbytes / blocks, 4) if blocks else 0.0,
            "directory_merges": d.merges,
            "directory_merge_s_max": round(d.merge_s_max, 6),
            "directory_merge_s_total": round(d.merge_s_total, 6),
            "copies_windows": self.store.copies.windows,
            "copies_rows": self.store.copies.rows,
            "copies_bytes": self.store.copies.nbytes,
            "hash": HASH_NAME,
            "verifier": verify.implementation(self.k),
            "kernels": self.k.name,
            "index_matches": act.matches,
            "matched_blocks": act.matched_blocks,
            "queried_blocks": act.queried_blocks,
            "segment_reads": act.segment_reads,
            "corrupt_segments": act.corrupt_segments,
            "write_batches": act.write_batches,
            "extra_rounds": act.extra_rounds,
            "locator_reads": act.locator_reads,
            "exact_match": int(self.cfg.exact_match),
            "change_log_version": self.counters.next_version - 1,
        }
        out["delta_segments"] = len(self.store.pending)  # segments with delta records
        out["delta_records"] = sum(self.store.pending_records.values())
        out["delta_bytes"] = self.store.pending_bytes
        if self.store.blockmap is not None:  # block_map_entries, _bytes, _hits, _spilled ...
            out.update((f"block_map_{k}", v) for k, v in self.store.blockmap.stats().items())
        for k, v in self.store.backend_stats().items():  # the engine's own name: `backend`
            out["backend" if k == "backend" else f"backend_{k}"] = v
        if self.recovered_in_s is not None:
            out["recovered_in_s"] = round(self.recovered_in_s, 6)
        if self.snapshot_time is not None:
            out["snapshot_time"] = self.snapshot_time
        return out

    def close(self) -> None:
        self.store.close()


def _mtime(path: Path) -> float | None:
    """When a snapshot file was written (epoch seconds; None if it is gone)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None
