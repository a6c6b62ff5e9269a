"""`sarpctl cluster reshard`: a cluster of rule block0 (shard map version 1) moved to
rule heads (version 2), offline, from its shards' checkpoints (issue 27).

Under block0 a sequence lives on shard `low word of block 0 % n`. Under heads its
region (with no split yet: its block 0) goes through its bucket, `low word % B`, to a
placement. The reshard picks B = n * floor(4096 / n), a multiple of n, so that
`bucket % n` is the block0 shard of every sequence in the bucket, and places every
bucket that holds a sequence's block 0 on that shard. Then no stored block moves:
each shard keeps its data, every stored sequence is found where it was, and the
buckets no stored sequence uses stay unplaced, for new sequences to be placed
least-loaded.

What it needs and checks, shard by shard (nothing is written until all pass):
- the shard's newest published checkpoint holds its whole log (its sequence is the
  log's last): writes have stopped and a checkpoint was taken after the last one;
- the checkpoint's chains start on this shard under block0 (its data is a block0
  shard's);
- every block at a window start has a branch link (`[index] branch_links`, on in
  every replica since issue 27): a split at such a block must list the branches
  after it, and only the links record them. Data written by replicas older than
  that lacks them: the reshard refuses it (rebuild the cluster by replaying the
  traffic, or stay on block0).

Then the placements are recorded and the map document is replaced (the one place a
map changes): every replica and client must start again to read it.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from nats.js import JetStreamContext

from backends.registry import backend_names, cache_floor
from sarpd.cluster import checkpoints, log, mapkv
from sarpd.cluster.shardmap import DEFAULT_BUCKETS, ShardMap
from sarpd.config import IndexConfig
from sarpd.core import ChainStarts, SarpIndex, chain_starts, data_paths, open_backend
from sarpd.errors import ConfigError
from sarpd.model import IdArray

__all__ = ["ReshardReport", "ShardScan", "heads_map", "reshard"]

Progress = Callable[[str, int], None]  # (shard, segments read so far)
SCAN_CACHE_BYTES = 64 << 20  # the backend's cache while a checkpoint is scanned


@dataclass(frozen=True, slots=True)
class ShardScan:
    shard: str
    seq: int  # the checkpoint's (= the log's last) sequence
    chains: int  # distinct block-0 ids in it
    window_starts: int
    unlinked: int


@dataclass(frozen=True, slots=True)
class ReshardReport:
    shards: list[ShardScan]
    buckets: int
    placed: int  # buckets placed (those holding a stored sequence's block 0)


def heads_map(names: tuple[str, ...], firsts: dict[str, IdArray]) -> ShardMap:
    """The version 2 map that keeps every stored sequence on its block0 shard:
    `firsts` maps each shard to the internal block-0 ids it holds."""
    n = len(names)
    smap = ShardMap(names, 2, n * (DEFAULT_BUCKETS // n))
    for index, name in enumerate(names):
        for lo in firsts.get(name, ()):
            if int(lo[0]) % n != index:
                raise ConfigError(f"reshard: shard {name} holds a chain whose block 0 is "
                                  f"shard {names[int(lo[0]) % n]}'s under rule block0: "
                                  "not a block0 cluster's data")
            smap = smap.with_placement(smap.bucket_of(int(lo[0])), index)
    return smap


async def reshard(js: JetStreamContext, progress: Progress | None = None,
                  work_dir: Path | None = None) -> ReshardReport:
    """Move the cluster behind `js` to rule heads (see the module docstring)."""
    smap = await mapkv.read_shard_map(js)
    if smap is None:
        raise ConfigError("reshard: the cluster has no shard map")
    if smap.version != 1:
        raise ConfigError(f"reshard: the cluster's rule is already {smap.rule}")
    scans, firsts = [], {}
    for shard in smap.names:
        scan, ids = await _scan(js, shard, progress, work_dir)
        scans.append(scan)
        firsts[shard] = ids
    new = heads_map(smap.names, firsts)
    # the placements first: a version 1 map ignores them, so a reshard stopped half-way
    # leaves the cluster as it was, and running it again finds them recorded
    for bucket, where in sorted(new.placements.items()):
        got = await mapkv.record_placement(js, bucket, where)
        if got != where:
            raise ConfigError(f"reshard: bucket {bucket} is placed on shard {got}, not "
                              f"{where} (a placement left by another reshard of other data?)")
    await mapkv.replace_shard_map(js, smap, new)
    return ReshardReport(scans, new.buckets, len(new.placements))


async def _scan(js: JetStreamContext, shard: str, progress: Progress | None,
                work_dir: Path | None) -> tuple[ShardScan, IdArray]:
    info = await js.stream_info(log.stream_name(shard))
    last = int(info.state.last_seq)
    with tempfile.TemporaryDirectory(prefix=f"sarp-reshard-{shard}-", dir=work_dir) as tmp:
        seq = await checkpoints.fetch_newest(js, shard, Path(tmp))
        if (seq or 0) < last:
            raise ConfigError(f"reshard: shard {shard}'s newest checkpoint is at seq "
                              f"{seq or 0}, its log at {last}: stop the writes and wait for "
                              "a checkpoint of the whole log ([cluster] "
                              "checkpoint_interval_s) before a reshard")
        if seq is None:  # an empty shard: nothing stored
            return ShardScan(shard, 0, 0, 0, 0), np.zeros((0, 2), dtype=np.uint64)
        found = await asyncio.to_thread(_open_and_scan, Path(tmp), shard, progress)
    if found.unlinked:
        raise ConfigError(
            f"reshard: shard {shard}: {found.unlinked} of its {found.window_starts} "
            "blocks at a window start have no branch link (written before replicas "
            "kept them): the heads rule could not split their heads exactly")
    return ShardScan(shard, seq, len(found.firsts), found.window_starts, 0), found.firsts


def _open_and_scan(data: Path, shard: str, progress: Progress | None) -> ChainStarts:
    """`chain_starts` of the checkpoint unpacked in `data` (whatever its backend)."""
    names = [b for b in backend_names() if data_paths(data, b)[0].exists()]
    if not names:
        raise ConfigError(f"reshard: shard {shard}'s checkpoint holds no backend's files "
                          f"(one of {', '.join(backend_names())})")
    backend = open_backend(names[0], data_paths(data, names[0])[0],
                           cache_bytes=max(SCAN_CACHE_BYTES, cache_floor(names[0])))
    try:
        index = SarpIndex(backend, IndexConfig(branch_links=True))
        return chain_starts(index, None if progress is None else partial(progress, shard))
    finally:
        backend.close()
