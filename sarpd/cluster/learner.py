"""Spotting the shared heads worth splitting (issue 27): the owner's side. Sans-I/O.

A shard sees every insert of the regions it holds (`sarpd.cluster.shardmap`: the
shard of a sequence's region takes the whole insert). An insert that matched `m`
blocks and goes on with new ones (0 < m < its length) starts a new branch after
block m-1: the prefix `ids[:m]` has one more child. `SplitLearner` counts, per such
prefix (a *candidate*, keyed by the id of its last block):

- its branches: the new branches seen start at the second (the first child is the
  chain that was there), so a candidate with `b` divergences has `b + 1` children.
  Most single divergences are a chain extended (a session's next turn after its
  last), so a prefix becomes a candidate at its second (the first are remembered in
  a bounded list);
- its traffic: the inserts since the candidate appeared that pass through it.

It proposes splitting a candidate once it has at least `children` branches AND
carries at least `hot_share / shards` of the inserts this shard applied (and at
least `min_inserts`): a fan-out inside one session (a regenerated turn) has few
branches and little traffic, a system prompt's has both. Splitting costs the head's
blocks on every other shard, so heads that carry little are left alone (measured:
docs/DECISIONS.md "Shards that spread shared heads (issue 27)").

A proposal is only a proposal: the split takes effect when its entry is applied in
the shard's log, and what the owner keeps is read from its index there, not from
these counts (they live in memory, restart from zero, and forget candidates past
`max_candidates`: a restart delays a split, never makes one wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sarpd.cluster.shardmap import MAX_HEAD_DEPTH, key_of
from sarpd.model import IdArray

__all__ = ["Proposal", "SplitLearner"]


@dataclass(frozen=True, slots=True, eq=False)
class Proposal:
    """Split the head `head` ((depth, 2) uint64 internal ids) of namespace `ns`."""

    ns: str
    head: IdArray
    branches: int  # the head's branches as counted (at least `children`)


@dataclass(slots=True)
class _Candidate:
    divergences: int
    through: int


class SplitLearner:
    def __init__(self, shards: int, *, children: int = 4, hot_share: float = 0.25,
                 min_inserts: int = 32, max_candidates: int = 65_536) -> None:
        if children < 2:
            raise ValueError(f"children: {children} is below 2 (a split needs a fan-out)")
        if not 0.0 <= hot_share <= 1.0:
            raise ValueError(f"hot_share: {hot_share} is outside 0..1")
        self.shards, self.children, self.hot_share = shards, children, hot_share
        self.min_inserts, self.max_candidates = min_inserts, max_candidates
        self.inserts = 0  # inserts observed (this shard's regions)
        self._cands: dict[int, _Candidate] = {}
        # prefixes seen diverged from once (most are a chain extended: a turn after
        # the last), oldest first: a second divergence makes one a candidate
        self._once: dict[int, None] = {}
        self._proposed: set[int] = set()
        self._lows = np.zeros(0, dtype=np.uint64)  # candidates' low words, sorted
        self._dirty = False

    def __len__(self) -> int:
        """Candidates counted (prefixes diverged from twice or more)."""
        return len(self._cands)

    def observe(self, ns: str, ids: IdArray, matched: int,
                split: frozenset[int] | set[int] = frozenset(), region_from: int = 0,
                ) -> Proposal | None:
        """One insert applied as its region's shard: `ids` its internal ids, `matched`
        the blocks it found indexed from block 0. `split`: keys of heads already split
        (never proposed again). `region_from`: where its region starts (the depth of
        the deepest split it passes, `Plan.depth`): the blocks before are inside heads,
        whose branches other shards hold, so a fan-out there (blocks of a head missing:
        removed) is not this shard's to split. Returns a split worth proposing."""
        self.inserts += 1
        self._count_through(ids)
        if not region_from < matched < len(ids) or matched > MAX_HEAD_DEPTH:
            return None
        key = key_of(ids[matched - 1])
        if key in split or key in self._proposed:
            return None
        cand = self._cands.get(key)
        if cand is None:
            if self.children > 2 and key not in self._once:
                self._once[key] = None
                if len(self._once) > 4 * self.max_candidates:
                    del self._once[next(iter(self._once))]
                return None
            seen = int(key in self._once)  # the divergence remembered
            self._once.pop(key, None)
            cand = self._cands[key] = _Candidate(seen, 1)
            self._dirty = True
            if len(self._cands) > self.max_candidates:
                self._forget()
        cand.divergences += 1
        if cand.divergences + 1 < self.children:
            return None
        if cand.through < max(self.min_inserts, self.hot_share / self.shards * self.inserts):
            return None
        self._proposed.add(key)
        del self._cands[key]
        self._dirty = True
        return Proposal(ns, ids[:matched].copy(), cand.divergences + 1)

    def declined(self, key: int) -> None:
        """A proposal of `key` was not applied (its head had a hole): it may be
        proposed again once it qualifies again."""
        self._proposed.discard(key)

    def _count_through(self, ids: IdArray) -> None:
        if not self._cands:
            return
        if self._dirty:
            self._lows = np.sort(np.fromiter((k & 0xFFFF_FFFF_FFFF_FFFF for k in self._cands),
                                             dtype=np.uint64, count=len(self._cands)))
            self._dirty = False
        look = ids[: MAX_HEAD_DEPTH]
        hit = np.nonzero(np.isin(look[:, 0], self._lows))[0]
        for pos in hit.tolist():
            cand = self._cands.get(key_of(look[pos]))
            if cand is not None:
                cand.through += 1

    def _forget(self) -> None:
        """Keep the busier half of the candidates."""
        keep = sorted(self._cands.items(), key=lambda kv: kv[1].through, reverse=True)
        self._cands = dict(keep[: self.max_candidates // 2])
        self._dirty = True
