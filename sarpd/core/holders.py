"""Holders of a match (protocol 2): who holds how much of the matched prefix.

A match's result is a list of windows, each a verified segment and the length L of
the match inside it (the windows of a match are aligned and start at block 0 of
their window; every window but the last is full). From them:

- `tables`: per window, every holder of the matched blocks and the mask of the
  blocks it holds there (first holders grouped by value, plus the segment's holder
  table), holders ascending;
- `runs`: each holder's run from position 0: the blocks it holds without a hole,
  from the first matched block on (0 for a holder that does not hold block 0);
- `block_meta`: for each matched block, its holder with the longest run (ties: the
  smaller meta), the `meta` a match answers;
- `top`: the K holders with the longest runs, longest first, ties by smaller meta,
  runs of 0 left out: `match ... holders: K`;
- `spans`: every holder's maximal runs inside the matched prefix, wherever they start
  (`match ... spans: true`): what a walk over tiers needs (a worker's host tier
  extending its device prefix, the indexer API's cumulative reach).

A match whose segments have no holder tables (one holder a block) answers `meta`
from the segments' first holders directly (`single_holder`), as before holders. The
cost grows with the holders of the blocks read, never with the size of the fleet.
Pure numpy over decoded segments; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sarpd.core.segment import Segment
from sarpd.model import U64Array

I64Array = npt.NDArray[np.int64]

_ONE = np.uint64(1)


@dataclass(frozen=True, slots=True)
class Table:
    """One window's holders (ascending, distinct) and the matched blocks each holds."""

    holders: U64Array
    masks: U64Array
    length: int  # matched blocks in the window


def single_holder(windows: Sequence[tuple[Segment, int]]) -> bool:
    """True when no window's segment has a holder table."""
    return all(len(seg.xmeta) == 0 for seg, _ in windows)


def table(seg: Segment, length: int) -> Table:
    """The holders of blocks [0, length) of `seg` and the blocks each holds."""
    limit = (1 << length) - 1
    present = np.uint64(seg.presence & limit)
    first, inverse = np.unique(seg.meta[:length], return_inverse=True)
    bits = _ONE << np.arange(length, dtype=np.uint64)
    masks = np.zeros(len(first), dtype=np.uint64)
    np.bitwise_or.at(masks, inverse.reshape(-1), bits)
    if len(seg.xmeta):
        both = np.concatenate([first, seg.xmeta])
        holders, inverse = np.unique(both, return_inverse=True)
        merged = np.zeros(len(holders), dtype=np.uint64)
        np.bitwise_or.at(merged, inverse.reshape(-1),
                         np.concatenate([masks, seg.xmask & np.uint64(limit)]))
        first, masks = holders, merged
    masks &= present
    keep = masks != 0
    return Table(first[keep], masks[keep], length)


def tables(windows: Sequence[tuple[Segment, int]]) -> list[Table]:
    return [table(seg, length) for seg, length in windows if length > 0]


def trailing_ones(masks: U64Array) -> I64Array:
    """Per mask, how many of its low bits are set before the first clear one (0-64)."""
    inv = ~masks
    low = inv & (~inv + _ONE)  # lowest clear bit of the mask, 0 when all 64 are set
    out = np.full(len(masks), 64, dtype=np.int64)
    some = low != 0
    out[some] = np.log2(low[some].astype(np.float64)).astype(np.int64)
    return out


def runs(tabs: Sequence[Table]) -> tuple[U64Array, I64Array]:
    """(holders, runs): every holder of the first matched block and its run from
    position 0, holders ascending."""
    if not tabs:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    t0 = tabs[0]
    start = (t0.masks & _ONE) != 0
    holders = t0.holders[start]
    total = np.zeros(len(holders), dtype=np.int64)
    alive = np.arange(len(holders))
    masks = t0.masks[start]
    for i, t in enumerate(tabs):
        if i and not len(t.holders):
            break
        if i:  # the holders still running, looked up in this window's table
            at = np.minimum(np.searchsorted(t.holders, holders[alive]), len(t.holders) - 1)
            found = t.holders[at] == holders[alive]
            alive, masks = alive[found], t.masks[at[found]]
        run = np.minimum(trailing_ones(masks), t.length)
        total[alive] += run
        full = run == t.length
        alive, masks = alive[full], masks[full]
        if not len(alive):
            break
    return holders, total


def _run_of(holders: U64Array, run: I64Array, query: U64Array) -> I64Array:
    if not len(holders):
        return np.zeros(len(query), dtype=np.int64)
    at = np.minimum(np.searchsorted(holders, query), len(holders) - 1)
    return np.where(holders[at] == query, run[at], 0)


def block_meta(tabs: Sequence[Table], holders: U64Array, run: I64Array) -> U64Array:
    """Each matched block's holder with the longest run (ties: the smaller meta)."""
    out = []
    for t in tabs:
        r = _run_of(holders, run, t.holders)
        order = np.lexsort((t.holders, -r))  # longest run first, then smaller meta
        bits = (t.masks[order, None] >> np.arange(t.length, dtype=np.uint64)) & _ONE
        out.append(t.holders[order][np.argmax(bits != 0, axis=0)])
    return np.concatenate(out) if out else np.empty(0, np.uint64)


def top(holders: U64Array, run: I64Array, k: int) -> list[tuple[int, int]]:
    """The k holders with the longest runs (longest first, ties by smaller meta)."""
    keep = run > 0
    h, r = holders[keep], run[keep]
    order = np.lexsort((h, -r))[:k]
    return list(zip(h[order].tolist(), r[order].tolist(), strict=True))


def spans(tabs: Sequence[Table]) -> list[tuple[int, int, int]]:
    """(meta, start, blocks) of every maximal run of every holder in the matched prefix
    (windows back to back: each table's blocks start where the previous ended), by meta
    then start. A run that reaches a window's end and goes on at the next window's
    start is one run."""
    runs_of: dict[int, list[list[int]]] = {}
    off = 0
    for t in tabs:
        if len(t.holders):
            at = np.arange(t.length, dtype=np.uint64)
            bits = ((t.masks[:, None] >> at) & _ONE).astype(np.int8)
            edges = np.diff(np.pad(bits, ((0, 0), (1, 1))), axis=1)
            hs, starts = np.nonzero(edges == 1)
            _, ends = np.nonzero(edges == -1)
            for h, a, b in zip(t.holders[hs].tolist(), starts.tolist(), ends.tolist(),
                               strict=True):
                mine = runs_of.setdefault(h, [])
                if a == 0 and mine and mine[-1][0] + mine[-1][1] == off:
                    mine[-1][1] += b - a
                else:
                    mine.append([off + a, b - a])
        off += t.length
    return [(h, a, n) for h in sorted(runs_of) for a, n in runs_of[h]]


def match_holders(windows: Sequence[tuple[Segment, int]], k: int
                  ) -> tuple[U64Array, list[tuple[int, int]] | None]:
    """A match's `meta` (one word per matched block) and, with k > 0, its top k
    holders. One holder a block: the segments' first holders, as before holders."""
    if single_holder(windows):
        metas = [seg.meta[:length] for seg, length in windows]
        meta = np.concatenate(metas).astype(np.uint64) if metas else np.empty(0, np.uint64)
        if not k:
            return meta, None
        if not len(meta):
            return meta, []
        other = np.flatnonzero(meta != meta[0])  # the first holder's run ends there
        return meta, [(int(meta[0]), int(other[0]) if len(other) else len(meta))]
    tabs = tables(windows)
    holders, run = runs(tabs)
    return block_meta(tabs, holders, run), (top(holders, run, k) if k else None)
