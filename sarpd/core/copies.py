"""Copies: which segments of a hot window can hold a block, without walking them all.

A window's copies are the segments listed under its head routing key (the low 64 bits
of its first id) that belong to that window: every branch of a session copies the head
of the segment it leaves, so a hot system prompt's window 0 has one copy per branch.
Removal, parent lookups, refills and holder adds must reach EVERY copy holding a block
(copies stay consistent, docs/DECISIONS.md "Holders"); the reference walks every
segment under the head key (`WriteTxn._walk`), O(copies) per operation. This map
answers "which of them can hold (offset, id)" in one vectorised compare.

Layout (memory only, per indexed window, keyed (window, head key)):
    sids     (rows,) int64        the window's segments in the walk's order (posting order)
    lows     (sb, rows) uint64    each one's block ids, low 64 bits (0 past its end), by
                                  offset (a target's offset is one contiguous row)
    nblocks  (rows,) int64        each one's length
    row      dict sid -> row
The candidates of a block (o, id) are the rows reaching o whose low id at o is id's,
in row order: a superset of the copies holding the block, in the order the walk meets
them (the caller checks the full id and presence, as the walk does).

Kept exact (the rows are the walk's segments, in its order):
- built from a full walk of the posting list (`build`, after the walk read them all);
- grown by the writer wherever it creates a segment (a new last row: its head entry is
  appended last to the posting list) or extends one (its new columns) (`note`). The
  writer never cuts or deletes a segment and a segment's ids never change otherwise;
- one owner, the store; a write transaction opens the map (`begin`) and its commit
  closes it (`end`) once the batch is durable. A transaction that did not commit leaves
  it open and the next `begin` drops every window: the map is never ahead of the
  backend. Dropped whole too when the directory is rebuilt other than by the writer
  (`Store.reset` on reload, `Store.forget_segments` in `check --fix`, recovery).
Bounded: only windows with more than `min_copies` segments (below that the walk is
cheap), at most `max_rows` rows over all windows, the least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sarpd.core.segment import Segment
from sarpd.model import U64Array

MIN_COPIES = 32  # a window with this many segments or fewer is walked (a few reads)
# rows over all windows: the hot windows of a large fleet (a few system prompts, tens of
# thousands of branches); 32 MiB of ids at 64-block segments, dropped LRU past it
MAX_ROWS = 65_536

I64Array = npt.NDArray[np.int64]


class _Window:
    __slots__ = ("lows", "n", "nblocks", "row", "sids")

    def __init__(self, sb: int, cap: int) -> None:
        self.sids: I64Array = np.zeros(cap, dtype=np.int64)
        self.lows: U64Array = np.zeros((sb, cap), dtype=np.uint64)
        self.nblocks: I64Array = np.zeros(cap, dtype=np.int64)
        self.row: dict[int, int] = {}
        self.n = 0

    def add(self, seg: Segment) -> int:
        """A row for `seg` (last), or its new columns if it has one; rows added."""
        r = self.row.get(seg.seg_id)
        if r is not None:
            old, new = int(self.nblocks[r]), seg.nblocks
            self.lows[old:new, r] = seg.ids[old:new, 0]
            self.nblocks[r] = new
            return 0
        if self.n == len(self.sids):
            cap = 2 * self.n
            self.sids = np.resize(self.sids, cap)
            self.nblocks = np.resize(self.nblocks, cap)
            lows = np.zeros((self.lows.shape[0], cap), dtype=np.uint64)
            lows[:, : self.n] = self.lows[:, : self.n]
            self.lows = lows
        r = self.row[seg.seg_id] = self.n
        self.sids[r] = seg.seg_id
        self.lows[: seg.nblocks, r] = seg.ids[:, 0]
        self.nblocks[r] = seg.nblocks
        self.n += 1
        return 1

    def candidates(self, offs: I64Array, lows: U64Array) -> list[int]:
        n = self.n
        if len(offs) == 1:  # a parent's block: one row of the table (~7 us, not ~11,
            # over a window of 222 copies)
            o = int(offs[0])
            one = (self.lows[o, :n] == lows[0]) & (self.nblocks[:n] > o)
            out: list[int] = self.sids[:n][one].tolist()
            return out
        hit = (self.lows[offs, :n] == lows[:, None]) & (self.nblocks[:n] > offs[:, None])
        out = self.sids[:n][hit.any(axis=0)].tolist()
        return out

    @property
    def nbytes(self) -> int:
        return self.sids.nbytes + self.lows.nbytes + self.nblocks.nbytes


class Copies:
    """The map of hot windows' copies (module docstring); the store owns one."""

    def __init__(self, sb: int, min_copies: int = MIN_COPIES, max_rows: int = MAX_ROWS) -> None:
        self.sb, self.min_copies, self.max_rows = sb, min_copies, max_rows
        self._windows: OrderedDict[tuple[int, int], _Window] = OrderedDict()
        self.rows = 0
        self.answered = 0  # lookups answered from the map (not walked)
        self._open = False  # a transaction may have changed the map and not committed

    # -- transactions ------------------------------------------------------------------
    def begin(self) -> None:
        """A write transaction starts: a map the last one left open is dropped."""
        if self._open:
            self.clear()
        self._open = True

    def end(self) -> None:
        """The transaction's batch is durable: the map matches the backend."""
        self._open = False

    def clear(self) -> None:
        self._windows.clear()
        self.rows = 0

    # -- reading -----------------------------------------------------------------------
    def lookup(self, w: int, head_key: int, offs: I64Array, lows: U64Array) -> list[int] | None:
        """The segments of window w under `head_key` that can hold any target block
        (offsets `offs`, ids whose low words are `lows`), in the walk's order; None
        when the window is not indexed (walk it)."""
        win = self._windows.get((w, head_key))
        if win is None:
            return None
        self._windows.move_to_end((w, head_key))
        self.answered += 1
        return win.candidates(offs, lows)

    def indexed(self, w: int, head_key: int) -> bool:
        """Whether window w under `head_key` is indexed (`lookup` answers it)."""
        return (w, head_key) in self._windows

    # -- keeping it ----------------------------------------------------------------------
    def build(self, w: int, head_key: int, segs: Sequence[Segment]) -> None:
        """Index window w from a full walk: `segs` are the segments it met, in order."""
        if len(segs) <= self.min_copies or len(segs) > self.max_rows:
            return
        key = (w, head_key)
        old = self._windows.pop(key, None)
        if old is not None:
            self.rows -= len(old.row)
        win = _Window(self.sb, max(64, 2 * len(segs)))
        for seg in segs:
            self.rows += win.add(seg)
        self._windows[key] = win
        self._bound(key)

    def note(self, seg: Segment) -> None:
        """The writer created or extended `seg`: its window's rows follow."""
        key = (seg.window, int(seg.ids[0, 0]))
        win = self._windows.get(key)
        if win is not None:
            self.rows += win.add(seg)
            self._bound(key)

    def _bound(self, keep: tuple[int, int]) -> None:
        while self.rows > self.max_rows and self._windows:
            key, win = next(iter(self._windows.items()))
            if key == keep and len(self._windows) > 1:
                self._windows.move_to_end(key)
                continue
            del self._windows[key]
            self.rows -= len(win.row)

    # -- stats -------------------------------------------------------------------------
    @property
    def windows(self) -> int:
        return len(self._windows)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self._windows.values())
