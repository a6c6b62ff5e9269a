"""What a replica of one shard decides about splits, in its log's order (issue 27, rule
heads). Synchronous and sans-I/O: the replica (sarpd.cluster.replica) calls it from
its applier, between the index's write batches, and does the I/O.

A replica keeps its shard's **own splits** (the heads this shard split, as applied in
its log: `own`, a version 2 `ShardMap` holding only them) and a learner
(`SplitLearner`). With them:

- **The fence** (`fence`): a request that carries `route` (the depth of the deepest
  split its sender's map has the sequence pass) was sent to this shard as the region's
  shard. If one of this shard's own splits lies deeper on that sequence, the sender's
  map is older than the split: the region moved, and the answer is `moved` (nothing
  written). Only this shard's own splits need checking: the shallowest split a sender
  does not know was made by the shard that held the region above it, which is where
  the sender's map sends it (sarpd.cluster.shardmap: placements are written once).
  A write is fenced when its log entry is applied (every replica alike, in log order);
  a match when it is served (after its `after_seq`).
- **The learner** (`observe`): inserts this shard took whole (they carry `route`)
  feed `SplitLearner`, from the region's start (`route`); a proposal becomes a split
  entry in the log (the replica publishes it) and takes effect when applied.
"""

from __future__ import annotations

from collections.abc import Callable

from sarpd.cluster.learner import Proposal, SplitLearner
from sarpd.cluster.shardmap import ShardMap, Split
from sarpd.core.shards import MAX_HEAD_DEPTH
from sarpd.errors import Moved
from sarpd.model import IdArray, Insert, InsertResult, Match, Remove, SeqSpec

__all__ = ["Owner"]

SeqIds = Callable[[SeqSpec, int], IdArray]  # a sequence's first n internal ids


class Owner:
    def __init__(self, smap: ShardMap, shard: str, seq_ids: SeqIds,
                 learner: SplitLearner | None = None) -> None:
        if smap.version != 2:
            raise ValueError(f"owner: rule {smap.rule} has no splits")
        self.me = smap.names.index(shard)
        self.shard = shard
        self.own = ShardMap(smap.names, 2, smap.buckets)
        self._seq_ids = seq_ids
        self._last: tuple[SeqSpec, IdArray] | None = None  # fence, then observe: one hash
        self.learner = learner if learner is not None else SplitLearner(len(smap.names))

    def adopt(self, split: Split) -> None:
        """A split of this shard's, applied (or recorded before this replica started)."""
        self.own = self.own.with_split(split)

    def has(self, last: int) -> bool:
        return last in self.own.splits

    def _ids(self, seq: SeqSpec) -> IdArray:
        """The ids the rule reads (the first MAX_HEAD_DEPTH + 1), of the sequence last
        asked about kept: an insert is fenced, then observed, with one hash."""
        last = self._last
        if last is not None and last[0] is seq:
            return last[1]
        ids = self._seq_ids(seq, MAX_HEAD_DEPTH + 1)
        self._last = (seq, ids)
        return ids

    def fence(self, req: Insert | Remove | Match) -> Moved | None:
        """`moved` when `req` carries a route older than one of this shard's splits."""
        if req.route is None or req.seq is None or not self.own.splits:
            return None
        ids = self._ids(req.seq)
        if len(ids) == 0:
            return None
        depth = self.own.plan(ids).depth
        if depth <= req.route:
            return None
        return Moved(f"route: depth {req.route}, but shard {self.shard} split this "
                     f"sequence's head at depth {depth}: re-read the shard map and send "
                     "it again")

    def observe(self, req: Insert, result: InsertResult) -> Proposal | None:
        """An insert this shard applied whole (it carries `route`): what the learner
        makes of it."""
        if req.route is None or req.parent is not None:
            return None
        ids = self._ids(req.seq)
        if len(ids) == 0:
            return None
        return self.learner.observe(req.seq.ns, ids, result.matched_blocks,
                                    frozenset(self.own.splits), req.route)
