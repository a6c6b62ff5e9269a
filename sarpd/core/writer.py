"""The write path: one `WriteTxn` per `write_many` call.

A transaction caches every segment it reads (one multi-get for the batch's routing
candidates up front, small ones for what later operations discover), edits working
copies, registers routing points with the router as it goes (so later operations of
the same batch see earlier ones), and commits everything through the store as ONE
backend write batch: dirty segments, new block locators, change-log records,
namespace counts and counters. It reads the backend only through the store.

Removals, parent lookups, refills and holder adds reach every copy of a block: in a
hot window through the store's copies map (sarpd/core/copies.py), else by walking the
segments under the window's head key (`_walk`, the map's reference). A parent lookup
reads those candidates a few at a time, in the walk's order, and stops at the first
that holds the parent present; a removal reads every window's candidates in one load.
The loops of drop (over a removal's windows at once), refill and add_holders over a
window's segments have native twins (the write kernel, sarpd/core/_cwrite.c), used
when it is built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from backends.base import WriteBatch
from sarpd.core.delta import delta_key, encode_delta
from sarpd.core.ids import id_bytes, ns_tag, salt_ids
from sarpd.core.native import BlockMapLike, WriteKernel
from sarpd.core.plan import WindowPlan
from sarpd.core.router import Router
from sarpd.core.segment import (
    COUNTERS_KEY,
    NO_HOLDERS,
    SEG_PREFIX,
    Counters,
    Segment,
    decode_segment,
    link_key,
    log_key,
    ns_count_key,
    seg_id_of_key,
)
from sarpd.core.store import Store, seg_bytes
from sarpd.core.verify import first_mismatch
from sarpd.errors import (
    BadRequest,
    CorruptData,
    FormatVersionError,
    QuotaExceeded,
    TooLarge,
    UnknownParent,
)
from sarpd.model import (
    Clear,
    IdArray,
    Insert,
    InsertResult,
    Remove,
    RemoveResult,
    SeqSpec,
    U64Array,
)

if TYPE_CHECKING:
    from sarpd.core.native import Change

log = logging.getLogger(__name__)

FOLD_RECORDS = 16  # a segment's delta records before it is written whole again
# a parent's candidates read at a time (doubling): copies hold alike, so the first
# segment of its window that holds the parent's block has it present
PRELOAD = 4

I64Array = npt.NDArray[np.int64]
Group = tuple[int, int, I64Array, IdArray]  # a window's targets: (window, head key, offsets, ids)
# an insert's window: (window, its ids from the window start, metas, from, best, run)
Window = tuple[int, IdArray, U64Array, int, Segment | None, int]


@dataclass(frozen=True, slots=True)
class Grouped:
    """A removal's target blocks by window: group g is window keys[g] (window, head key),
    its blocks offs/ids[ends[g - 1]:ends[g]] (offsets in the window, ids), in order."""

    keys: tuple[tuple[int, int], ...]
    offs: I64Array
    ids: IdArray
    ends: I64Array

    def groups(self) -> list[Group]:
        """Each group as (window, head key, offsets, ids), views of the arrays."""
        ends = self.ends.tolist()
        return [(w, h, self.offs[a:b], self.ids[a:b]) for (w, h), a, b
                in zip(self.keys, [0, *ends][: len(ends)], ends, strict=True)]


@dataclass(frozen=True, slots=True)
class Prefetched:
    """A window's route from the batch's prefetch (`WriteTxn.prefetch`); `plan` is None
    when the probe found no routing point there."""

    plan: WindowPlan | None


class WriteTxn:
    def __init__(self, store: Store, router: Router) -> None:
        self.store, self.router = store, router
        self.cfg, self.geo = store.cfg, router.geo
        self.cache: dict[int, Segment | None] = {}  # working copies and what was read
        self.load = store.loader(self.cache)  # the router reads segments through it
        self.dirty: set[int] = set()
        self.before: dict[int, Segment] = {}  # dirty segments as committed (not created here)
        # the txn's new locations in order: (ids, head keys, positions)
        self._added: list[tuple[IdArray, U64Array, npt.NDArray[np.int64]]] = []
        # ... by block id, for `locate` (`_own_map`: a map of the kernels' kind,
        # unbounded, a later location of a block wins), holding the first `_owned`
        self._own: BlockMapLike | None = None
        self._owned = 0
        self._gone: list[IdArray] = []  # blocks left present in no segment
        self.logged: list[int] = []
        self.seq_ids: dict[int, IdArray] = {}  # id(SeqSpec) -> ids, computed once per batch
        # (id(SeqSpec), window) -> its prefetched route, for the batch's inserts
        self.routes: dict[tuple[int, int], Prefetched] = {}
        # (id(Insert after a parent), window) -> the window's ids as prefetched (bytes),
        # its route
        self.parent_routes: dict[tuple[int, int], tuple[bytes, Prefetched]] = {}
        self.parent_ids: dict[int, IdArray] = {}  # id(Insert after a parent) -> its ids
        self.pids: dict[int, IdArray] = {}  # id(Insert after a parent) -> its parent's id
        # find_present's answers, (id bytes, head key, position) -> (segment, the stamp
        # of its window then): valid while the window's stamp has not moved
        self.found: dict[tuple[bytes, int, int], tuple[int, int]] = {}
        # (window, head key) -> changes that can move find_present's answer there (a
        # block's presence changed, a segment grew); `clear` moves every window's
        self.stamps: dict[tuple[int, int], int] = {}
        self.cleared = 0
        self._read: dict[bytes, tuple[int, int]] = {}  # locator records read (pos -1: none)
        self.links: list[bytes] = []  # branch link keys (`[index] branch_links`)
        # a parent's location (find_present), by id bytes: (len(_added) then, location);
        # valid while the txn added no location (the rest of `locate` holds in a txn)
        self._parent_at: dict[bytes, tuple[int, tuple[int, int] | None]] = {}
        # segments created or grown in this txn, by (window, head key): the only
        # candidates a prefetched route can be missing
        self.touched: dict[tuple[int, int], list[int]] = {}
        self.ns_delta: dict[int, int] = {}  # namespace tag -> blocks added - removed
        self.ns_after: dict[int, int] = {}  # ... their committed totals (set by commit)
        c = store.counters
        self.next_seg = c.next_seg
        self.blocks = c.blocks
        self.holdings = c.holdings
        self.segments = c.segments
        self.copies = store.copies  # hot windows' copies, for removals and parents
        self.copies.begin()

    # -- segment cache -------------------------------------------------------------
    def mutable(self, sid: int) -> Segment:
        s = self.cache[sid]
        assert s is not None
        return s if sid in self.dirty else self._dirty(sid, s, s.writable())

    def _dirty(self, sid: int, before: Segment, work: Segment) -> Segment:
        """`work` becomes the working copy of segment `sid`, read as `before`."""
        self.before[sid] = before  # as committed: its change goes out as a delta record
        self.cache[sid] = work
        self.dirty.add(sid)
        return work

    def create(self, window: int, tag: int, ids: IdArray, meta: U64Array, presence: int,
               table: tuple[U64Array, U64Array] | None = None) -> Segment:
        sid = self.next_seg
        self.next_seg += 1
        seg = Segment(sid, window, presence, tag, np.array(ids, dtype=np.uint64),
                      np.array(meta, dtype=np.uint64))
        if table is not None:
            seg.xmeta, seg.xmask = table
        self.cache[sid] = seg
        self.dirty.add(sid)
        self.segments += 1
        self.touch(sid)
        return seg

    def touch(self, sid: int) -> None:
        """Record a change-log entry: the segment was created or extended."""
        self.logged.append(sid)
        seg = self.cache[sid]
        assert seg is not None
        key = (seg.window, int(seg.ids[0, 0]))
        self.touched.setdefault(key, []).append(sid)
        self.stamp(key)
        self.copies.note(seg)

    def stamp(self, key: tuple[int, int]) -> None:
        """Window `key` (window, head key) changed where find_present looks."""
        self.stamps[key] = self.stamps.get(key, 0) + 1

    def add_locators(self, ids: IdArray, head_key: int, first_pos: int) -> None:
        """Blocks ids[0..] are present at positions first_pos.. of the window whose head
        key is `head_key` (`add_located`)."""
        n = len(ids)
        self.add_located(ids, np.full(n, head_key, np.uint64),
                         np.arange(first_pos, first_pos + n, dtype=np.int64))

    def add_located(self, ids: IdArray, heads: U64Array, pos: npt.NDArray[np.int64]) -> None:
        """Blocks `ids` are present at positions `pos` of the windows whose head keys are
        `heads`: the block map holds them once committed (`commit`), and `locate` finds
        them in this txn (`_own_map`)."""
        if len(ids) and self.cfg.block_locators:
            self._added.append((ids, heads, pos))

    def _own_map(self) -> BlockMapLike | None:
        """The map of the txn's new locations (None: none yet), brought up to date in
        one add (the locations added since the last lookup, in order: the same map as
        adding each as it came)."""
        if self._owned < len(self._added):
            if self._own is None:
                self._own = self.store.k.block_map(1 << 62, 65_536)
            ids, heads, pos = zip(*self._added[self._owned :], strict=True)
            self._own.add(np.concatenate(ids), np.concatenate(heads), np.concatenate(pos))
            self._owned = len(self._added)
        return self._own

    def _held(self) -> tuple[IdArray, U64Array, npt.NDArray[np.int64]] | None:
        """The txn's new locations as arrays (ids, head keys, positions), in order."""
        if not self._added:
            return None
        ids, heads, pos = zip(*self._added, strict=True)
        return np.concatenate(ids), np.concatenate(heads), np.concatenate(pos)

    # -- commit --------------------------------------------------------------------
    def commit(self, sync: bool, applied_seq: int | None = None) -> None:
        """Write the batch through the store (with the log sequence it applies, for a
        replica); the store's memory follows once durable."""
        store = self.store
        wb = WriteBatch()
        records = self._write_segments(wb)
        ids, heads, pos = self._held() or (None, None, None)
        store.hold(np.concatenate(self._gone) if self._gone else None, ids, heads, pos, wb)
        version = store.counters.next_version
        if self.logged:  # one change-log record for the batch: every segment it changed
            wb.put(log_key(version), b"".join(sid.to_bytes(8, "big")
                                              for sid in dict.fromkeys(self.logged)))
            version += 1
        for key in self.links:
            wb.put(key, b"")
        for tag, delta in self.ns_delta.items():
            if delta:
                self.ns_after[tag] = max(0, store.ns_blocks(tag) + delta)
                wb.put(ns_count_key(tag), self.ns_after[tag].to_bytes(8, "little"))
        counters = Counters(self.next_seg, version, self.blocks, self.segments, self.holdings)
        if counters != store.counters:
            wb.put(COUNTERS_KEY, counters.encode())
        committed = [self.cache[sid] for sid in self.dirty]
        store.commit(wb, sync, counters, self.ns_after,
                     [seg for seg in committed if seg is not None], applied_seq, records)
        self.copies.end()  # durable: the copies map matches the backend again

    def _write_segments(self, wb: WriteBatch) -> dict[int, int]:
        """Put the dirty segments in `wb`: a segment created here whole, a changed one as
        a delta record (sarpd/core/delta.py), folded (whole again, its records deleted)
        at its FOLD_RECORDS-th record; and fold the oldest other segments with records
        while they hold more than `[index] delta_bytes`. Returns segment -> its records
        now."""
        store, out = self.store, {}
        for sid in self.dirty:
            seg = self.cache[sid]
            assert seg is not None
            k = store.pending_records.get(sid, 0)
            before = self.before.get(sid)
            if before is None or k + 1 >= FOLD_RECORDS:
                store.fold_into(wb, seg)
                out[sid] = 0
            else:
                wb.put(delta_key(sid, k), encode_delta(before, seg, store.k))
                out[sid] = k + 1
        over = store.pending_bytes - self.cfg.delta_bytes
        for sid, seg in list(store.pending.items()) if over > 0 else ():  # oldest first
            if over <= 0:
                break
            if sid in self.dirty or seg is None:
                continue
            store.fold_into(wb, seg)
            out[sid] = 0
            over -= seg_bytes(seg)
        return out

    # -- operations ----------------------------------------------------------------
    def apply(self, op: Insert | Remove | Clear) -> InsertResult | RemoveResult:
        if isinstance(op, Insert):
            return self.insert(op)
        if isinstance(op, Remove):
            return self.remove(op)
        return self.clear(op)

    def prefetch(self, ops: Sequence[Insert | Remove | Clear]) -> None:
        """Route every insert of the batch at once (one vectorised directory probe) and
        read all their candidates in ONE multi-get. Segments that earlier operations of
        the batch create or grow are added to the candidates of their window."""
        sb = self.geo.sb
        seqs, qs = [], []
        plain = [op.seq for op in ops if isinstance(op, Insert) and op.parent is None]
        for seq, q in zip(plain, self.store.seq_ids_many(plain), strict=True):
            if isinstance(q, TooLarge):
                continue  # refused when it is applied, with its error
            self.seq_ids[id(seq)] = q
            seqs.append(seq)
            qs.append(q)
        wanted: dict[int, None] = {}
        for seq, q, plans in zip(seqs, qs, self.router.plan_many(qs), strict=True):
            for w in range(-(-len(q) // sb)):
                # past the first window without a hit nothing can match (chained ids)
                plan = plans[w] if w < len(plans) else None
                self.routes[(id(seq), w)] = Prefetched(plan)
                if plan is not None:
                    wanted.update(dict.fromkeys(plan.first))
        after = [op for op in ops if isinstance(op, Insert) and op.parent is not None]
        if after and self.cfg.block_locators:
            wanted.update(self._prefetch_after_parents(after))
        self.load(wanted)

    def _prefetch_after_parents(self, ops: list[Insert]) -> dict[int, None]:
        """Route the windows of the batch's inserts after a parent at once: the parents'
        locators in one multi-get, the first segments under the heads of their windows
        that are walked (not in the copies map) in one more (`find_present` reads
        further ones only if need be), every window in one directory probe. The
        candidates to read are returned; an insert uses its route only if its window's
        ids are still the ones routed here (an earlier operation of the batch may have
        moved its parent)."""
        pids = np.concatenate([self._pid(op) for op in ops])
        sb = self.geo.sb
        walked: dict[int, None] = {}  # the heads of windows that find_present walks
        for pid, loc in zip(pids, self.locate(pids, "parent"), strict=True):
            self._parent_at[pid.tobytes()] = (len(self._added), loc)  # find_present's
            if loc is not None and not self.copies.indexed(loc[1] // sb, loc[0]):
                walked[loc[0]] = None
        self.load(s for h in walked for s in self.router.dir.posting(h)[0][:PRELOAD].tolist())
        routed: list[tuple[Insert, int, IdArray, IdArray]] = []
        for op in ops:
            try:
                _, start, q, full = self._after_parent(op)
            except (UnknownParent, TooLarge, BadRequest):
                continue  # refused when it is applied, with its error
            routed.append((op, start, q, full))
        wanted: dict[int, None] = {}
        # each insert routed as a query from its first window's start (the router's
        # window 0: every insert in one call, the match kernel's where it is built);
        # past its first window without a hit nothing can match (chained ids)
        for (op, start, q, full), plans in zip(routed, self.router.plan_many(
                [full for _, _, _, full in routed]), strict=True):
            for w, qw, _, _ in self._windows(full, start, len(q)):
                j = w - start // sb
                plan = plans[j] if j < len(plans) else None
                if plan is not None:
                    plan.window = w
                    wanted.update(dict.fromkeys(plan.first))
                self.parent_routes[(id(op), w)] = (qw.tobytes(), Prefetched(plan))
        return wanted

    def _seq_ids(self, seq: SeqSpec, parent: bytes | None = None) -> IdArray:
        """The store's ids of a sequence, computed once per batch (prefetch did most)."""
        if parent is None and id(seq) in self.seq_ids:
            return self.seq_ids[id(seq)]
        return self.store.seq_ids(seq, parent)

    def _meta(self, op: Insert, n: int) -> U64Array:
        if isinstance(op.meta, int):  # np.full's values and errors, in half its time
            out: U64Array = np.empty(n, dtype=np.uint64)
            out.fill(op.meta)
            return out
        meta = np.asarray(op.meta, dtype=np.uint64)
        if meta.shape != (n,):
            raise BadRequest(f"meta: {meta.size} values for {n} blocks (need one per block)")
        return meta

    def _count(self, tag: int, delta: int) -> None:
        """Blocks added (or removed) in the namespace with this tag (quotas)."""
        if delta:
            self.ns_delta[tag] = self.ns_delta.get(tag, 0) + delta

    def _check_quota(self, ns: str) -> None:
        quota = self.cfg.quota(ns)
        if quota:
            tag = ns_tag(ns)
            held = self.store.ns_blocks(tag) + self.ns_delta.get(tag, 0)
            if held >= quota:
                raise QuotaExceeded(f"namespace {ns!r} holds {held:,} blocks, its quota is "
                                    f"{quota:,}: insert refused (remove or clear blocks first)")

    def _after_parent(self, op: Insert) -> tuple[Segment, int, IdArray, IdArray]:
        """(a segment holding the parent, the insert's first position, its ids, the ids
        from its first window's start) of an insert after a parent."""
        assert op.parent is not None
        pid = self._pid(op)[0]
        found = self.find_present(pid)
        if found is None:
            raise UnknownParent(f"parent {id_bytes(op.parent[0]).hex()} is not indexed "
                                f"in namespace {op.seq.ns!r}")
        hint, ppos = found
        q = self.parent_ids.get(id(op))
        if q is None:
            q = self.parent_ids[id(op)] = self._seq_ids(op.seq, id_bytes(pid))
        start, sb = ppos + 1, self.geo.sb
        head = hint.ids[: start % sb] if hint.window == start // sb else hint.ids[:0]
        return hint, start, q, np.concatenate([head, q]) if len(head) else q

    def _pid(self, op: Insert) -> IdArray:
        """The internal id ((1, 2)) of an insert's parent, computed once per batch."""
        got = self.pids.get(id(op))
        if got is None:
            assert op.parent is not None
            got = self.pids[id(op)] = salt_ids(op.seq.ns, op.parent, self.store.k)
        return got

    def _windows(self, full: IdArray, start: int, n: int
                 ) -> Iterator[tuple[int, IdArray, int, int]]:
        """Per window of an insert of n blocks from `start` (`full`: its ids from the first
        window's start): (window, its ids from the window start, lo, hi) with [lo, hi)
        the insert's positions in it."""
        sb = self.geo.sb
        base, end = start - start % sb, start + n
        for w in range(start // sb, (end - 1) // sb + 1):
            ws = w * sb
            lo, hi = max(start, ws), min(end, ws + sb)
            yield w, full[ws - base : hi - base], lo, hi

    def _route(self, op: Insert, w: int, qw: IdArray) -> Prefetched | None:
        """The window's route from the batch's prefetch, if it still applies."""
        if op.parent is None:
            return self.routes.get((id(op.seq), w))
        got = self.parent_routes.get((id(op), w))
        if got is None or got[0] != qw.tobytes():  # (n, 2) uint64 both: same bytes, same ids
            return None
        return got[1]

    def insert(self, op: Insert) -> InsertResult:
        sb = self.geo.sb
        self._check_quota(op.seq.ns)
        hint: Segment | None = None
        if op.parent is not None:
            hint, start, q, full = self._after_parent(op)
        else:
            q = self._seq_ids(op.seq)
            start, full = 0, q
        n = len(q)
        meta = self._meta(op, n)
        if n == 0:
            return InsertResult(0, 0, 0)
        tag = ns_tag(op.seq.ns)
        # (w, its ids from the window start, meta, from, best, run); run -1: a fresh
        # window (routed nowhere, nothing of the batch there, not the parent's)
        windows: list[Window] = []
        for w, qw, lo, hi in self._windows(full, start, n):
            h = hint if hint is not None and hint.window == w else None
            routed = self._route(op, w, qw)
            mw, frm = meta[lo - start : hi - start], lo - w * sb
            if h is None and self._fresh(w, qw, routed):
                windows.append((w, qw, mw, frm, None, -1))
            else:
                windows.append((w, qw, mw, frm, *self._best(w, qw, h, routed)))
        if op.add_holder:  # refused whole, before anything changes
            for _, qw, mw, frm, best, run in windows:
                self._check_holders(best, min(run, len(qw)), frm, mw)
        matched, new, matching, i = 0, 0, True, 0
        while i < len(windows):
            w, qw, mw, frm, best, run = windows[i]
            if run < 0:  # a run of fresh windows, created together: none matches
                j = next((j for j in range(i, len(windows)) if windows[j][5] >= 0),
                         len(windows))
                new += self._create_fresh(tag, windows[i:j])
                matching, i = False, j
                continue
            got, fresh = self._insert_window(w, tag, qw, mw, frm, best, run, op.add_holder)
            new += fresh
            if matching:
                matched += got
                matching = got == len(qw) - frm
            i += 1
        self.blocks += new
        self._count(tag, new)
        if self.cfg.branch_links:
            self._link(op, q, start + matched, start + n)
        return InsertResult(n, new, matched)

    def _link(self, op: Insert, q: IdArray, lo: int, hi: int) -> None:
        """Branch links of the window-start blocks at positions [lo, hi) of an insert
        whose ids from its first position are `q` (segment.py: `link_key`)."""
        sb, start = self.geo.sb, hi - len(q)
        for p in range(max(lo, 1) + (-max(lo, 1)) % sb, hi, sb):
            if p > start:
                parent = id_bytes(q[p - start - 1])
            elif op.parent is not None:
                parent = id_bytes(self._pid(op)[0])
            else:
                continue
            self.links.append(link_key(parent, id_bytes(q[p - start])))

    def _check_holders(self, best: Segment | None, covered: int, frm: int,
                       mw: U64Array) -> None:
        """Refuse an insert that would give a block of `best` in [frm, covered) more than
        `max_holders` holders (a block at the limit that mw's holder is not one of)."""
        limit = self.cfg.max_holders
        if best is None or covered <= frm:
            return
        # only present blocks with `limit` holders or more (max_holders >= 1) can refuse:
        # their holders counted vectorised, the first holder and the table's
        held = _offsets(best.presence & ((1 << covered) - 1) & ~((1 << frm) - 1))
        counts = np.ones(len(held), np.int64)
        if len(best.xmask):
            bits = (best.xmask[:, None] >> held.astype(np.uint64)) & np.uint64(1)
            counts += bits.sum(axis=0, dtype=np.int64)
        for i in held[counts >= limit].tolist():
            hs = best.holders_of(i)
            if len(hs) >= limit and int(mw[i - frm]) not in hs:
                raise TooLarge(f"insert: block {best.window * self.geo.sb + i} already has "
                               f"{len(hs):,} holders, max_holders is {limit:,}")

    def _best(self, w: int, qw: IdArray, extra: Segment | None,
              routed: Prefetched | None) -> tuple[Segment | None, int]:
        """The candidate whose ids run furthest along `qw` (the longer segment on a tie),
        and that run: the first round of the window's plan (`routed`: prefetched for the
        batch, plus the segments the batch created there; None: routed now), then, with
        exact matching, further rounds while an unread candidate's bound beats the run.
        A next block indexed nowhere (no locator: present in no segment) settles it
        from the window's copies that hold its id absent (removed): only they can run
        further, and the insert must refill them, not lay the block out anew."""
        if routed is None:
            plan = self.router.plan_window(qw, w)
            cands = plan.first if plan is not None else []
        else:
            plan = routed.plan
            first = plan.first if plan is not None else []
            cands = list(dict.fromkeys(first + self.touched.get((w, int(qw[0, 0])), [])))
        best, run = self._pick(w, qw, cands, extra,
                               first_mismatch(extra.ids, qw, self.store.k) if extra is not None
                               else 0)
        while plan is not None and self.router.cfg.exact_match and plan.open(run):
            if self.router.cfg.block_locators and plan.checked_at != run:
                plan.checked_at = run  # is the next block indexed anywhere? (one read)
                if self.locate(qw[run : run + 1], "ids")[0] is None:
                    held = self._window_segments_at(w, int(qw[0, 0]), np.array([run]),
                                                    qw[run : run + 1, 0])
                    return self._pick(w, qw, held, best, run)
            more = plan.more(run)
            if not more:
                break
            self.store.activity.extra_rounds += 1
            best, run = self._pick(w, qw, more, best, run)
        return best, run

    def _pick(self, w: int, qw: IdArray, cands: list[int], best: Segment | None,
              run: int) -> tuple[Segment | None, int]:
        self.load(cands)
        for sid in cands:
            c = self.cache.get(sid)
            if c is None or c.window != w:
                continue
            r = first_mismatch(c.ids, qw, self.store.k)
            if r > run or (best is not None and r == run and r > 0 and c.nblocks > best.nblocks):
                best, run = c, r
        return best, run

    def _fresh(self, w: int, qw: IdArray, routed: Prefetched | None) -> bool:
        """Whether `_best` finds nothing in window w without reading anything: the
        batch's prefetch routed it nowhere and no segment of the batch is there."""
        return (routed is not None and routed.plan is None
                and (w, int(qw[0, 0])) not in self.touched)

    def _create_fresh(self, tag: int, run: Sequence[Window]) -> int:
        """Consecutive windows of an insert that nothing holds (`_fresh`, or `_best`
        found nothing), together: a new segment each, in order, registered as new
        content, and their blocks' locations in one add. Returns the blocks indexed."""
        sb, heads, firsts, lens = self.geo.sb, [], [], []
        for w, qw, mw, frm, _, _ in run:
            n = len(qw)
            meta = np.concatenate([np.zeros(frm, np.uint64), mw]) if frm else mw
            seg = self.create(w, tag, qw, meta, ((1 << n) - 1) & ~((1 << frm) - 1))
            self.router.register(seg, self.load, old_n=0, fresh_from=0)
            heads.append(int(qw[0, 0]))
            firsts.append(w * sb + frm)
            lens.append(n - frm)
        total = sum(lens)
        if self.cfg.block_locators:  # window k's blocks at firsts[k], firsts[k] + 1, ...
            k = np.array(lens, np.int64)
            pos: I64Array = np.arange(total, dtype=np.int64)
            pos += np.repeat(np.array(firsts, np.int64) - (np.cumsum(k) - k), k)
            self.add_located(np.concatenate([qw[frm:] for _, qw, _, frm, _, _ in run]),
                             np.repeat(np.array(heads, np.uint64), k), pos)
        self.holdings += total
        return total

    def _insert_window(self, w: int, tag: int, qw: IdArray, mw: U64Array, frm: int,
                       best: Segment | None, run: int, add_holder: bool) -> tuple[int, int]:
        """Insert blocks [frm, len(qw)) of window w; qw holds the window's ids from its
        start, `best`/`run` the candidate `_best` found. Returns (blocks already present
        from frm on, blocks newly indexed)."""
        sb, L = self.geo.sb, len(qw)
        full_mask = (1 << L) - 1
        if best is None or run == 0:  # nothing of it anywhere: a segment of its own
            return 0, self._create_fresh(tag, [(w, qw, mw, frm, None, 0)])
        covered = min(run, L)
        present = best.present_run(frm) if frm < best.nblocks else 0
        got = max(0, min(present, covered - frm))
        span = ((1 << covered) - 1) & ~((1 << frm) - 1)  # blocks [frm, covered)
        holes = _offsets(~best.presence & span)
        if add_holder:  # copies hold alike, so only blocks `best` shows without the
            # holder need the walk over the window's copies: a worker re-inserting its
            # own prefix every turn reads nothing more
            need = _lacking(best, _offsets(best.presence & span), mw, frm)
            if len(need):
                self.holdings += self.add_holders(w, int(qw[0, 0]), need, qw[need],
                                                  mw[need - frm])
        if len(holes):
            self.holdings += self.refill(w, int(qw[0, 0]), holes, qw[holes], mw[holes - frm])
        if run >= L:
            return got, len(holes)
        old_n = 0
        if run == best.nblocks:  # our window continues this segment: extend in place
            seg = self.mutable(best.seg_id)
            old_n = seg.nblocks
            seg.ids = np.concatenate([seg.ids, qw[run:]])
            seg.meta = np.concatenate([seg.meta, mw[run - frm :]])
            seg.presence |= full_mask & ~((1 << run) - 1)
            self.touch(seg.seg_id)
        else:  # we leave `best` in the middle: a segment of our own with a copy of the head
            cur = self.cache[best.seg_id]
            assert cur is not None
            seg = self.create(
                w, tag, np.concatenate([cur.ids[:run], qw[run:]]),
                np.concatenate([cur.meta[:run], mw[run - frm :]]),
                (cur.presence & ((1 << run) - 1)) | (full_mask & ~((1 << run) - 1)),
                cur.keep_head(run),
            )
        self.add_locators(qw[run:], int(qw[0, 0]), w * sb + run)
        self.router.register(seg, self.load, old_n=old_n, fresh_from=run)
        self.holdings += L - run
        return got, (L - run) + len(holes)

    def add_holders(self, w: int, head_key: int, offs: I64Array, ids: IdArray,
                    metas: U64Array) -> int:
        """Add each target's meta as a holder of its block (offsets `offs` in window w,
        ids `ids`, metas `metas`) in EVERY segment of the window that holds the block
        (branch copies included). Returns the holdings added (a block counted once).
        With the write kernel: `_cwrite.add_holders`."""
        sids = self._window_segments_at(w, head_key, offs, ids[:, 0])
        kernel = self.store.k.write
        if kernel is not None:
            changed, hit = kernel.add_holders(self._segments(sids), offs, ids, metas)
            self._install(sids, changed)
            return len(set(offs[np.frombuffer(hit, np.bool_)].tolist()))
        added: set[int] = set()
        wanted = list(zip(offs.tolist(), ids.tolist(), metas.tolist(), strict=True))
        for sid in sids:
            c = self.cache[sid]
            assert c is not None
            for o, want, m in wanted:
                if c.is_present(o) and not c.holds(o, m) and c.has_at(o, want):
                    self.mutable(sid).add_holder(o, m)
                    c = self.cache[sid]
                    assert c is not None
                    added.add(o)
        return len(added)

    def _window_segments_at(self, w: int, head_key: int, offs: I64Array,
                            lows: U64Array) -> list[int]:
        """The segments of window w under routing key `head_key` that can hold a
        target block (offsets `offs`, ids whose low words are `lows`), read, in the
        walk's order: a hot window's from the copies map (sarpd/core/copies.py), the
        others by the walk (which indexes a hot window)."""
        return self._windows_segments([(w, head_key, offs, lows)])[0]

    def _windows_segments(self, wanted: Sequence[tuple[int, int, I64Array, U64Array]]
                          ) -> list[list[int]]:
        """`_window_segments_at` of several windows (window, head key, offsets, low
        words), what they lack read in ONE load (a removal's windows: one multi-get)."""
        found = [self.copies.lookup(w, h, offs, lows) for w, h, offs, lows in wanted]
        walks = [self.router.dir.posting(h)[0].tolist() if got is None else got
                 for (_, h, _, _), got in zip(wanted, found, strict=True)]
        self.load(sid for sids in walks for sid in sids)
        out = []
        for (w, h, _, _), got, sids in zip(wanted, found, walks, strict=True):
            if got is not None:
                out.append([sid for sid in got if self.cache.get(sid) is not None])
                continue
            segs = self._in_window(sids, w)
            if len(segs) > self.copies.min_copies:  # a hot window: index it
                self.copies.build(w, h, [c for sid in segs if (c := self.cache[sid])])
            out.append(segs)
        return out

    def _walk(self, w: int, head_key: int) -> list[int]:
        """Every segment of window w under routing key `head_key`, read (the reference
        of the copies map: each of them, in posting order)."""
        segs: list[int] = self.router.dir.posting(head_key)[0].tolist()
        self.load(segs)
        return self._in_window(segs, w)

    def _in_window(self, sids: list[int], w: int) -> list[int]:
        """The read segments among `sids` that are of window w, in order."""
        return [sid for sid in sids if (c := self.cache.get(sid)) is not None and c.window == w]

    def refill(self, w: int, head_key: int, offs: I64Array, ids: IdArray,
               metas: U64Array) -> int:
        """Make absent blocks present again (offsets `offs` in window w, ids `ids`), the
        target's meta their one holder, in EVERY segment of the window that holds them
        (branch copies included). Returns how many of the targets were absent somewhere.
        With the write kernel: `_cwrite.refill_blocks`."""
        sids = self._window_segments_at(w, head_key, offs, ids[:, 0])
        kernel = self.store.k.write
        if kernel is not None:
            changed, hit = kernel.refill_blocks(self._segments(sids), offs, ids, metas)
            self._install(sids, changed)
            self.logged.extend(sids[k] for k, *_ in changed)  # recovery re-adds their blocks
            if changed:
                self.stamp((w, head_key))
            back = set(offs[np.frombuffer(hit, np.bool_)].tolist()) if hit.count(1) else set()
        else:
            back = self._refill_reference(w, head_key, sids, offs, ids, metas)
        if back:
            at = _among(offs, back)
            self.add_located(ids[at], np.full(int(at.sum()), head_key, np.uint64),
                             w * self.geo.sb + offs[at])
        return len(back)

    def _refill_reference(self, w: int, head_key: int, sids: list[int], offs: I64Array,
                          ids: IdArray, metas: U64Array) -> set[int]:
        """`refill`'s loop over the window's segments: the offsets it refilled."""
        changed: set[int] = set()
        wanted = list(zip(offs.tolist(), ids.tolist(), metas.tolist(), strict=True))
        for sid in sids:
            c = self.cache[sid]
            assert c is not None
            for o, want, m in wanted:
                if not c.is_present(o) and c.has_at(o, want):
                    c = self.mutable(sid)
                    c.presence |= 1 << o
                    c.meta[o] = m
                    changed.add(o)
                    self.stamp((w, head_key))
                    self.logged.append(sid)  # recovery adds its blocks to the map again
        return changed

    def drop(self, w: int, head_key: int, sids: list[int], offs: I64Array, ids: IdArray,
             holder: int | None) -> tuple[int, int]:
        """Take `holder` (None: every holder) off the target blocks (offsets `offs` in
        window w, ids `ids`) in EVERY segment of the window that holds them (`sids`:
        `_window_segments_at` of the targets). Returns (blocks left with no holder,
        holdings taken off), each block counted once however many copies hold it.
        The reference of `_drop_windows` (the write kernel's, every window at once)."""
        # a block is its (offset, id): siblings of a branch share an offset, not an id
        gone: set[tuple[int, int, int]] = set()
        taken: dict[tuple[int, int, int], int] = {}
        wanted = {(o, a, b): [a, b] for o, (a, b) in zip(offs.tolist(), ids.tolist(),
                                                         strict=True)}
        for sid in sids:
            c = self.cache[sid]
            assert c is not None
            for block, want in wanted.items():
                o = block[0]
                if not (c.is_present(o) and c.has_at(o, want)):
                    continue
                hs = c.holders_of(o)
                if holder is not None and holder not in hs:
                    continue
                taken.setdefault(block, len(hs) if holder is None else 1)
                if self.mutable(sid).drop_holder(o, holder):
                    gone.add(block)
                    self.stamp((w, head_key))
                c = self.cache[sid]
                assert c is not None
        if gone:  # present in no copy now: the block map forgets them
            self._gone.append(np.array([[b[1], b[2]] for b in gone], dtype=np.uint64))
        return len(gone), sum(taken.values())

    def _drop_windows(self, c: WriteKernel, targets: Grouped, found: list[list[int]],
                      holder: int | None) -> tuple[int, int]:
        """`drop` of every window of a removal (`found`: each one's segments) by the
        write kernel, in one call (`_cwrite.drop_windows`): the segments it changed are
        installed on their writable copies."""
        if not targets.keys:
            return 0, 0
        sids = [sid for got in found for sid in got]
        seg_ends = np.cumsum([len(got) for got in found], dtype=np.int64)
        changed, taken, gone = c.drop_windows(self._segments(sids), seg_ends, targets.offs,
                                              targets.ids, targets.ends, holder)
        self._install(sids, changed)
        lost = np.frombuffer(gone, np.bool_)
        if lost.any():  # present in no copy now: the block map forgets them
            at = np.searchsorted(targets.ends, np.flatnonzero(lost), side="right")
            for g in dict.fromkeys(at.tolist()):
                self.stamp(targets.keys[g])  # find_present's answers there move
            self._gone.append(targets.ids[lost])
        return int(lost.sum()), int(np.frombuffer(taken, np.int64).sum())

    def _segments(self, sids: list[int]) -> list[Segment]:
        """The read segments `sids` (`_window_segments_at` gives read ones only)."""
        segs = [seg for sid in sids if (seg := self.cache[sid]) is not None]
        assert len(segs) == len(sids)
        return segs

    def _install(self, sids: list[int], changed: list[Change]) -> None:
        """A window kernel's changes to segments `sids`, installed on writable copies
        (a segment's first: a copy of its ids with the kernel's new arrays)."""
        for k, presence, meta_b, xmeta_b, xmask_b in changed:
            sid = sids[k]
            meta = np.frombuffer(meta_b, np.uint64)
            xmeta, xmask = ((np.frombuffer(xmeta_b, np.uint64), np.frombuffer(xmask_b, np.uint64))
                            if xmeta_b else (NO_HOLDERS, NO_HOLDERS))
            s = self.cache[sid]
            assert s is not None
            if sid in self.dirty:
                s.presence, s.meta, s.xmeta, s.xmask = presence, meta, xmeta, xmask
            else:
                self._dirty(sid, s, Segment(s.seg_id, s.window, presence, s.ns_tag,
                                            s.ids.copy(), meta, xmeta, xmask))

    def locate(self, ids: IdArray, what: str) -> list[tuple[int, int] | None]:
        """`locate_arrays` as tuples (head key, position); None: present in no segment."""
        heads, pos = self.locate_arrays(ids, what)
        return [(h, p) if p >= 0 else None
                for h, p in zip(heads.tolist(), pos.tolist(), strict=True)]

    def locate_arrays(self, ids: IdArray, what: str, leaving: bool = False
                      ) -> tuple[U64Array, npt.NDArray[np.int64]]:
        """Where blocks (internal ids) are: head keys and positions (-1: present in no
        segment). The txn's own new locations first, the rest from the store (the block
        map, then locator records in one multi-get, each read once per txn; `leaving`:
        a removal's, which the map does not refresh)."""
        if not self.cfg.block_locators:
            raise BadRequest(f"{what}: this index keeps no block locators "
                             "(index setting block_locators = false)")
        own = self._own_map()
        if own is None:  # nothing located in this txn yet: all from the store
            heads, pos = self.store.locate_arrays(ids, self._read, leaving)
            return np.array(heads, np.uint64), np.array(pos, np.int64)
        heads, pos = own.lookup(ids)
        heads, pos = np.array(heads, np.uint64), np.array(pos, np.int64)
        miss = pos < 0
        if miss.any():  # the map and backend do not change in a txn
            heads[miss], pos[miss] = self.store.locate_arrays(ids[miss], self._read, leaving)
        return heads, pos

    def find_present(self, idv: IdArray) -> tuple[Segment, int] | None:
        """A segment in which block `idv` is present, and the block's position."""
        key = idv.tobytes()
        got_at = self._parent_at.get(key)
        if got_at is None:
            loc = self.locate(idv.reshape(1, 2), "parent")[0]
        elif got_at[0] == len(self._added):
            loc = got_at[1]
        else:  # the store's answer stands in a txn: only a newer location of its own wins
            own = self._own_map()
            assert own is not None  # locations were added since
            newer = own.lookup(idv.reshape(1, 2))
            loc = (int(newer[0][0]), int(newer[1][0])) if newer[1][0] >= 0 else got_at[1]
        self._parent_at[key] = (len(self._added), loc)
        if loc is None:
            return None
        head_key, pos = loc
        w, o = divmod(pos, self.geo.sb)
        # the walk's answer stands while nothing in its window changed since: segments
        # only grow, a new one is last in the walk's order, presence changes stamp it
        memo = (key, head_key, pos)
        stamp = self.cleared + self.stamps.get((w, head_key), 0)
        got = self.found.get(memo)
        if got is not None and got[1] == stamp:
            c = self.cache[got[0]]
            assert c is not None
            return c, pos
        sid = self._first_present(w, head_key, o, idv)
        if sid is None:
            return None
        self.found[memo] = (sid, stamp)
        c = self.cache[sid]
        assert c is not None
        return c, pos

    def _first_present(self, w: int, head_key: int, o: int, idv: IdArray) -> int | None:
        """The first segment, in the walk's order, of window w under `head_key` that
        holds block `idv` present at offset o: the candidates (the copies map's, else
        the posting list) read PRELOAD at a time, doubling, not all of them (a hot
        window's first copy that holds a block usually has it: copies hold alike). A
        walk that reads more than `min_copies` finishes as `_window_segments_at` (which
        indexes a hot window)."""
        offs, lows = np.array([o], np.int64), idv.reshape(-1)[:1]
        got = self.copies.lookup(w, head_key, offs, lows)
        sids = got if got is not None else self.router.dir.posting(head_key)[0].tolist()
        want = idv.reshape(-1).tolist()
        at, chunk = 0, PRELOAD
        while at < len(sids):
            if got is None and at > self.copies.min_copies:
                sids, at = self._window_segments_at(w, head_key, offs, lows), 0
                got = sids
            part = sids[at : at + chunk]
            loaded = self.load(part)
            for sid in part:
                c = loaded.get(sid)
                if c is not None and c.window == w and c.is_present(o) and c.has_at(o, want):
                    return sid
            at, chunk = at + len(part), chunk * 2
        return None

    def remove(self, op: Remove) -> RemoveResult:
        sb = self.geo.sb
        removed = taken = 0
        targets = _NO_TARGETS
        if op.seq is not None:
            q = self._seq_ids(op.seq)
            if op.start < len(q):  # its windows from the one of `start`, in order
                ws = range(op.start // sb, -(-len(q) // sb))
                targets = Grouped(tuple((w, int(q[w * sb, 0])) for w in ws),
                                  np.arange(op.start, len(q), dtype=np.int64) % sb,
                                  q[op.start :],
                                  np.array([min(len(q), w * sb + sb) - op.start for w in ws],
                                           np.int64))
        elif op.ids is not None and len(op.ids):
            ids = salt_ids(op.ns, op.ids, self.store.k)
            heads, pos = self.locate_arrays(ids, "ids", leaving=True)
            targets = _by_window(ids, heads, pos, sb)
        groups = targets.groups()
        # the windows' segments read at once: drops change no window's segments
        found = self._windows_segments([(w, h, offs, gids[:, 0]) for w, h, offs, gids in groups])
        kernel = self.store.k.write
        if kernel is not None:
            removed, taken = self._drop_windows(kernel, targets, found, op.meta)
        else:  # the reference: window by window
            for (w, head_key, offs, gids), sids in zip(groups, found, strict=True):
                gone, off = self.drop(w, head_key, sids, offs, gids, op.meta)
                removed, taken = removed + gone, taken + off
        self.blocks -= removed
        self.holdings -= taken
        if removed:
            self._count(ns_tag(op.seq.ns if op.seq is not None else op.ns), -removed)
        return RemoveResult(removed)

    def clear(self, op: Clear) -> RemoveResult:
        """Take off every holder of the namespace whose meta & mask == value; blocks left
        with no holder are removed. A full scan of the segments (an administrative
        operation); each block counts once however many copies hold it."""
        tag, mask, value = ns_tag(op.ns), op.mask, op.value
        gone: set[tuple[int, int, int]] = set()
        taken: dict[tuple[int, int, int], int] = {}
        for sid, seg in self._all_segments():
            if seg.ns_tag != tag or not seg.presence:
                continue
            hit = self._clear_hits(seg, mask, value)
            if not hit:
                continue
            self.cache.setdefault(sid, seg)
            c = self.mutable(sid)
            for o, drop in hit.items():
                key = (c.window, o, int(c.ids[o, 0]))
                taken.setdefault(key, len(drop))
                for h in drop:
                    c.drop_holder(o, h)
                self.cleared += 1
                if not c.is_present(o):
                    gone.add(key)
        self.blocks -= len(gone)
        self.holdings -= sum(taken.values())
        self._count(tag, -len(gone))
        return RemoveResult(len(gone))

    @staticmethod
    def _clear_hits(seg: Segment, mask: int, value: int) -> dict[int, list[int]]:
        """Present block -> its holders that `clear` takes off."""
        m, v = np.uint64(mask), np.uint64(value)
        if not len(seg.xmeta):  # one holder a block: vectorised
            hit = np.flatnonzero((seg.meta & m) == v).tolist()
            return {o: [int(seg.meta[o])] for o in hit if seg.is_present(o)}
        out = {}
        for o in range(seg.nblocks):
            drop = [h for h in seg.holders_of(o) if h & mask == value]
            if drop:
                out[o] = drop
        return out

    def _all_segments(self) -> Iterable[tuple[int, Segment]]:
        seen: set[int] = set()
        for key, value in self.store.scan(SEG_PREFIX, b"T"):
            sid = seg_id_of_key(key)
            seen.add(sid)
            if sid in self.cache or sid in self.store.pending:  # pending: base + deltas
                cached = self.cache[sid] if sid in self.cache else self.store.pending[sid]
                if cached is not None:
                    yield sid, cached
                continue
            try:
                yield sid, decode_segment(value, sid, self.store.k)
            except (CorruptData, FormatVersionError) as exc:
                log.error("clear: skipping segment %d: %s", sid, exc)
        for sid, cached in list(self.cache.items()):
            if sid not in seen and cached is not None:
                yield sid, cached


_NO_OFFSETS: I64Array = np.empty(0, np.int64)
_NO_OFFSETS.flags.writeable = False
_NO_IDS: IdArray = np.empty((0, 2), np.uint64)
_NO_IDS.flags.writeable = False
_NO_TARGETS = Grouped((), _NO_OFFSETS, _NO_IDS, _NO_OFFSETS)  # a removal naming nothing located


def _offsets(mask: int) -> I64Array:
    """The set bits of a 64-bit mask, ascending."""
    if not mask:
        return _NO_OFFSETS
    bits = np.unpackbits(np.frombuffer(mask.to_bytes(8, "little"), np.uint8), bitorder="little")
    return np.flatnonzero(bits)


def _among(offs: I64Array, some: set[int]) -> npt.NDArray[np.bool_]:
    """Which of `offs` (window offsets) are in `some` (`np.isin`, by a 64-entry table)."""
    table = np.zeros(64, np.bool_)
    table[list(some)] = True
    out: npt.NDArray[np.bool_] = table[offs]
    return out


def _lacking(seg: Segment, offs: I64Array, metas: U64Array, frm: int) -> I64Array:
    """The offsets among `offs` (present blocks of `seg`) whose holders lack meta
    metas[o - frm] (`Segment.holds`, vectorised: the table is ascending)."""
    want = metas[offs - frm]
    held = seg.meta[offs] == want
    if len(seg.xmeta):
        j = np.minimum(np.searchsorted(seg.xmeta, want), len(seg.xmeta) - 1)
        bit = (seg.xmask[j] >> offs.astype(np.uint64)) & np.uint64(1)
        held |= (seg.xmeta[j] == want) & (bit != 0)
    out: I64Array = offs[~held]
    return out


def _by_window(ids: IdArray, heads: U64Array, pos: npt.NDArray[np.int64], sb: int
               ) -> Grouped:
    """Located blocks (position -1: nowhere, left out) grouped by (window, head key), in
    the order each group first appears, a group's blocks in their order. No sort: the
    runs of one key (a removal names a window's blocks together) are grouped by a dict,
    and when each key is one run the blocks are already in their groups."""
    at = np.flatnonzero(pos >= 0)
    if not len(at):
        return _NO_TARGETS
    w, o = np.divmod(pos[at], sb)
    h = heads[at]
    starts = [0, *(np.flatnonzero((w[1:] != w[:-1]) | (h[1:] != h[:-1])) + 1).tolist()]
    bounds = [*starts, len(at)]
    runs: dict[tuple[int, int], list[int]] = {}
    for r, key in enumerate(zip(w[starts].tolist(), h[starts].tolist(), strict=True)):
        runs.setdefault(key, []).append(r)
    if len(runs) == len(starts):
        return Grouped(tuple(runs), o, ids[at], np.array(bounds[1:], np.int64))
    order = np.concatenate([np.arange(bounds[r], bounds[r + 1])
                            for rs in runs.values() for r in rs])
    ends = np.cumsum([sum(bounds[r + 1] - bounds[r] for r in rs) for rs in runs.values()],
                     dtype=np.int64)
    return Grouped(tuple(runs), o[order], ids[at[order]], ends)
