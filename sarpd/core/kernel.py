"""The match kernel's side of a batch (sarpd/core/_cmatch.c, the `match` slot of an
index's `sarpd.core.native.Kernels`): the layout it takes and gives.

Its reference is the router's query half (`Router.deepest`, `plan_at`, `_first`)
and the index's first verification round (`SarpIndex._verify_round`); answers are
bit-for-bit theirs (tests/core/test_kernel.py). A batch's queries go in as one
(N, 2) id array with their lengths, and the directory as its flat arrays
(`Directory.flat`). `route` gives one row per routed window (per query, windows
from 0 up to the first without a routing hit), ROW_FIELDS int64 each:

    Q, W        the query (its index in the batch) and the window
    OFF, LEN    the deepest routing point present; the query's blocks in the window
    FSTART, FCOUNT  the window's first round: first[FSTART : FSTART + FCOUNT]
    WEAK        agreement of the weakest first-round candidate (16: all are in it)
    FBOUND      the first round's weakest bound (plan.WindowPlan.first_bound)
    BLO, BHI    the posting list's base slice
    DLO, DHI    its delta rows: dorder[DLO:DHI] (insertion order)

and the first rounds of every window in one flat uint64 array (strongest first;
every candidate in posting order when there are at most `window_cap`). `verify`,
after the batch's one multi-get, gives every row the longest verified run of its
first round (ids equal AND present, from the window start) and the first candidate
that has it (0: none). `assemble`, after any further rounds, gives every query its
blocks, its metas and its top holders (`holders.match_holders`' answer, in C:
csrc/holders.c) and, where asked, its spans (`holders.spans`' answer). `match` is the
index's: all of it in ONE call, the bound-and-verify rounds included (csrc/rounds.c,
`plan.WindowPlan`'s twin), reading segments and checking locators through callbacks
into the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from sarpd.core.directory import FlatDirectory
from sarpd.core.native import MatchKernel, SegmentCacheLike
from sarpd.core.segment import Segment
from sarpd.model import IdArray, U64Array

I64Array = npt.NDArray[np.int64]

ROW_FIELDS = 12
Q, W, OFF, LEN, FSTART, FCOUNT, WEAK, FBOUND, BLO, BHI, DLO, DHI = range(ROW_FIELDS)
RES_FIELDS = 6  # a query's answer (`assemble`)
BLOCKS, META, TOP, NTOP, SPANS, NSPANS = range(RES_FIELDS)


@dataclass(frozen=True, slots=True)
class Routed:
    """One batch as the kernel routed it."""

    qids: IdArray  # every query of the batch, concatenated
    qstarts: I64Array  # where each query starts in qids
    rows: I64Array  # (R, ROW_FIELDS), by query then window
    first: U64Array  # every window's first round
    flat: FlatDirectory  # the directory the rows point into

    def bounds(self) -> I64Array:
        """Where each query's rows start, and the end: query i has rows [b[i], b[i+1])."""
        out: I64Array = self.rows[:, Q].searchsorted(np.arange(len(self.qstarts) + 1))
        return out

    def spans(self, bounds: I64Array | None = None) -> list[tuple[int, int]]:
        """Per query, its rows [lo, hi) (from `bounds()`, given or computed)."""
        return list(pairwise((self.bounds() if bounds is None else bounds).tolist()))

    def posting(self, r: int) -> Callable[[], tuple[U64Array, U64Array]]:
        """Row r's posting list (segs, filts) as `Directory.posting` gives it, built
        when called: valid while the directory is unchanged (within one match batch)."""
        blo, bhi, dlo, dhi = self.rows[r, BLO:].tolist()
        flat = self.flat

        def build() -> tuple[U64Array, U64Array]:
            if dlo == dhi:
                return flat.segs[blo:bhi], flat.filts[blo:bhi]
            rows = flat.dorder[dlo:dhi]
            return (np.concatenate([flat.segs[blo:bhi], flat.dsegs[rows]]),
                    np.concatenate([flat.filts[blo:bhi], flat.dfilts[rows]]))

        return build


def route(kernel: MatchKernel, qs: Sequence[IdArray], flat: FlatDirectory, sb: int, gap: int,
          cap: int) -> Routed:
    """Every routed window of the batch and its first round, in one kernel call."""
    lens = np.array([len(q) for q in qs], dtype=np.int64)
    qids = (np.ascontiguousarray(np.concatenate(qs), dtype=np.uint64) if len(qs)
            else np.empty((0, 2), np.uint64))
    rows, first = kernel.route(qids, lens, flat.keys, flat.segs, flat.filts, flat.dkeys,
                               flat.dsegs, flat.dfilts, flat.dorder, sb, gap, cap, flat.kfilter)
    starts = lens.cumsum() - lens
    return Routed(qids, starts, np.frombuffer(rows, np.int64).reshape(-1, ROW_FIELDS),
                  np.frombuffer(first, np.uint64), flat)


# seg ids -> each one's Segment, the kernel's view of its stored value (what the
# kernel's SegmentCache.put_values returns), or None (missing)
Read = Callable[[list[int]], Mapping[int, object]]
Indexed = Callable[[bytes], Sequence[bool]]  # 16-byte ids -> may a segment hold each?


def match(kernel: MatchKernel, qids: IdArray, lens: I64Array, flat: FlatDirectory, sb: int,
          gap: int, cap: int, read: Read, indexed: Indexed | None, ks: I64Array,
          exact: bool, cache: SegmentCacheLike | None = None,
          with_spans: I64Array | None = None
          ) -> tuple[I64Array, U64Array, U64Array, U64Array, int]:
    """A whole batch in one kernel call: `route`, one `read` of every first round (what
    `cache`, the kernel's own `SegmentCache`, holds taken from it in C), `verify`, then
    (with `exact`) the bound-and-verify rounds of `SarpIndex._exact_rounds`
    (`indexed` settles a window whose next block no segment holds; None: no block
    locators), and `assemble`'s answers: (res, meta, tops, hspans) as `assemble` gives
    them (`with_spans` as there), and the extra rounds run."""
    res, meta, tops, hspans, rounds = kernel.match(
        qids, lens, flat.keys, flat.segs, flat.filts, flat.dkeys, flat.dsegs, flat.dfilts,
        flat.dorder, sb, gap, cap, read, indexed, ks, exact, flat.kfilter, cache, with_spans)
    return (*_answers(res, meta, tops, hspans), rounds)


def verify(kernel: MatchKernel, routed: Routed, segs: Mapping[int, Segment],
           sb: int) -> tuple[I64Array, U64Array]:
    """(best run, the candidate that has it) of every row's first round, in one call."""
    best, sids = kernel.verify(routed.qids, routed.qstarts, routed.rows, routed.first,
                               segs, sb)
    return np.frombuffer(best, np.int64), np.frombuffer(sids, np.uint64)


def assemble(kernel: MatchKernel, routed: Routed, bounds: I64Array, best: I64Array,
             sids: U64Array, segs: Mapping[int, Segment], ks: I64Array,
             with_spans: I64Array | None = None
             ) -> tuple[I64Array, U64Array, U64Array, U64Array]:
    """Every query's answer in one call: (res, meta, tops, hspans), res (Q, RES_FIELDS) =
    blocks matched, meta_start, top_start, ntop, span_start, nspans; a query's metas are
    meta[meta_start : meta_start + blocks] (writable, its own slice: each block's holder
    with the longest run, holders.match_holders' answer), its top holders (ks[q] asked)
    tops[top_start : top_start + ntop], rows (holder, run), longest first, and its spans
    (with_spans[q] nonzero; None: no query asks) hspans[span_start : span_start +
    nspans], rows (holder, start, blocks), holders.spans' answer (by holder, then start).
    `bounds`: the queries' row boundaries (`Routed.bounds`)."""
    span = np.empty((len(bounds) - 1, 2), dtype=np.int64)
    span[:, 0], span[:, 1] = bounds[:-1], bounds[1:]
    return _answers(*kernel.assemble(routed.rows, span, best, sids, segs, ks, with_spans))


def _answers(res: bytes, meta: bytearray, tops: bytearray, hspans: bytearray
             ) -> tuple[I64Array, U64Array, U64Array, U64Array]:
    """The kernel's answers as arrays (`assemble`)."""
    return (np.frombuffer(res, np.int64).reshape(-1, RES_FIELDS), np.frombuffer(meta, np.uint64),
            np.frombuffer(tops, np.uint64).reshape(-1, 2),
            np.frombuffer(hspans, np.uint64).reshape(-1, 3))
