"""The block map: where a block stored recently lives, by its id, in memory (issue 24).

A serving engine names blocks by bare ids: the `parent` an insert continues, the ids a
`remove` evicts. This map answers them, block id -> (window head key, position), for
the blocks the index stored lately, within a memory budget, with no record per block
on the backend. Whatever it does not hold is on the backend as a locator record
(``B<id>``: `sarpd.core.segment.block_key`): entries the map evicts are written there
(the *spill*, in the write batch of the insert that evicted them, with its sync), and
so are the bulk importer's. So every present block is in the map or spilled: a block
found in neither is present in no segment (what `Store.indexed` answers a match).

Layout: an approximate LRU in generations. New entries go to `young` (a dict); when
it holds `generation` entries it is frozen into an array generation (sorted by a
64-bit mix of the id, searched with numpy: 33 bytes an entry); the oldest generation
goes first when the map is over its budget, its live entries spilled. A hit in a
frozen generation moves the entry back to `young` (a parent is almost always a block
stored moments ago, and one looked up stays); a removal's lookup (`peek`) moves
nothing, since its blocks are leaving. `discard` forgets blocks that no segment
holds any more. Memory: frozen arrays by their size, `young` at `YOUNG_ENTRY_BYTES`
an entry (a dict slot, a 128-bit int key and an int value, measured).

Snapshot (`to_arrays` / `load_arrays`): the live entries oldest first, saved with the
directory; entries of segments changed after a snapshot are added again at recovery.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from sarpd.model import IdArray, U64Array

__all__ = ["YOUNG_ENTRY_BYTES", "BlockMap", "MapArrays", "Spill", "block_map_generation"]

YOUNG_ENTRY_BYTES = 160  # a young entry: dict slot ~40 B, key int 44-48 B, value int ~44 B
FROZEN_ENTRY_BYTES = 33  # mix, lo, hi, head (8 B each), pos (u32: 4 B), alive (1 B)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: the high half spreads over all 64 bits


def block_map_generation(budget_bytes: int) -> int:
    """The young generation's size for a budget: at most a quarter of it, <= 65,536."""
    return max(1, min(65_536, budget_bytes // (4 * YOUNG_ENTRY_BYTES)))


def _mix(lo: U64Array, hi: U64Array) -> U64Array:
    with np.errstate(over="ignore"):
        out: U64Array = lo ^ (hi * _MIX)
    return out


@dataclass(slots=True)
class _Gen:
    """A frozen generation: entries sorted by `mix` (unique within it)."""

    mix: U64Array
    lo: U64Array
    hi: U64Array
    head: U64Array
    pos: np.ndarray  # uint32
    alive: np.ndarray  # bool
    live: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.mix) * FROZEN_ENTRY_BYTES

    def find(self, mix: U64Array, lo: U64Array, hi: U64Array) -> np.ndarray:
        """Per query: its row here, or -1."""
        if not len(self.mix):
            return np.full(len(mix), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.mix, mix), len(self.mix) - 1)
        ok = (self.mix[at] == mix) & (self.lo[at] == lo) & (self.hi[at] == hi) & self.alive[at]
        return np.where(ok, at, -1)


@dataclass(frozen=True, slots=True)
class Spill:
    """Entries evicted from the map: their locator records go to the backend."""

    ids: IdArray
    heads: U64Array
    pos: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class MapArrays:
    """The live entries, oldest first (what a snapshot holds)."""

    ids: IdArray
    heads: U64Array
    pos: np.ndarray


@dataclass(slots=True)
class MapCounts:
    hits: int = 0
    misses: int = 0
    spilled: int = 0
    discarded: int = 0


class BlockMap:
    """Block id -> (head key, position) of recently stored blocks (module doc)."""

    def __init__(self, budget_bytes: int, generation: int = 65_536) -> None:
        if budget_bytes < 0 or generation < 1:
            raise ValueError(f"BlockMap: budget_bytes {budget_bytes} and generation "
                             f"{generation} must be >= 0 and >= 1")
        self.budget_bytes = budget_bytes
        self.generation = generation
        self.young: dict[int, int] = {}  # lo | hi << 64 -> head << 32 | pos
        self.gens: list[_Gen] = []  # oldest first
        self.counts = MapCounts()
        self._frozen_live = 0
        # a lookup moves what it finds (LRU): lookups of matches running on several
        # threads at once (issue 25) take turns; changes (add, discard) are a write's
        self._lock = threading.Lock()

    # -- what others read --------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.young) + self._frozen_live

    @property
    def nbytes(self) -> int:
        return len(self.young) * YOUNG_ENTRY_BYTES + sum(g.nbytes for g in self.gens)

    def stats(self) -> dict[str, int]:
        c = self.counts
        return {"entries": len(self), "bytes": self.nbytes, "budget_bytes": self.budget_bytes,
                "generations": len(self.gens), "hits": c.hits, "misses": c.misses,
                "spilled": c.spilled, "discarded": c.discarded}

    # -- lookups -----------------------------------------------------------------------
    def lookup(self, ids: IdArray) -> tuple[U64Array, np.ndarray]:
        """(head keys, positions) of `ids` ((n, 2) internal ids); position -1: not held
        here. A hit in a frozen generation moves to the young one (LRU): until the next
        `add`, the map may hold that many entries' bytes over its budget. Safe from
        several threads at once (one at a time), not beside a change."""
        with self._lock:
            return self._lookup(ids)

    def peek(self, ids: IdArray) -> tuple[U64Array, np.ndarray]:
        """`lookup`'s answers, no hit moved (a removal's lookup: its blocks are
        leaving); only the hit and miss counts change."""
        with self._lock:
            return self._lookup(ids, refresh=False)

    def _lookup(self, ids: IdArray, refresh: bool = True) -> tuple[U64Array, np.ndarray]:
        n = len(ids)
        heads = np.zeros(n, dtype=np.uint64)
        pos = np.full(n, -1, dtype=np.int64)
        lo_l, hi_l = ids[:, 0].tolist(), ids[:, 1].tolist()
        young = self.young
        rest = []
        for i in range(n):
            v = young.get(lo_l[i] | hi_l[i] << 64)
            if v is None:
                rest.append(i)
            else:
                heads[i], pos[i] = v >> 32, v & 0xFFFFFFFF
        if rest and self.gens:
            self._lookup_frozen(ids, np.array(rest, dtype=np.int64), heads, pos, refresh)
        hits = int(np.count_nonzero(pos >= 0))
        self.counts.hits += hits
        self.counts.misses += n - hits
        return heads, pos

    def _lookup_frozen(self, ids: IdArray, rest: np.ndarray, heads: U64Array,
                       pos: np.ndarray, refresh: bool) -> None:
        lo, hi = ids[rest, 0], ids[rest, 1]
        mix = _mix(lo, hi)
        todo = np.ones(len(rest), dtype=bool)
        moved: list[tuple[int, int, int, int]] = []
        for g in reversed(self.gens):  # newest first
            rows = g.find(mix, lo, hi)
            got = todo & (rows >= 0)
            if not got.any():
                continue
            r = rows[got]
            heads[rest[got]], pos[rest[got]] = g.head[r], g.pos[r]
            todo &= ~got
            if refresh:
                moved += zip(lo[got].tolist(), hi[got].tolist(), g.head[r].tolist(),
                             g.pos[r].tolist(), strict=True)
                r = np.unique(r)  # a block asked twice in one lookup leaves once
                g.alive[r] = False
                g.live -= len(r)
                self._frozen_live -= len(r)
            if not todo.any():
                break
        if not refresh:
            return
        for a, b, h, p in moved:  # refreshed: young again
            self.young[a | b << 64] = h << 32 | p
        self.gens = [g for g in self.gens if g.live]  # emptied: nothing to spill
        self._maybe_freeze()

    # -- changes -----------------------------------------------------------------------
    def add(self, ids: IdArray, heads: U64Array | list[int], pos: np.ndarray | list[int]
            ) -> Spill | None:
        """Hold these blocks (a later entry for a block wins); returns what had to go to
        keep within the budget (their records must be written: the caller spills them)."""
        young = self.young
        for a, b, h, p in zip(ids[:, 0].tolist(), ids[:, 1].tolist(), list(heads), list(pos),
                              strict=True):
            young[a | b << 64] = int(h) << 32 | int(p)
            if len(young) >= self.generation:
                self._freeze()
        return self._evict()

    def discard(self, ids: IdArray) -> None:
        """Forget these blocks (no segment holds them any more)."""
        if not len(ids):
            return
        young = self.young
        for a, b in zip(ids[:, 0].tolist(), ids[:, 1].tolist(), strict=True):
            if young.pop(a | b << 64, None) is not None:
                self.counts.discarded += 1
        lo, hi = ids[:, 0], ids[:, 1]
        mix = _mix(lo, hi)
        for g in self.gens:
            rows = g.find(mix, lo, hi)
            r = rows[rows >= 0]
            if len(r):
                r = np.unique(r)
                g.alive[r] = False
                g.live -= len(r)
                self._frozen_live -= len(r)
                self.counts.discarded += len(r)

    def clear(self) -> None:
        self.young.clear()
        self.gens.clear()
        self._frozen_live = 0

    def _maybe_freeze(self) -> None:
        if len(self.young) >= self.generation:
            self._freeze()

    def _young_arrays(self) -> tuple[U64Array, U64Array, U64Array, np.ndarray]:
        """The young generation as arrays (lo, hi, head, pos), oldest first."""
        keys, vals = list(self.young), list(self.young.values())
        n = len(keys)
        return (np.fromiter((k & 0xFFFFFFFFFFFFFFFF for k in keys), np.uint64, n),
                np.fromiter((k >> 64 for k in keys), np.uint64, n),
                np.fromiter((v >> 32 for v in vals), np.uint64, n),
                np.fromiter((v & 0xFFFFFFFF for v in vals), np.uint32, n))

    def _freeze(self) -> None:
        """The young generation -> a frozen one."""
        if not self.young:
            return
        arrays = self._young_arrays()
        self.young.clear()  # in place: callers may hold it
        self._append(*arrays)

    def _append(self, lo: U64Array, hi: U64Array, head: U64Array, pos: np.ndarray) -> None:
        """Entries (oldest first) -> a new newest frozen generation, sorted by mix. Of
        entries with one mix, the last is kept: the same block's newer entry, or, for
        another block (2**-64 a pair), that block goes young (found first)."""
        mix = _mix(lo, hi)
        order = np.argsort(mix, kind="stable")
        mix, lo, hi, head = mix[order], lo[order], hi[order], head[order]
        pos = np.asarray(pos, dtype=np.uint32)[order]
        last = np.ones(len(mix), dtype=bool)
        last[:-1] = mix[:-1] != mix[1:]
        if not last.all():
            ends = np.flatnonzero(last)
            end = ends[np.searchsorted(ends, np.arange(len(mix)))]
            other = ~last & ((lo != lo[end]) | (hi != hi[end]))
            for i in np.flatnonzero(other).tolist():
                self.young[int(lo[i]) | int(hi[i]) << 64] = int(head[i]) << 32 | int(pos[i])
            mix, lo, hi, head, pos = mix[last], lo[last], hi[last], head[last], pos[last]
        g = _Gen(mix, lo, hi, head, pos, np.ones(len(mix), dtype=bool), len(mix))
        self.gens.append(g)
        self._frozen_live += g.live

    def add_bulk(self, ids: IdArray, heads: U64Array, pos: np.ndarray) -> Spill | None:
        """`add` of many blocks at once (recovery): frozen in generations straight from
        the arrays, no dict on the way (the young generation is frozen first, so that
        these are newer)."""
        self._freeze()
        step = self.generation
        for i in range(0, len(ids), step):
            self._append(ids[i : i + step, 0].copy(), ids[i : i + step, 1].copy(),
                         np.asarray(heads[i : i + step], dtype=np.uint64), pos[i : i + step])
        return self._evict()

    def _evict(self) -> Spill | None:
        """Drop the oldest generations while over budget; their live entries (unless a
        younger entry shadows them) are returned to be spilled."""
        self.gens = [g for g in self.gens if g.live]  # emptied: nothing to spill
        if self.nbytes <= self.budget_bytes:
            return None
        if not self.gens:  # all young: freeze first, so that something can go
            self._freeze()
        out: list[_Gen] = []
        while self.gens and self.nbytes > self.budget_bytes:
            g = self.gens.pop(0)
            self._frozen_live -= g.live
            out.append(g)
        if not out:
            return None
        parts = []
        for g in out:
            keep = g.alive.copy()
            if self.young and keep.any():
                rows = np.flatnonzero(keep)
                young = self.young
                shadow = [int(g.lo[r]) | int(g.hi[r]) << 64 in young for r in rows.tolist()]
                keep[rows[np.array(shadow, dtype=bool)]] = False
            parts.append((g, keep))
        ids = np.concatenate([np.stack([g.lo[k], g.hi[k]], axis=1) for g, k in parts])
        heads = np.concatenate([g.head[k] for g, k in parts])
        pos = np.concatenate([g.pos[k] for g, k in parts])
        self.counts.spilled += len(ids)
        return Spill(ids.astype(np.uint64), heads, pos) if len(ids) else None

    # -- snapshots ---------------------------------------------------------------------
    def to_arrays(self) -> MapArrays:
        """The live entries, oldest first."""
        los, his, heads, poss = [], [], [], []
        for g in self.gens:
            los.append(g.lo[g.alive])
            his.append(g.hi[g.alive])
            heads.append(g.head[g.alive])
            poss.append(g.pos[g.alive].astype(np.uint32))
        if self.young:
            lo, hi, head, pos = self._young_arrays()
            los.append(lo)
            his.append(hi)
            heads.append(head)
            poss.append(pos)
        if not los:
            return MapArrays(np.zeros((0, 2), np.uint64), np.zeros(0, np.uint64),
                             np.zeros(0, np.uint32))
        ids = np.stack([np.concatenate(los), np.concatenate(his)], axis=1)
        return MapArrays(ids, np.concatenate(heads), np.concatenate(poss))

    def load_arrays(self, arrays: MapArrays) -> Spill | None:
        """Start from a snapshot's entries (oldest first); what the budget cannot hold
        (a smaller budget than the snapshot's) is returned: the caller spills it."""
        self.clear()
        return self.add_bulk(arrays.ids, arrays.heads, arrays.pos)

