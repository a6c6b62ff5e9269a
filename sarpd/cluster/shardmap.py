"""The shard map and its rule: which shard a sequence lives on (issue 27). Sans-I/O.

Two rules, named by the map's version (the NATS KV bucket `sarp`, key `shards`):

- **v1, `block0`** (issue 15): the map is a JSON list of shard names; a sequence lives
  on `names[low word of block 0's internal id % len(names)]` (`sarpd.core.shards`).
  A shared system prompt puts every request on one shard.
- **v2, `heads`**: the map is a JSON object

      {"version": 2, "rule": "heads", "shards": [names...], "buckets": V}

  and two tables that grow as traffic arrives, each entry written once (below):
  *splits* (a shared head and where its branches go) and *placements* (bucket ->
  shard). The rule, for a sequence's internal ids `ids` (THE rule: `ShardMap.plan`):

  1. Its **region** starts at block 0: region key `ids[0]`.
  2. Every split it passes moves the region down: a split is a head `H` (its `depth`
     d blocks, named by the id of its last block) whose branches fan out at block d.
     At the deepest split the sequence passes and goes beyond (`ids[d-1] == H's last
     id` and `len(ids) > d`), the region key is the branch, `ids[d]`.
  3. A branch the split's owner already held when the split was made (`kept`) stays
     on that shard (`owner`). Any other region key goes through its bucket
     (`low word % V`) to the shard `placements[bucket]`; a bucket with no
     placement yet is placed once, on the shard with the fewest placements and kept
     branches (`least_loaded`), and the placement is recorded before use.
  4. Every block inside a split's head (`shared`: the longest prefix of `ids` that
     lies in heads) is on EVERY shard, with the same holders: a write sends that
     prefix to every shard and the whole sequence to its region's shard. A sequence
     that lies wholly inside heads has no region (`target` None): a write goes to
     every shard, and any shard answers a read (`read_shard` spreads them).

  Why it is exact: two sequences that share a block past every head they pass share
  the block that fixed their region, so they live on one shard; blocks they share
  inside heads are on every shard, complete. Measurements and the alternatives:
  docs/DECISIONS.md "Shards that spread shared heads (issue 27)".

Keys: an internal id as one int, `lo | hi << 64` (`key_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sarpd.core.shards import MAX_HEAD_DEPTH, check_shards
from sarpd.errors import BadRequest
from sarpd.model import IdArray

__all__ = ["DEFAULT_BUCKETS", "MAX_HEAD_DEPTH", "RULES", "Plan", "ShardMap", "Split",
           "check_names", "key_of", "keys_of"]

RULES = {1: "block0", 2: "heads"}
DEFAULT_BUCKETS = 4096
MAX_BUCKETS = 1 << 20


def key_of(row: IdArray) -> int:
    """One internal id ((2,) uint64: lo, hi) as an int."""
    return int(row[0]) | int(row[1]) << 64


def keys_of(ids: IdArray) -> list[int]:
    return [int(lo) | int(hi) << 64 for lo, hi in ids.tolist()]


@dataclass(frozen=True, slots=True)
class Split:
    """A shared head whose branches are spread: recorded once by its owner."""

    head: tuple[int, ...]  # the head's ids (keys), block 0 first: `depth` of them
    owner: int  # the shard that held the head's region when it was split
    kept: frozenset[int]  # the branches (ids at position depth) the owner keeps
    seeds: Mapping[str, int] = field(default_factory=dict)  # shard -> log seq of its head copy
    at: int = 0  # the owner's log seq of the split's entry (0: made outside a log)

    @property
    def depth(self) -> int:
        return len(self.head)

    @property
    def last(self) -> int:
        return self.head[-1]

    def to_json(self) -> dict[str, object]:
        return {"head": [f"{k:032x}" for k in self.head], "owner": self.owner,
                "kept": sorted(f"{k:032x}" for k in self.kept), "seeds": dict(self.seeds),
                "at": self.at}

    @staticmethod
    def from_json(doc: object, shards: int) -> Split:
        if not isinstance(doc, dict):
            raise BadRequest(f"split: {doc!r} is not an object")
        try:
            head = tuple(int(h, 16) for h in doc["head"])
            kept = frozenset(int(h, 16) for h in doc["kept"])
            owner, seeds, at = doc["owner"], doc.get("seeds", {}), doc.get("at", 0)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRequest(f"split: {exc!r} in {str(doc)[:200]}") from exc
        if not 1 <= len(head) <= MAX_HEAD_DEPTH:
            raise BadRequest(f"split head: {len(head)} blocks is outside 1..{MAX_HEAD_DEPTH}")
        if type(owner) is not int or not 0 <= owner < shards:
            raise BadRequest(f"split owner: {owner!r} is not a shard index below {shards}")
        if not isinstance(seeds, dict) or not all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in seeds.items()):
            raise BadRequest(f"split seeds: {seeds!r} is not a map of shard -> seq")
        if type(at) is not int or at < 0:
            raise BadRequest(f"split at: {at!r} is not a log sequence")
        return Split(head, owner, kept, dict(seeds), at)


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one sequence's requests go (`ShardMap.plan`)."""

    target: int | None  # the region's shard (None: the sequence lies inside heads)
    depth: int  # the depth of the deepest split it passes and goes beyond (0: none)
    shared: int  # its leading blocks inside heads: written to every shard
    unplaced: int | None = None  # the region's bucket, not placed yet (target None)


@dataclass(frozen=True, slots=True)
class ShardMap:
    """One version of a cluster's shard map. Immutable: a change is a new map
    (`with_split`, `with_placement`), so a client swaps one reference."""

    names: tuple[str, ...]
    version: int = 1
    buckets: int = DEFAULT_BUCKETS
    splits: Mapping[int, Split] = field(default_factory=dict)  # last id -> split
    placements: Mapping[int, int] = field(default_factory=dict)  # bucket -> shard
    # every id inside a split's head, with its position (derived from `splits`)
    head_blocks: Mapping[int, int] = field(default_factory=dict)

    @property
    def rule(self) -> str:
        return RULES[self.version]

    @staticmethod
    def parse(raw: bytes | str | None) -> ShardMap:
        """A map as stored under the key `shards`: a v1 list or a v2 object."""
        try:
            doc = json.loads(raw or b"null")
        except ValueError as exc:
            raise BadRequest(f"shard map: not JSON ({exc})") from exc
        if isinstance(doc, list):
            return ShardMap(check_names(doc))
        if not isinstance(doc, dict) or doc.get("version") != 2 or doc.get("rule") != "heads":
            raise BadRequest(f"shard map: {str(doc)[:200]} is neither a list of shard "
                             "names (version 1) nor {\"version\": 2, \"rule\": \"heads\", ...}")
        buckets = doc.get("buckets", DEFAULT_BUCKETS)
        if type(buckets) is not int or not 1 <= buckets <= MAX_BUCKETS:
            raise BadRequest(f"shard map buckets: {buckets!r} is outside 1..{MAX_BUCKETS}")
        return ShardMap(check_names(doc.get("shards")), 2, buckets)

    def dumps(self) -> bytes:
        """The document stored under `shards` (the tables are stored apart)."""
        if self.version == 1:
            return json.dumps(list(self.names)).encode()
        return json.dumps({"version": 2, "rule": "heads", "shards": list(self.names),
                           "buckets": self.buckets}).encode()

    # -- the tables ------------------------------------------------------------------
    def with_split(self, split: Split) -> ShardMap:
        """This map and one more split (a split already recorded is kept as it is)."""
        if self.version == 1:
            raise BadRequest("shard map: a version 1 map (rule block0) has no splits")
        if split.last in self.splits:
            return self
        if split.owner >= len(self.names):
            raise BadRequest(f"split owner: {split.owner} is not a shard index below "
                             f"{len(self.names)}")
        blocks = dict(self.head_blocks)
        for pos, key in enumerate(split.head):
            blocks.setdefault(key, pos)
        return replace(self, splits={**self.splits, split.last: split}, head_blocks=blocks)

    def with_placement(self, bucket: int, shard: int) -> ShardMap:
        """This map with `bucket` placed on `shard` (a placed bucket keeps its shard)."""
        if bucket in self.placements:
            return self
        if not 0 <= bucket < self.buckets or not 0 <= shard < len(self.names):
            raise BadRequest(f"placement: bucket {bucket} (of {self.buckets}) -> shard "
                             f"{shard} (of {len(self.names)}) is out of range")
        return replace(self, placements={**self.placements, bucket: shard})

    def load(self) -> list[int]:
        """Per shard: the buckets placed on it plus the branches splits kept there."""
        out = [0] * len(self.names)
        for shard in self.placements.values():
            out[shard] += 1
        for split in self.splits.values():
            out[split.owner] += len(split.kept)
        return out

    def least_loaded(self) -> int:
        """Where a new bucket goes: the shard with the least `load` (lowest index on a
        tie)."""
        load = self.load()
        return min(range(len(load)), key=lambda i: (load[i], i))

    def bucket_of(self, key: int) -> int:
        return (key & 0xFFFF_FFFF_FFFF_FFFF) % self.buckets

    # -- the rule --------------------------------------------------------------------
    def plan(self, ids: IdArray) -> Plan:
        """THE rule: where a sequence with these internal ids ((n, 2) uint64, n >= 1)
        lives, and which of its blocks every shard holds."""
        n = len(ids)
        if n == 0:
            raise BadRequest("plan: a sequence of no block has no shard")
        if self.version == 1:
            return Plan(int(ids[0, 0]) % len(self.names), 0, 0)
        region, depth, shared = key_of(ids[0]), 0, 0
        if self.head_blocks:
            blocks, splits = self.head_blocks, self.splits
            kept_by: Split | None = None
            for pos in range(min(n, MAX_HEAD_DEPTH + 1)):  # only while inside heads
                key = int(ids[pos, 0]) | int(ids[pos, 1]) << 64
                if blocks.get(key) != pos:
                    break
                shared = pos + 1
                split = splits.get(key)
                if split is not None and pos + 1 < n:
                    depth, kept_by = pos + 1, split
            if kept_by is not None:
                region = key_of(ids[depth])
                if region in kept_by.kept:
                    return Plan(kept_by.owner, depth, shared)
        if shared == n:
            return Plan(None, depth, shared)
        bucket = self.bucket_of(region)
        shard = self.placements.get(bucket)
        if shard is None:
            return Plan(None, depth, shared, unplaced=bucket)
        return Plan(shard, depth, shared)

    def read_shard(self, ids: IdArray, plan: Plan) -> int:
        """The shard a read goes to: its region's, or for a sequence inside heads one
        spread by its last block (every shard holds it)."""
        if plan.target is not None:
            return plan.target
        return int(ids[-1, 0]) % len(self.names)


def check_names(names: object) -> tuple[str, ...]:
    """A list of shard names as a map holds them: non-empty, distinct, 1..MAX_SHARDS."""
    if (not isinstance(names, list) or not names
            or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names)):
        raise BadRequest(f"shard map: {names!r} is not a list of distinct shard names")
    try:
        check_shards(len(names))
    except ValueError as exc:
        raise BadRequest(f"shard map: {exc}") from exc
    return tuple(names)
