"""The in-memory routing directory: routing key -> posting list of candidate segments.

An entry is (key, seg, filter): `key` is the low 64 bits of a block id at a routing
point, `seg` the id of a segment holding that prefix, `filter` eight 8-bit
fingerprints of the id at the end of each two-block region after the point (byte j
for the block at point + 2j + 2; 0 where the segment ends before it), which bounds how
far that candidate can match a query without reading it.

Storage is numpy, never a Python object per entry at scale:
- base: three parallel sorted arrays (keys, segs, filters); removing an entry marks
  its seg 0 (dead) in place; a posting list is a contiguous slice.
- delta: a bounded dict key -> growable arrays (amortised append), merged into a new
  base (linear merge of two sorted runs, dead entries dropped) past
  `delta_max_entries`.
Not thread-safe: the index runs its batches on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sarpd.model import U64Array

DEAD = 0  # seg id 0 is never assigned


class _Posting:
    """A growable posting list (the delta's unit)."""

    __slots__ = ("filts", "n", "segs")

    def __init__(self) -> None:
        self.segs = np.empty(4, dtype=np.uint64)
        self.filts = np.empty(4, dtype=np.uint64)
        self.n = 0

    def append(self, seg: int, filt: int) -> None:
        if self.n == len(self.segs):
            self.segs = np.concatenate([self.segs, np.empty_like(self.segs)])
            self.filts = np.concatenate([self.filts, np.empty_like(self.filts)])
        self.segs[self.n] = seg
        self.filts[self.n] = filt
        self.n += 1

    def live(self) -> tuple[U64Array, U64Array]:
        segs, filts = self.segs[: self.n], self.filts[: self.n]
        mask = segs != DEAD
        if mask.all():
            return segs, filts
        return segs[mask], filts[mask]


@dataclass(frozen=True, slots=True)
class DirectoryArrays:
    """Flat, sorted form of the whole directory (snapshots)."""

    keys: U64Array
    segs: U64Array
    filts: U64Array


_EMPTY = np.empty(0, dtype=np.uint64)


class Directory:
    def __init__(self, delta_max_entries: int = 65536) -> None:
        self.delta_max_entries = delta_max_entries
        self._keys: U64Array = _EMPTY
        self._segs: U64Array = _EMPTY
        self._filts: U64Array = _EMPTY
        self._delta: dict[int, _Posting] = {}
        self._delta_entries = 0
        self._rcache: dict[int, tuple[int, int]] = {}
        self.merges = 0

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

    def probe(self, keys: U64Array) -> list[bool]:
        """For each key: is it in the directory?"""
        lo = np.searchsorted(self._keys, keys, "left")
        hi = np.searchsorted(self._keys, keys, "right")
        hit: list[bool] = (hi > lo).tolist()
        if self._delta:
            delta = self._delta
            for i, key in enumerate(keys.tolist()):
                if not hit[i] and key in delta:
                    hit[i] = True
        return hit

    def posting(self, key: int) -> tuple[U64Array, U64Array]:
        """(segs, filters) of `key`: base slice plus delta."""
        a, b = self._range(key)
        p = self._delta.get(key)
        if p is None:
            return self._segs[a:b], self._filts[a:b]
        if a == b:
            return p.segs[: p.n], p.filts[: p.n]
        return (np.concatenate([self._segs[a:b], p.segs[: p.n]]),
                np.concatenate([self._filts[a:b], p.filts[: p.n]]))

    def count(self, key: int) -> int:
        a, b = self._range(key)
        p = self._delta.get(key)
        return b - a + (p.n if p is not None else 0)

    def has(self, key: int, seg: int) -> bool:
        return bool((self.posting(key)[0] == np.uint64(seg)).any())

    # -- writing ----------------------------------------------------------------
    def add(self, key: int, seg: int, filt: int) -> None:
        p = self._delta.get(key)
        if p is None:
            p = self._delta[key] = _Posting()
        p.append(seg, filt)
        self._delta_entries += 1

    def _locate(self, key: int, seg: int) -> tuple[U64Array, int] | None:
        """The array (base slice or delta posting) and index holding (key, seg)."""
        s = np.uint64(seg)
        a, b = self._range(key)
        if b > a:
            hit = np.flatnonzero(self._segs[a:b] == s)
            if hit.size:
                return self._segs, a + int(hit[0])
        p = self._delta.get(key)
        if p is not None:
            hit = np.flatnonzero(p.segs[: p.n] == s)
            if hit.size:
                return p.segs, int(hit[0])
        return None

    def set_filter(self, key: int, seg: int, filt: int) -> bool:
        s = np.uint64(seg)
        a, b = self._range(key)
        if b > a:
            hit = np.flatnonzero(self._segs[a:b] == s)
            if hit.size:
                self._filts[a + hit] = np.uint64(filt)
                return True
        p = self._delta.get(key)
        if p is not None:
            hit = np.flatnonzero(p.segs[: p.n] == s)
            if hit.size:
                p.filts[hit] = np.uint64(filt)
                return True
        return False

    def drop(self, key: int, seg: int) -> bool:
        """Mark (key, seg) dead. True if it was there."""
        found = False
        while (loc := self._locate(key, seg)) is not None:
            arr, i = loc
            arr[i] = DEAD
            found = True
        if found:
            self.merge()
        return found

    def needs_merge(self) -> bool:
        return self._delta_entries > self.delta_max_entries

    def merge(self) -> None:
        """Fold the delta into a new sorted base, dropping dead entries."""
        self._rcache.clear()
        if not self._delta:
            live = self._segs != DEAD
            if not live.all():
                self._keys, self._segs, self._filts = (
                    self._keys[live], self._segs[live], self._filts[live],
                )
            return
        dk, ds, df = self._delta_arrays()
        order = np.argsort(dk, kind="stable")
        dk, ds, df = dk[order], ds[order], df[order]
        live = self._segs != DEAD
        bk, bs, bf = self._keys[live], self._segs[live], self._filts[live]
        pos = np.searchsorted(bk, dk, "right")
        self._keys = np.insert(bk, pos, dk)
        self._segs = np.insert(bs, pos, ds)
        self._filts = np.insert(bf, pos, df)
        self._delta = {}
        self._delta_entries = 0
        self.merges += 1

    def _delta_arrays(self) -> tuple[U64Array, U64Array, U64Array]:
        keys, segs, filts = [], [], []
        for key, p in self._delta.items():
            s, f = p.live()
            if s.size:
                keys.append(np.full(s.size, key, dtype=np.uint64))
                segs.append(s)
                filts.append(f)
        if not keys:
            return _EMPTY, _EMPTY, _EMPTY
        return np.concatenate(keys), np.concatenate(segs), np.concatenate(filts)

    # -- whole-directory views ---------------------------------------------------
    def to_arrays(self) -> DirectoryArrays:
        self.merge()
        return DirectoryArrays(self._keys, self._segs, self._filts)

    def load_arrays(self, arrays: DirectoryArrays) -> None:
        self._keys = np.array(arrays.keys, dtype=np.uint64)
        self._segs = np.array(arrays.segs, dtype=np.uint64)
        self._filts = np.array(arrays.filts, dtype=np.uint64)
        self._delta = {}
        self._delta_entries = 0
        self._rcache = {}
        self.merge()  # a snapshot holds no dead entries; this keeps the invariant anyway

    def clear(self) -> None:
        self.load_arrays(DirectoryArrays(_EMPTY, _EMPTY, _EMPTY))

    @property
    def entries(self) -> int:
        return int(np.count_nonzero(self._segs)) + self._delta_entries

    @property
    def keys_count(self) -> int:
        keys = self._keys[self._segs != DEAD]
        return (int(np.count_nonzero(np.diff(keys))) + 1 if keys.size else 0) + len(self._delta)

    @property
    def nbytes(self) -> int:
        base = self._keys.nbytes + self._segs.nbytes + self._filts.nbytes
        # delta: arrays plus a conservative per-key object overhead
        delta = sum(p.segs.nbytes + p.filts.nbytes + 200 for p in self._delta.values())
        return base + delta

    def iter_entries(self) -> list[tuple[int, int, int]]:
        """Every live entry (for `check`); not for the hot path."""
        arr = self.to_arrays()
        live = arr.segs != DEAD
        return list(zip(arr.keys[live].tolist(), arr.segs[live].tolist(),
                        arr.filts[live].tolist(), strict=True))
