"""The shard map in the cluster's NATS KV bucket (`route.SHARD_BUCKET`).

Keys (values are JSON; sarpd.cluster.shardmap defines them):

    shards                 the map document, written once by whoever creates the
                           cluster: a version 1 list of names, or the version 2 object
    split.<32 hex digits>  version 2: one split, named by its head's last id
                           (`Split.to_json`), created once by the head's owner
    place.<bucket>         version 2: the shard index a bucket is placed on, created
                           once by the first client that needs it
    applied.<shard>.<r>    a replica's progress report (sarpd.cluster.node)

Each table entry is created with KV `create`: when two writers race, the second gets
the first's (`record_split`, `record_placement` return what the bucket holds).
"""

from __future__ import annotations

import json
from typing import Any, cast

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from sarpd.cluster import route
from sarpd.cluster.log import LogConfigError
from sarpd.cluster.shardmap import ShardMap, Split

__all__ = [
    "bucket",
    "read_shard_map",
    "record_placement",
    "record_split",
    "recorded_split",
    "replace_shard_map",
    "write_shard_map",
]


async def write_shard_map(js: JetStreamContext, smap: ShardMap, replicas: int) -> None:
    """Store the cluster's shard map document (`route.SHARD_BUCKET` / `SHARD_KEY`: a
    version 1 list of names, or the version 2 object: `ShardMap.dumps`). Written once,
    by whoever creates the cluster: a different map over an existing one is refused (it
    would move sequences between shards: `sarpctl cluster reshard` does that offline)."""
    kv = await bucket(js, replicas)
    try:
        have = await kv.get(route.SHARD_KEY)
    except nats.js.errors.KeyNotFoundError:
        await kv.create(route.SHARD_KEY, smap.dumps())
        return
    old = ShardMap.parse(have.value)
    if (old.names, old.version, old.buckets) != (smap.names, smap.version, smap.buckets):
        raise LogConfigError(f"shard map: the cluster has {have.value!r}, not "
                             f"{smap.dumps()!r} (a shard map is fixed: changing it would "
                             "move sequences between shards; see sarpctl cluster reshard)")


async def replace_shard_map(js: JetStreamContext, old: ShardMap, new: ShardMap) -> None:
    """Replace the map document `old` by `new` (only `sarpctl cluster reshard` does:
    offline, every replica and client restarted after it). Refused when the bucket no
    longer holds `old` (someone else changed it meanwhile)."""
    kv = await js.key_value(route.SHARD_BUCKET)
    have = await kv.get(route.SHARD_KEY)
    if have.value != old.dumps() and ShardMap.parse(have.value) != old:
        raise LogConfigError(f"shard map: the cluster has {have.value!r}, not "
                             f"{old.dumps()!r}: changed meanwhile")
    try:
        await kv.update(route.SHARD_KEY, new.dumps(), last=have.revision)
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise LogConfigError("shard map: changed while it was being replaced") from exc


async def bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The cluster's KV bucket (the shard map, progress reports), created if missing."""
    try:
        return await js.key_value(route.SHARD_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(bucket=route.SHARD_BUCKET, history=1,
                                                        replicas=replicas))


async def read_shard_map(js: JetStreamContext) -> ShardMap | None:
    """The cluster's shard map with its tables (splits, placements: version 2), or None
    when none was written."""
    try:
        kv = await js.key_value(route.SHARD_BUCKET)
        entry = await kv.get(route.SHARD_KEY)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    smap = ShardMap.parse(entry.value)
    if smap.version == 1:
        return smap
    for key, raw in await _values(kv, route.PLACE_PREFIX):
        smap = smap.with_placement(int(key), int(raw))
    for _, raw in await _values(kv, route.SPLIT_PREFIX):
        smap = smap.with_split(Split.from_json(json.loads(raw), len(smap.names)))
    return smap


async def _values(kv: KeyValue, prefix: str, timeout_s: float = 5.0) -> list[tuple[str, bytes]]:
    """(key after `prefix`, value) of every key under `prefix` (one watch)."""
    watcher = await kv.watch(prefix + ">", ignore_deletes=True)
    out: list[tuple[str, bytes]] = []
    try:
        while True:
            got = cast(Any, await watcher.updates(timeout=timeout_s))  # type: ignore[no-untyped-call]
            if got is None:
                return out
            out.append((got.key[len(prefix):], got.value or b""))
            if got.delta == 0:
                return out
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


async def record_split(js: JetStreamContext, split: Split, shards: int) -> Split:
    """Record `split` in the map's table (written once: if its head was recorded
    already, the one recorded is returned)."""
    kv = await js.key_value(route.SHARD_BUCKET)
    key = f"{route.SPLIT_PREFIX}{split.last:032x}"
    try:
        await kv.create(key, json.dumps(split.to_json()).encode())
        return split
    except nats.js.errors.KeyWrongLastSequenceError:
        have = await kv.get(key)
        return Split.from_json(json.loads(have.value or b"null"), shards)


async def recorded_split(js: JetStreamContext, last: int, shards: int) -> Split | None:
    """The split of the head ending at id `last`, if the map's table has it."""
    kv = await js.key_value(route.SHARD_BUCKET)
    try:
        have = await kv.get(f"{route.SPLIT_PREFIX}{last:032x}")
    except nats.js.errors.KeyNotFoundError:
        return None
    return Split.from_json(json.loads(have.value or b"null"), shards)


async def record_placement(js: JetStreamContext, bucket: int, shard: int) -> int:
    """Place `bucket` on `shard` in the map's table, once: the shard it is on (another
    client's, when it placed the bucket first)."""
    kv = await js.key_value(route.SHARD_BUCKET)
    key = f"{route.PLACE_PREFIX}{bucket}"
    try:
        await kv.create(key, str(shard).encode())
        return shard
    except nats.js.errors.KeyWrongLastSequenceError:
        have = await kv.get(key)
        return int(have.value or b"-1")
