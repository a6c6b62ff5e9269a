"""The router: which segments a query's windows are read from, and the routing points
that make that answer exact.

It owns the routing directory and the candidate rankings. Segments are read through
a `Loader` the caller passes (a write transaction's working copies, a recovery
pass's reads): the router never reads the backend itself.

Routing (docs/DECISIONS.md): for each 64-block window of a query, the deepest
routing point present in the directory (all lattice offsets of a batch probed in
one vectorised lookup), then the `window_cap` strongest candidates under it by
fingerprint agreement as the first round of the window's `WindowPlan` (further
rounds: module `plan`). With the match kernel built (`sarpd.core.native` path
"match", module `kernel`) one native call routes the whole batch; `deepest`,
`plan_at` and `_first` are its reference.

Routing invariant (kept by `register`): if a routing key k at offset o > 0 of window
w is in the directory, every live segment whose block at o has that id is listed
under k. Offset 0 of every segment is always listed. A base point (16, 32, 48) is
pruned for a segment while its predecessor lists <= `prune_max_pred` segments; when
the predecessor grows past it the earlier ones are added ("un-pruned"). A posting
list that reaches (T+1), 2(T+1), ... entries is refined at the next lattice midpoint.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

from sarpd.config import IndexConfig
from sarpd.core import kernel, native
from sarpd.core.native import DirectoryLike, Kernels, MatchKernel
from sarpd.core.plan import WindowPlan, held
from sarpd.core.routing import (
    Geometry,
    agreement,
    filter_at,
    filters_at,
    fingerprints,
    strongest,
)
from sarpd.core.segment import Loader, Segment, as_u64
from sarpd.model import IdArray, U64Array

RANKED_MAX = 65_536  # candidate rankings kept between writes (a bound for read-only runs)


class Router:
    def __init__(self, cfg: IndexConfig, kernels: Kernels | None = None) -> None:
        self.cfg = cfg
        self.k = kernels or native.pick()  # the index's kernels (sarpd.core.native)
        self.geo = Geometry.of(cfg)
        self.dir: DirectoryLike = self.k.directory(cfg.delta_max_entries)
        # first-round rankings, valid while the directory's version is unchanged
        self._ranked: dict[bytes, tuple[list[int], int]] = {}  # -> (first, weakest agreement)
        self._ranked_at = -1

    # -- routing a query ---------------------------------------------------------------
    def deepest(self, qs: Sequence[IdArray]) -> list[list[int]]:
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

    def plan_many(self, qs: Sequence[IdArray]) -> list[list[WindowPlan]]:
        """Per query, per window from 0 up to the first without a routing hit: how its
        candidates are read (module `plan`: a first round, then bound-and-verify).
        Each plan holds its posting list as `Directory.posting` gives it now."""
        k = self.k.match
        if k is None:
            return self.plan_many_reference(qs)
        routed = self.route(qs, k)
        return [self.plans(routed, lo, hi, held_now=True) if hi > lo else []
                for lo, hi in routed.spans()]

    def plan_many_reference(self, qs: Sequence[IdArray]) -> list[list[WindowPlan]]:
        """`plan_many` as the reference computes it (`deepest`, then `plan_at`)."""
        sb = self.geo.sb
        return [[self.plan_at(q[w * sb : (w + 1) * sb], w, d) for w, d in enumerate(dp)]
                for q, dp in zip(qs, self.deepest(qs), strict=True)]

    def route(self, qs: Sequence[IdArray], k: MatchKernel) -> kernel.Routed:
        """The match kernel's routing of a batch (module `kernel`): one native call."""
        return kernel.route(k, qs, self.dir.flat(), self.geo.sb, self.geo.gap,
                            self.cfg.window_cap)

    def plans(self, routed: kernel.Routed, lo: int, hi: int,
              held_now: bool = False) -> list[WindowPlan]:
        """The plans of routed rows [lo, hi) (one query's). `held_now`: each holds its
        posting list as the directory gives it now (a write batch keeps plans while it
        changes the directory); else it is built from the routed arrays when a round
        needs it (valid within one match batch, which changes nothing)."""
        rows = routed.rows[lo:hi].tolist()
        base = rows[0][kernel.FSTART] if rows else 0
        end = rows[-1][kernel.FSTART] + rows[-1][kernel.FCOUNT] if rows else 0
        first = routed.first[base:end].tolist()
        sb, out = self.geo.sb, []
        for r, (qi, w, off, n, fs, fc, _, fb, blo, bhi, dlo, dhi) in enumerate(rows, lo):
            fs -= base
            start = int(routed.qstarts[qi]) + w * sb
            qw = routed.qids[start : start + n]
            posting = (held(*self.dir.posting(int(qw[off, 0]))) if held_now
                       else routed.posting(r))
            out.append(WindowPlan(w, n, off, first[fs : fs + fc], bhi - blo + dhi - dlo,
                                  posting, qw, sb, self.cfg.window_cap, fb))
        return out

    def plan_window(self, qw: IdArray, w: int) -> WindowPlan | None:
        """The plan of one window of a query (`qw`: its ids from the window start, at
        most one window); None when no routing point of it is in the directory."""
        plans = self.plan_many([qw[: self.geo.sb]])[0]
        return plans[0] if plans else None

    def route_window(self, qw: IdArray, w: int) -> list[int]:
        """First-round candidate segments for one window of a query."""
        plan = self.plan_window(qw, w)
        return plan.first if plan is not None else []

    def plan_at(self, qw: IdArray, w: int, offset: int) -> WindowPlan:
        """The plan of window `w` of a query (`qw`: its ids from the window start, at
        most one window) read under the routing point at `offset`: its first round is
        all the candidates, or past `window_cap` the strongest by agreement."""
        segs, filts = self.dir.posting(int(qw[offset, 0]))
        first, weakest = self._first(qw, offset, segs, filts)
        n = len(qw)
        first_bound = 0  # every candidate is in the first round
        if segs.size > len(first):
            first_bound = n if weakest >= 16 else min(n, offset + 1 + weakest)
        return WindowPlan(w, n, offset, first, segs.size, held(segs, filts), qw, self.geo.sb,
                          self.cfg.window_cap, first_bound)

    def _first(self, qw: IdArray, offset: int, segs: U64Array,
               filts: U64Array) -> tuple[list[int], int]:
        """The first round and the agreement of its weakest candidate (16 when every
        candidate is in it)."""
        if segs.size <= self.cfg.window_cap:  # all of them are read: no ranking needed
            return segs.tolist(), 16
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
            hit = self._ranked[ck] = strongest(segs, filts, qf, self.cfg.window_cap)
        return hit

    # -- keeping the directory -----------------------------------------------------------
    def register(self, seg: Segment, load: Loader, old_n: int | None = None,
                 fresh_from: int | None = None) -> None:
        """Enter (or refresh) the routing points of a new or grown segment.

        `old_n`: the segment's length when it was last registered (0: new; None:
        unknown, as in recovery: every point is looked up). `fresh_from`: blocks from
        this offset on are new content that no other segment holds, so a key there
        that is not in the directory yet has no siblings to list. `load` reads the
        other segments a new point must list."""
        geo, d, sid = self.geo, self.dir, seg.seg_id
        if old_n == 0 and fresh_from == 0 and self.cfg.prune_max_pred >= 1:
            # all new content: only the head is listed (every later base point has a
            # predecessor listed once at most: pruned; refinement needs a long list)
            d.add(int(seg.ids[0, 0]), sid, segment_filters(seg.ids, [0], geo.sb, self.k)[0])
            return
        n = seg.nblocks
        # the points in [low, n) (offsets ascend): those before `low` keep their filter
        low, at = 0 if old_n is None else old_n - 16, geo.offsets
        offs = list(at[bisect_left(at, low) : bisect_left(at, n)])
        if not offs:
            return
        fresh = n if fresh_from is None else fresh_from
        filts = segment_filters(seg.ids, offs, geo.sb, self.k)
        refine: list[tuple[int, int, int]] = []
        t = self.cfg.refine_threshold + 1
        for o, key, f in zip(offs, seg.ids[offs, 0].tolist(), filts, strict=True):
            if (old_n is None or o < old_n) and d.set_filter(key, sid, f):
                continue
            count = self._enter(seg, o, key, f, fresh, load)
            if count >= t and count % t == 0 and (count // t) & (count // t - 1) == 0:
                refine.append((o, key, (count // t).bit_length()))
        for o, key, level in refine:
            steps = geo.refinements(o)
            if level <= len(steps) and self._splits(key, steps[level - 1] - o):
                self._add_point(key, steps[level - 1], load)

    def _enter(self, seg: Segment, o: int, key: int, f: int, fresh: int, load: Loader) -> int:
        """List `seg` under its key at offset `o` where the invariant needs it; the
        posting list's length after (0: not listed, no refinement to consider)."""
        geo, d = self.geo, self.dir
        if o >= fresh and o and not geo.is_base(o):
            return 0  # new content: no refinement point can exist for it yet
        count = 0 if o >= fresh else d.count(key)
        if not o or count:
            d.add(key, seg.seg_id, f)
            return count + 1
        if not geo.is_base(o):
            return 0  # refinement points exist only where a posting list grew
        if o - geo.spacing >= fresh and self.cfg.prune_max_pred >= 1:
            return 0  # pruned: the predecessor is new content, listed once at most
        pred_key = int(seg.ids[o - geo.spacing, 0])
        if d.count(pred_key) <= self.cfg.prune_max_pred:
            return 0  # pruned: the predecessor's few candidates are read instead
        d.add(key, seg.seg_id, f)
        if o < fresh:
            pred_filt = segment_filters(seg.ids, [o - geo.spacing], geo.sb, self.k)[0]
            self._list_siblings(pred_key, pred_filt, o, seg, load)
        return d.count(key)

    def _list_siblings(self, pred_key: int, pred_filt: int, o: int, seg: Segment,
                       load: Loader) -> None:
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
        sids: list[int] = same.tolist()
        loaded = load(sids)
        want = seg.ids[o].tolist()
        for sid in sids:
            c = loaded.get(sid)
            if c is not None and c.window == seg.window and c.has_at(o, want):
                self.dir.add(want[0], sid, segment_filters(c.ids, [o], self.geo.sb, self.k)[0])

    def _add_point(self, from_key: int, offset: int, load: Loader) -> None:
        """Refinement: list every segment under `from_key` at its own key at `offset`."""
        sids: list[int] = self.dir.posting(from_key)[0].tolist()
        loaded = load(sids)
        for sid in sids:
            c = loaded.get(sid)
            if c is None or offset >= c.nblocks:
                continue
            key = int(c.ids[offset, 0])
            if not self.dir.has(key, sid):
                self.dir.add(key, sid, segment_filters(c.ids, [offset], self.geo.sb, self.k)[0])

    def _splits(self, key: int, step: int) -> bool:
        """Would a point `step` blocks deeper split this posting list? Not when every
        candidate's fingerprints agree that far (they all share that block)."""
        if step > 16:
            return True
        filts = self.dir.posting(key)[1]
        return bool(filts.size) and bool((agreement(filts, int(filts[0])) < step).any())


def segment_filters(ids: IdArray, offsets: list[int], sb: int, k: Kernels) -> list[int]:
    """The filters of routing points at `offsets` of a segment with these ids (at most
    `sb` of them): routing's fingerprint arithmetic, or its C twin (native path
    "write", sarpd/core/_cwrite.c)."""
    c = k.write
    if c is not None:
        out: list[int] = c.filters(as_u64(ids), offsets)
        return out
    got: list[int] = filters_at(fingerprints(ids, sb), np.array(offsets, dtype=np.int64)).tolist()
    return got
