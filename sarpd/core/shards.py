"""Which shard a sequence lives on (issue 15): THE rule, in one place.

A shard is chosen by the sequence's first block, as an internal id (the chained hash
of its first block's tokens from the namespace root, or its first caller id salted by
the namespace: sarpd.core.ids), so the namespace and the first block both decide it
and every match of a stored sequence goes to the shard that stored it (any match
that reuses anything shares block 0). The id's two words are already uniform
(XXH3-128), so the shard is its low word modulo the shard count: no second hash.

A sequence shorter than one block has no first block and matches nothing: it has no
shard (None), and a cluster client answers it without asking one. Writes whose
first block the sender does not know (an insert after a `parent` from a client that
did not keep the chain, a remove by bare ids) are broadcast to every shard; the
bridge knows its chains and routes them (issue 15).
"""

from __future__ import annotations

from sarpd.model import IdArray

MAX_SHARDS = 1024  # a shard is a stream and a set of replicas: far fewer in practice
# the deepest shared head a cluster splits (issue 27: sarpd.cluster.shardmap), in
# blocks: deeper prefixes are not split, and a request's `route` is at most this
MAX_HEAD_DEPTH = 4096


def check_shards(shards: int) -> None:
    """THE shard-count rule: 1..MAX_SHARDS (ValueError naming the value and limits)."""
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards: {shards} is outside 1..{MAX_SHARDS}")


def shard_of(ids: IdArray, shards: int) -> int | None:
    """The shard of a sequence given its internal ids ((n, 2) uint64, at least its
    first block), or None when it has no block."""
    check_shards(shards)
    if len(ids) == 0:
        return None
    return int(ids[0, 0]) % shards
