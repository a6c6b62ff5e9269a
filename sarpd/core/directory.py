"""The in-memory routing directory: routing key -> posting list of candidate segments.

An entry is (key, seg, filter): `key` is the low 64 bits of a block id at a routing
point, `seg` the id of a segment holding that prefix, `filter` eight 8-bit
fingerprints of the id at the end of each two-block region after the point (byte j
for the block at point + 2j + 2; 0 where the segment ends before it), which bounds how
far that candidate can match a query without reading it.

Storage is numpy, never a Python object per entry at scale:
- base: three parallel sorted arrays (keys, segs, filters); removing an entry marks
  its seg 0 (dead) in place; a posting list is a contiguous slice.
- delta: bounded flat growable arrays in insertion order plus, per key, the rows
  holding it; merged into a new base (sort the delta, insert it into the base,
  dead entries dropped, all vectorised) past `delta_max_entries`.
Not thread-safe: the index runs its batches on one thread.

This is the reference; its C twin is sarpd/core/_cdir.c (native path "dir": an index
builds its directory with `Kernels.directory`), held to the same posting lists, order,
counts, flat arrays and versions, and to the same views: where this class hands out a
view of its arrays (a base slice, a single delta row, the flat arrays), so does the
twin, and a later change writes through both alike (tests/core/test_cdir.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from sarpd.core import native
from sarpd.core.native import Kernels, MatchKernel
from sarpd.model import U64Array

DEAD = 0  # seg id 0 is never assigned


class _Delta:
    """The delta: flat growable arrays (amortised append) in insertion order, and per
    key the rows that hold it. Folding it into the base is vectorised (no per-key work
    during a merge, which pauses every request queued behind it)."""

    __slots__ = ("_match", "_order", "filts", "keys", "n", "rows", "segs")

    def __init__(self, match: MatchKernel | None, capacity: int = 64) -> None:
        self._match = match  # the kernel that merges `order` (None: numpy below)
        self.keys = np.empty(capacity, dtype=np.uint64)
        self.segs = np.empty(capacity, dtype=np.uint64)
        self.filts = np.empty(capacity, dtype=np.uint64)
        self.n = 0
        self.rows: dict[int, list[int]] = {}
        # (n, stable order of the first n keys, those keys in that order): the kernel's
        self._order: tuple[int, npt.NDArray[np.int64], U64Array] | None = None

    def sorted_keys(self) -> U64Array:
        """The keys, sorted (with repeats), for probes: the order's own keys, so a probe
        after an append merges the new rows in instead of sorting the whole delta."""
        self.order()
        assert self._order is not None
        return self._order[2]

    def order(self) -> npt.NDArray[np.int64]:
        """A stable argsort of the keys (one key's rows in insertion order) for the
        match kernel. Rows only ever append and keys never change, so the rows appended
        since the last call are sorted alone and merged in (O(n) per batch, not a sort
        of the whole delta)."""
        n = self.n
        if self._order is not None and self._order[0] == n:
            return self._order[1]
        n0, old, old_keys = self._order if self._order is not None else (0, _NO_ROWS, _EMPTY)
        k = self._match
        if k is not None:  # the same merge in one pass (_cmatch.c: merge_order)
            got, got_keys = k.merge_order(self.keys[:n], old, old_keys)
            order_c = np.frombuffer(got, np.int64)
            self._order = (n, order_c, np.frombuffer(got_keys, np.uint64))
            return order_c
        new = self.keys[n0:n].argsort(kind="stable") + n0
        new_keys = self.keys[new]
        # each new row goes after the old rows with keys <= its own (a stable merge)
        dest = old_keys.searchsorted(new_keys, "right") + np.arange(new.size)
        from_old = np.ones(n, dtype=bool)
        from_old[dest] = False
        order = np.empty(n, dtype=np.int64)
        order[dest], order[from_old] = new, old
        keys = np.empty(n, dtype=np.uint64)
        keys[dest], keys[from_old] = new_keys, old_keys
        self._order = (n, order, keys)
        return order

    def append(self, key: int, seg: int, filt: int) -> None:
        n = self.n
        if n == len(self.keys):
            self.keys = np.concatenate([self.keys, np.empty_like(self.keys)])
            self.segs = np.concatenate([self.segs, np.empty_like(self.segs)])
            self.filts = np.concatenate([self.filts, np.empty_like(self.filts)])
        self.keys[n] = key
        self.segs[n] = seg
        self.filts[n] = filt
        self.n = n + 1
        rows = self.rows.get(key)
        if rows is None:
            self.rows[key] = [n]
        else:
            rows.append(n)

    def posting(self, rows: list[int]) -> tuple[U64Array, U64Array]:
        if len(rows) == 1:
            r = rows[0]
            return self.segs[r : r + 1], self.filts[r : r + 1]
        return self.segs[rows], self.filts[rows]

    def live(self) -> tuple[U64Array, U64Array, U64Array]:
        n = self.n
        keys, segs, filts = self.keys[:n], self.segs[:n], self.filts[:n]
        mask = segs != DEAD
        if mask.all():
            return keys, segs, filts
        return keys[mask], segs[mask], filts[mask]

    @property
    def nbytes(self) -> int:
        # the arrays plus a conservative per-key overhead (dict slot, list, ints)
        return self.keys.nbytes + self.segs.nbytes + self.filts.nbytes + 120 * len(self.rows)


@dataclass(frozen=True, slots=True)
class DirectoryArrays:
    """Flat, sorted form of the whole directory (snapshots)."""

    keys: U64Array
    segs: U64Array
    filts: U64Array


_NO_FILTER = np.empty(0, dtype=np.uint64)
_NO_FILTER.flags.writeable = False


@dataclass(frozen=True, slots=True)
class FlatDirectory:
    """The base and the delta as flat arrays: a posting list is the base slice of its
    key, then the delta rows of its key in insertion order (`dorder[lo:hi]` of the
    delta's rows sorted by key, stably). `kfilter`: the C directory's key filter (a
    Bloom filter over a superset of the keys, csrc/directory.h) that lets the match
    kernel skip the searches of a key held nowhere; empty: none (the reference's)."""

    keys: U64Array
    segs: U64Array
    filts: U64Array
    dkeys: U64Array
    dsegs: U64Array
    dfilts: U64Array
    dorder: npt.NDArray[np.int64]
    kfilter: U64Array = field(default_factory=lambda: _NO_FILTER)


_EMPTY = np.empty(0, dtype=np.uint64)
_NO_ROWS = np.empty(0, dtype=np.int64)


class Directory:
    def __init__(self, delta_max_entries: int = 65536, kernels: Kernels | None = None) -> None:
        self.delta_max_entries = delta_max_entries
        self._match = (kernels or native.pick()).match
        self._keys: U64Array = _EMPTY
        self._segs: U64Array = _EMPTY
        self._filts: U64Array = _EMPTY
        self._delta = _Delta(self._match)
        self._base_dead = False
        self._rcache: dict[int, tuple[int, int]] = {}
        self.merges = 0
        # bumped by every change a reader of posting lists could see: caches derived
        # from postings (the index's candidate rankings) compare it to stay valid
        self.version = 0
        self.merge_s_max = 0.0  # the longest merge so far: a pause for every request
        self.merge_s_total = 0.0

    # -- reading ----------------------------------------------------------------
    # The base never holds dead entries for long: `drop` marks them and merges at
    # once (it is rare: `check --fix`), so a base slice is a live posting list.
    def _range(self, key: int) -> tuple[int, int]:
        r = self._rcache.get(key)
        if r is None:
            if len(self._rcache) > 200_000:
                self._rcache.clear()
            k = np.uint64(key)
            r = self._rcache[key] = (
                int(np.searchsorted(self._keys, k, "left")),
                int(np.searchsorted(self._keys, k, "right")),
            )
        return r

    def probe(self, keys: U64Array) -> npt.NDArray[np.bool_]:
        """For each key: is it in the directory? (vectorised over base and delta)"""
        lo = np.searchsorted(self._keys, keys, "left")
        hit: npt.NDArray[np.bool_] = lo < self._keys.size
        hit[hit] = self._keys[lo[hit]] == keys[hit]
        if self._delta.n:
            if keys.size <= 64:  # a few keys (an insert's window), maybe between appends
                rows = self._delta.rows
                for i, key in enumerate(keys.tolist()):
                    if not hit[i] and key in rows:
                        hit[i] = True
            else:  # a batch's lattice: the sorted delta keys (appends merged in)
                dk = self._delta.sorted_keys()
                at = np.minimum(np.searchsorted(dk, keys), dk.size - 1)
                hit |= dk[at] == keys
        return hit

    def posting(self, key: int) -> tuple[U64Array, U64Array]:
        """(segs, filters) of `key`: base slice plus delta."""
        a, b = self._range(key)
        rows = self._delta.rows.get(key)
        if rows is None:
            return self._segs[a:b], self._filts[a:b]
        ds, df = self._delta.posting(rows)
        if a == b:
            return ds, df
        return (np.concatenate([self._segs[a:b], ds]),
                np.concatenate([self._filts[a:b], df]))

    def flat(self) -> FlatDirectory:
        """The directory's flat arrays as they are now, read-only by contract (the match
        kernel's input; valid until the next change)."""
        d = self._delta
        return FlatDirectory(self._keys, self._segs, self._filts, d.keys[: d.n],
                             d.segs[: d.n], d.filts[: d.n], d.order())

    def count(self, key: int) -> int:
        a, b = self._range(key)
        rows = self._delta.rows.get(key)
        return b - a + (len(rows) if rows is not None else 0)

    def has(self, key: int, seg: int) -> bool:
        return bool((self.posting(key)[0] == np.uint64(seg)).any())

    # -- writing ----------------------------------------------------------------
    def add(self, key: int, seg: int, filt: int) -> None:
        self._delta.append(key, seg, filt)
        self.version += 1

    def _locate(self, key: int, seg: int) -> tuple[U64Array, int] | None:
        """The array (base slice or delta posting) and index holding (key, seg)."""
        s = np.uint64(seg)
        a, b = self._range(key)
        if b > a:
            hit = np.flatnonzero(self._segs[a:b] == s)
            if hit.size:
                return self._segs, a + int(hit[0])
        for r in self._delta.rows.get(key, ()):
            if self._delta.segs[r] == s:
                return self._delta.segs, r
        return None

    def set_filter(self, key: int, seg: int, filt: int) -> bool:
        """Set the filter of every (key, seg) entry; False if there is none."""
        s = np.uint64(seg)
        a, b = self._range(key)
        found = False
        if b > a:
            hit = np.flatnonzero(self._segs[a:b] == s)
            if hit.size:
                self._filts[a + hit] = np.uint64(filt)
                found = True
        for r in self._delta.rows.get(key, ()):
            if self._delta.segs[r] == s:
                self._delta.filts[r] = filt
                found = True
        self.version += found
        return found

    def drop(self, key: int, seg: int) -> bool:
        """Mark (key, seg) dead. True if it was there."""
        found = False
        while (loc := self._locate(key, seg)) is not None:
            arr, i = loc
            arr[i] = DEAD
            self._base_dead |= arr is self._segs
            found = True
        if found:
            self.merge()
        return found

    def needs_merge(self) -> bool:
        return self._delta.n > self.delta_max_entries

    def merge(self) -> None:
        """Fold the delta into a new sorted base, dropping dead entries (timed: a merge
        runs between batches and delays every request queued behind it)."""
        t0 = time.perf_counter()
        self._merge()
        took = time.perf_counter() - t0
        self.merge_s_total += took
        self.merge_s_max = max(self.merge_s_max, took)

    def _merge(self) -> None:
        self._rcache.clear()
        self.version += 1
        if self._base_dead:  # only `drop` marks base entries dead, and merges at once
            live = self._segs != DEAD
            self._keys, self._segs, self._filts = (
                self._keys[live], self._segs[live], self._filts[live])
            self._base_dead = False
        if not self._delta.n:
            return
        dk, ds, df = self._delta.live()
        order = np.argsort(dk, kind="stable")
        n, m = self._keys.size, dk.size
        # each delta entry goes after the base entries with keys <= its own (a stable
        # merge); the base fills every other slot, in order
        dest = np.searchsorted(self._keys, dk[order], "right") + np.arange(m)
        from_base = np.ones(n + m, dtype=bool)
        from_base[dest] = False
        merged = []
        for base, delta in ((self._keys, dk), (self._segs, ds), (self._filts, df)):
            out = np.empty(n + m, dtype=np.uint64)
            out[dest] = delta[order]
            out[from_base] = base
            merged.append(out)
        self._keys, self._segs, self._filts = merged
        self._delta = _Delta(self._match)
        self.merges += 1

    # -- whole-directory views ---------------------------------------------------
    def to_arrays(self) -> DirectoryArrays:
        self.merge()
        return DirectoryArrays(self._keys, self._segs, self._filts)

    def load_arrays(self, arrays: DirectoryArrays) -> None:
        """Make `arrays` the base. The directory takes them over (no copy when they are
        writable contiguous uint64, as a snapshot read gives them: at 1B blocks each
        copy of a 123 MB array cost ~0.4 s of a cold start); the caller must not use
        them afterwards."""
        self._keys, self._segs, self._filts = (
            np.require(a, np.uint64, ("C", "W"))
            for a in (arrays.keys, arrays.segs, arrays.filts))
        self._delta = _Delta(self._match)
        self._rcache = {}
        self.merge()  # a snapshot holds no dead entries; this keeps the invariant anyway

    def clear(self) -> None:
        self.load_arrays(DirectoryArrays(_EMPTY, _EMPTY, _EMPTY))

    @property
    def entries(self) -> int:
        return int(np.count_nonzero(self._segs)) + self._delta.n

    @property
    def keys_count(self) -> int:
        keys = self._keys[self._segs != DEAD]
        base = int(np.count_nonzero(np.diff(keys))) + 1 if keys.size else 0
        return base + len(self._delta.rows)

    @property
    def nbytes(self) -> int:
        base = self._keys.nbytes + self._segs.nbytes + self._filts.nbytes
        return base + self._delta.nbytes

    def iter_entries(self) -> list[tuple[int, int, int]]:
        """Every live entry (for `check`); not for the hot path."""
        arr = self.to_arrays()
        live = arr.segs != DEAD
        return list(zip(arr.keys[live].tolist(), arr.segs[live].tolist(),
                        arr.filts[live].tolist(), strict=True))
