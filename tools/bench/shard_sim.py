"""A cluster in one process (issue 27): the heads rule over real indexes, no NATS.

One `SarpIndex` per shard (the memory backend, branch links on), a version-2 shard
map, and what the cluster's parts do, in order, synchronously:
- the client: `sarpd.cluster.route.parts` (a bucket placed on the least-loaded shard
  when a request needs it; a write's whole request to its region's shard, the blocks
  inside heads to every other shard), each part parsed as a replica parses a log
  entry (`sarpd.protocol.requests.parse_message`);
- the owner: `sarpd.cluster.learner.SplitLearner` on the inserts it takes whole, and
  a proposal made into a split by `sarpd.cluster.splits.prepare_split` (its kept
  branches, the head's holders written to every other shard) before the map has it.

What it is for: the skew and write amplification of `tools.bench.cluster --skew`
(requests counted where they are sent, `new_blocks` summed over shards), and the
exactness test of the rule against one index (tests/bench/test_shard_sim.py). The
log, the replicas and their failures are tests/daemon's business.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from backends.memory import MemoryBackend
from sarpd.cluster.learner import SplitLearner
from sarpd.cluster.route import parts_of, seq_ids
from sarpd.cluster.shardmap import MAX_HEAD_DEPTH, Plan, ShardMap, key_of
from sarpd.cluster.splits import prepare_split
from sarpd.config import IndexConfig
from sarpd.core import SarpIndex
from sarpd.errors import SarpError
from sarpd.model import IdArray, Insert, InsertResult, Match, MatchResult, Remove, RemoveResult
from sarpd.protocol.requests import BadMessage, Limits, parse_message

__all__ = ["Answer", "SimCluster", "apply", "distinct_blocks", "replay", "requests",
           "single_index"]

Answer = MatchResult | InsertResult | RemoveResult | SarpError


def apply(index: SarpIndex, op: str, fields: dict[str, Any], limits: Limits,
          protocol: int) -> Answer:
    """One request on one index, parsed as sarpd parses it."""
    req = parse_message({**fields, "op": op, "id": 0}, limits, protocol)
    if isinstance(req, BadMessage):
        return req.error
    if isinstance(req, Match):
        return index.match_many([req])[0]
    assert isinstance(req, Insert | Remove)
    return index.write_many([req])[0]


class SimCluster:
    def __init__(self, shards: int, *, block_tokens: int = 16,
                 learner: dict[str, Any] | None = None, smap: ShardMap | None = None,
                 ) -> None:
        cfg = IndexConfig(block_tokens=block_tokens, branch_links=True)
        self.indexes = [SarpIndex(MemoryBackend(), cfg) for _ in range(shards)]
        for ix in self.indexes:
            ix.recover()
        self.smap = smap or ShardMap(tuple(f"s{i}" for i in range(shards)), 2)
        self.learners = [SplitLearner(shards, **(learner or {})) for _ in range(shards)]
        self.block_tokens = block_tokens
        self.limits = Limits(block_tokens=block_tokens)
        self.requests = [0] * shards  # requests, each counted on the shard it is sent to
        self.new_blocks = [0] * shards
        self.declined = 0  # proposals whose head had a hole

    def request(self, op: str, fields: dict[str, Any], protocol: int = 1) -> Answer:
        """One client request (match, insert, remove by sequence): its answer."""
        ids = seq_ids(fields, self.block_tokens, MAX_HEAD_DEPTH + 1)
        if ids is None:
            self.requests[0] += 1
            return self._on(0, op, fields, protocol)
        plan = self.smap.plan(ids)
        while plan.unplaced is not None:
            self.smap = self.smap.with_placement(plan.unplaced, self.smap.least_loaded())
            plan = self.smap.plan(ids)
        got = parts_of(op, fields, self.smap, self.block_tokens, ids, plan)
        assert not isinstance(got, int)  # placed above
        self.requests[got[0][0]] += 1
        answers = [self._on(shard, op, f, protocol) for shard, f in got]
        if op == "insert" and self.smap.version == 2 and isinstance(answers[0], InsertResult):
            self._learn(str(fields.get("ns", "")), ids, plan, answers[0])
        errors = [a for a in answers if isinstance(a, SarpError)]
        return errors[0] if errors else answers[0]

    def _on(self, shard: int, op: str, fields: dict[str, Any], protocol: int) -> Answer:
        got = apply(self.indexes[shard], op, fields, self.limits, protocol)
        if isinstance(got, InsertResult):
            self.new_blocks[shard] += got.new_blocks
        return got

    def _learn(self, ns: str, ids: IdArray, plan: Plan, result: InsertResult) -> None:
        """The region's shard took an insert whole: its learner sees it; a proposal
        becomes a split (its head copied to every other shard) before the map has it.
        `ids`: the insert's first MAX_HEAD_DEPTH + 1 ids at most (all a split needs)."""
        shard = plan.target
        if shard is None:
            return
        prop = self.learners[shard].observe(ns, ids, result.matched_blocks,
                                            frozenset(self.smap.splits), plan.depth)
        if prop is None:
            return
        prepared = prepare_split(self.indexes[shard], ns, prop.head, shard)
        if prepared is None:
            self.declined += 1
            self.learners[shard].declined(key_of(prop.head[-1]))
            return
        for other, ix in enumerate(self.indexes):
            if other != shard:
                for w in ix.write_many(prepared.seed):
                    if isinstance(w, InsertResult):
                        self.new_blocks[other] += w.new_blocks
        self.smap = self.smap.with_split(prepared.split)


def requests(workload: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """A workload's turns (`tools.bench.api.Turn`) as requests (op, wire fields): match
    the prompt, insert the sequence; ids as `hashes`, the session as meta."""
    for turn in workload.turns():
        for op, raw in (("match", turn.prompt), ("insert", turn.sequence)):
            if not len(raw):
                continue
            ids = np.zeros((len(raw), 2), dtype="<u8")
            ids[:, 0] = raw
            fields: dict[str, Any] = {"ns": turn.ns, "hashes": ids.tobytes()}
            if op == "insert":
                fields["meta"] = turn.session + 1
            yield op, fields


def replay(sim: SimCluster | None, one: SarpIndex | None, workload: Any) -> tuple[int, int]:
    """A workload's `requests` through `sim` and/or `one` (a single index). Returns the
    requests and `one`'s summed `new_blocks`."""
    limits, n, new = Limits(), 0, 0
    for op, fields in requests(workload):
        if sim is not None:
            sim.request(op, fields)
        if one is not None:
            got = apply(one, op, fields, limits, 1)
            new += got.new_blocks if isinstance(got, InsertResult) else 0
        n += 1
    return n, new


def distinct_blocks(workload: Any, block_tokens: int = 16) -> tuple[int, int]:
    """The requests of `workload` and the blocks a single index would add over them,
    counted without one: its requests only insert from block 0 and never remove, so an
    index adds each distinct (namespace, chain) block once: the distinct internal ids
    (tests/bench/test_shard_sim.py checks it against `replay` on one index). For
    traces whose hot window a single index walks on every write (docs/RESULTS.md)."""
    seen: set[bytes] = set()
    n = 0
    for op, fields in requests(workload):
        n += 1
        if op == "insert":
            ids = seq_ids(fields, block_tokens, 1 << 30)
            if ids is not None:
                seen.update(ids.tobytes()[i: i + 16] for i in range(0, 16 * len(ids), 16))
    return n, len(seen)


def single_index(block_tokens: int = 16) -> SarpIndex:
    """One index as the cluster's shards are built (memory backend)."""
    ix = SarpIndex(MemoryBackend(), IndexConfig(block_tokens=block_tokens))
    ix.recover()
    return ix
