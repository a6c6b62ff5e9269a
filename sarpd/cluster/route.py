"""Where a cluster client sends a request: sans-I/O (no asyncio, no NATS).

The shard map (the NATS KV bucket SHARD_BUCKET, key SHARD_KEY, written once by whoever
creates the cluster: `sarpctl cluster local`, or an operator; sarpd.cluster.mapkv)
names its rule (sarpd.cluster.shardmap):

- **block0** (a JSON list of names): a request that carries a sequence from its block
  0 goes to `names[shard_of(first block id, len(names))]` (`target`);
- **heads** (version 2): a sequence request goes in `parts` (`ShardMap.plan`): a
  match to one shard, a write whole to its region's shard and, for its blocks inside
  heads, to every other shard.

Under both, a request whose block 0 the client cannot know goes to every shard
(`target` None):
- `insert` after a `parent` (its tokens continue a chain the client did not keep):
  every shard but the chain's answers `unknown_parent`, and `merge` keeps the one
  that took it;
- `remove` by bare `ids`, and `clear`: every shard, `removed` summed;
- a sequence shorter than one block matches nothing and writes nothing: shard 0.

Subjects: a replica of shard S serves requests on `request_subject(S)` in the queue
group `queue_group(S)` (NATS load-balances a group and skips replicas that are down).
A write carries WRITE_ID_HEADER, so that a client may resend it to any replica.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sarpd.cluster.shardmap import MAX_HEAD_DEPTH, Plan, ShardMap
from sarpd.core.ids import chain_ids, ns_root, salt_ids
from sarpd.core.shards import shard_of
from sarpd.errors import BadRequest, SarpError, UnknownParent
from sarpd.model import IdArray

__all__ = ["BROADCAST_OPS", "PLACE_PREFIX", "REQUEST_PREFIX", "SEQ_OPS", "SHARD_BUCKET",
           "SHARD_KEY", "SPLIT_PREFIX", "WRITE_ID_HEADER", "WRITE_OPS",
           "first_block", "head_fields", "merge", "parts", "parts_of", "queue_group",
           "request_subject", "seq_ids", "target"]

SHARD_BUCKET = "sarp"
SHARD_KEY = "shards"
# a version 2 map's tables in the bucket (sarpd.cluster.shardmap): one key per entry,
# created once (a second writer reads the first's): `split.<last id, 32 hex digits>`
# -> the split's JSON (`Split.to_json`), `place.<bucket>` -> the shard's index
SPLIT_PREFIX = "split."
PLACE_PREFIX = "place."
REQUEST_PREFIX = "sarp.req."
# a NATS request's header naming its write: a client that resends a write (its reply
# was lost) sends the same id, and the log applies it once (its duplicate window)
WRITE_ID_HEADER = "Sarp-Write-Id"
WRITE_OPS = ("insert", "remove", "clear")
SEQ_OPS = ("match", "insert", "remove", "dump")
BROADCAST_OPS = ("clear",)


def request_subject(shard: str) -> str:
    return REQUEST_PREFIX + shard


def queue_group(shard: str) -> str:
    return "sarp-" + shard


def first_block(fields: dict[str, Any], block_tokens: int) -> IdArray | None:
    """The internal id of the request's block 0 ((1, 2) uint64), from its wire fields
    (`tokens` as bin of uint32 LE, or `hashes` as bin of 16-byte ids or a list of
    uints / 16-byte ids); None when it carries less than one block."""
    return seq_ids(fields, block_tokens, 1)


def seq_ids(fields: dict[str, Any], block_tokens: int, limit: int) -> IdArray | None:
    """The internal ids ((n, 2) uint64) of the request's first `limit` blocks at most,
    from its wire fields; None when it carries less than one block."""
    ns = str(fields.get("ns", ""))
    tokens, hashes = fields.get("tokens"), fields.get("hashes")
    if tokens is not None:
        raw = bytes(tokens)[: 4 * block_tokens * limit]
        raw = raw[: len(raw) - len(raw) % (4 * block_tokens)]
        if not raw:
            return None
        return chain_ids(ns_root(ns), np.frombuffer(raw, dtype="<u4").astype(np.uint32),
                         block_tokens)
    if hashes is None:
        return None
    if isinstance(hashes, bytes | bytearray):
        raw = bytes(hashes[: 16 * limit])
        if len(raw) < 16:
            return None
        some = np.frombuffer(raw[: len(raw) - len(raw) % 16], dtype="<u8").astype(np.uint64)
        return salt_ids(ns, some.reshape(-1, 2))
    if not hashes:
        return None
    out = np.zeros((min(limit, len(hashes)), 2), dtype=np.uint64)
    for i, h in enumerate(hashes[:limit]):
        if isinstance(h, bytes | bytearray) and len(h) == 16:
            out[i] = np.frombuffer(bytes(h), dtype="<u8")
        elif isinstance(h, int) and 0 <= h < 2**64:
            out[i, 0] = h
        else:
            raise BadRequest(f"hashes[{i}]: {h!r} is not a uint below 2**64 or 16 bytes")
    return salt_ids(ns, out)


def head_fields(fields: dict[str, Any], blocks: int, block_tokens: int) -> dict[str, Any]:
    """The same request naming only its first `blocks` blocks (its sequence and, for
    an insert, its per-block metas): what a write sends every other shard for the
    blocks inside heads (`sarpd.cluster.shardmap`)."""
    out = dict(fields)
    if fields.get("tokens") is not None:
        out["tokens"] = bytes(fields["tokens"])[: 4 * block_tokens * blocks]
    hashes = fields.get("hashes")
    if hashes is not None:
        out["hashes"] = (bytes(hashes)[: 16 * blocks] if isinstance(hashes, bytes | bytearray)
                         else list(hashes)[:blocks])
    meta = fields.get("meta")
    if isinstance(meta, bytes | bytearray):
        out["meta"] = bytes(meta)[: 8 * blocks]
    elif isinstance(meta, list | tuple):
        out["meta"] = list(meta)[:blocks]
    return out


def parts(op: str, fields: dict[str, Any], smap: ShardMap, block_tokens: int
          ) -> list[tuple[int, dict[str, Any]]] | int:
    """A sequence request under a version-2 map: (shard index, fields) for each shard
    it goes to, the whole request first (its answer is the request's); or the bucket
    to place first (int: `ShardMap.plan`'s `unplaced`). A match goes to one shard; an
    insert or a removal by sequence goes whole to its region's shard and, for the
    blocks inside heads, to every other shard (whole to every shard when it lies
    inside heads)."""
    ids = seq_ids(fields, block_tokens, MAX_HEAD_DEPTH + 1)
    if ids is None:
        return [(0, fields)]
    return parts_of(op, fields, smap, block_tokens, ids, smap.plan(ids))


def parts_of(op: str, fields: dict[str, Any], smap: ShardMap, block_tokens: int,
             ids: IdArray, plan: Plan) -> list[tuple[int, dict[str, Any]]] | int:
    """`parts` for a request whose ids (its first MAX_HEAD_DEPTH + 1 at least) and
    plan are known."""
    if plan.unplaced is not None:
        return plan.unplaced
    if op not in ("insert", "remove"):
        return [(smap.read_shard(ids, plan), fields)]
    everyone = range(len(smap.names))
    if plan.target is None:
        return [(i, fields) for i in everyone]
    out = [(plan.target, fields)]
    start = int(fields.get("from") or 0) if op == "remove" else 0
    if plan.shared > start:
        head = head_fields(fields, plan.shared, block_tokens)
        out += [(i, head) for i in everyone if i != plan.target]
    return out


def target(op: str, fields: dict[str, Any], names: list[str], block_tokens: int) -> str | None:
    """The shard a request goes to, or None: every shard."""
    if op in BROADCAST_OPS:
        return None
    if op not in SEQ_OPS:
        return names[0]  # hello, ping, stats, ...: any replica answers
    if op == "insert" and fields.get("parent") is not None:
        return None
    if op == "remove" and fields.get("ids") is not None:
        return None
    ids = first_block(fields, block_tokens)
    index = shard_of(ids, len(names)) if ids is not None else None
    return names[0] if index is None else names[index]


def merge(op: str, answers: list[dict[str, Any] | SarpError]) -> dict[str, Any] | SarpError:
    """One answer from every shard's answer to a broadcast request."""
    if op == "insert":  # after a parent: the shard that has the chain took it
        took = [a for a in answers if not isinstance(a, SarpError)]
        if len(took) == 1:
            return took[0]
        errors = [a for a in answers if isinstance(a, SarpError)
                  and not isinstance(a, UnknownParent)]
        return errors[0] if errors else (took[0] if took else answers[0])
    errors = [a for a in answers if isinstance(a, SarpError)]
    if errors:
        return errors[0]
    ok = [a for a in answers if not isinstance(a, SarpError)]
    return {"removed": sum(int(a.get("removed", 0)) for a in ok)}
