"""Checkpoints in the NATS object store: how a new replica serves in seconds (issue 15).

Bucket CKPT_BUCKET holds one object per checkpoint, named `<shard>.<applied_seq>` with
the sequence zero-padded to 20 digits so that names sort by sequence. The object is a
tar (not compressed: RocksDB's tables already are) of a data directory as
`SarpIndex.checkpoint` writes it: a directory snapshot, the backend's consistent
copy, and the applied sequence in it.

- **Publishing.** Each replica publishes every `checkpoint_interval_s` when its
  applied sequence has moved. The checkpoint is taken between batches in the worker
  thread (RocksDB: hard links, milliseconds). It is tarred and uploaded off that
  thread. The replica then keeps the newest `checkpoint_keep` of its shard and
  deletes the rest.
- **Trimming.** The stream is trimmed below the oldest kept checkpoint's sequence +
  1. Those entries are in every kept checkpoint, so no new replica would read them.
  The trim never goes past the lowest applied sequence of a replica that reported
  progress in the last `[cluster] trim_grace_s`. A replica that stays down longer
  than that, while the log moves on, finds the log trimmed (`LogGap`) and starts
  again from a checkpoint (sarpd.daemon.cluster_mode).
- **Bootstrap.** A replica whose data directory has no backend yet fetches its
  shard's newest checkpoint into the data directory before it opens the index. It
  then replays the log from that checkpoint's `applied_seq + 1`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectMeta, ObjectStoreConfig
from nats.js.object_store import ObjectStore

from sarpd.cluster import log
from sarpd.model import CheckpointResult

__all__ = ["CKPT_BUCKET", "SEQ_DIGITS", "Published", "fetch_newest", "listed", "newest",
           "newest_of", "object_name", "publish", "seq_of", "store"]

logger = logging.getLogger("sarpd.cluster.checkpoints")

CKPT_BUCKET = "sarp-ckpt"
SEQ_DIGITS = 20


def object_name(shard: str, seq: int) -> str:
    return f"{shard}.{seq:0{SEQ_DIGITS}d}"


def seq_of(name: str, shard: str) -> int | None:
    """The sequence of a checkpoint object of `shard`, None for another shard's."""
    head, _, tail = name.rpartition(".")
    if head != shard or len(tail) != SEQ_DIGITS or not tail.isdigit():
        return None
    return int(tail)


async def store(js: JetStreamContext, replicas: int) -> ObjectStore:
    try:
        return await js.object_store(CKPT_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_object_store(CKPT_BUCKET, ObjectStoreConfig(replicas=replicas))


async def _infos(obs: ObjectStore) -> list[ObjectInfo]:
    """Every object's info (transient failures retried: a store just created on a
    replicated stream answers nothing until its leader is elected)."""
    async def once() -> list[ObjectInfo]:
        try:
            return list(await obs.list(ignore_deletes=True))
        except nats.js.errors.NotFoundError:  # an empty store
            return []

    return await log.retrying(once, f"object store {CKPT_BUCKET}: list")


async def listed(obs: ObjectStore, shard: str) -> list[int]:
    """The sequences of the shard's checkpoints, oldest first."""
    return sorted(s for i in await _infos(obs) if (s := seq_of(i.name, shard)) is not None)


@dataclass(frozen=True, slots=True)
class Published:
    """A published checkpoint: its applied sequence and when it was published (epoch
    seconds, the publisher's clock; None when its description does not say)."""

    seq: int
    time: float | None

    def age_s(self, now: float) -> float | None:
        """Seconds since it was published (epoch `now`); None when unknown."""
        return None if self.time is None else max(0.0, now - self.time)


async def newest_of(js: JetStreamContext, shards: list[str]) -> dict[str, Published]:
    """Each shard's newest published checkpoint (one listing of the store; a shard
    with none is left out)."""
    try:
        obs = await js.object_store(CKPT_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return {}
    best: dict[str, tuple[int, ObjectInfo]] = {}
    for info in await _infos(obs):
        shard, _, _ = info.name.rpartition(".")
        seq = seq_of(info.name, shard) if shard in shards else None
        if seq is not None and seq > best.get(shard, (-1, info))[0]:
            best[shard] = (seq, info)
    return {shard: Published(seq, _published_time(info)) for shard, (seq, info) in best.items()}


async def newest(js: JetStreamContext, shard: str) -> Published | None:
    """The shard's newest published checkpoint (None: none, or no store yet)."""
    return (await newest_of(js, [shard])).get(shard)


def _published_time(info: ObjectInfo) -> float | None:
    try:
        return float(json.loads(info.description or "")["time"])
    except (ValueError, KeyError, TypeError):
        return None


async def publish(js: JetStreamContext, shard: str, replicas: int,
                  take: Callable[[Path], Awaitable[CheckpointResult]], keep: int,
                  live_floor: int | None) -> int:
    """Take a checkpoint (`take(dest)`: `SarpIndex.checkpoint` in the worker thread),
    upload it, keep the newest `keep` of the shard, trim the log (never past
    `live_floor`: the lowest applied sequence of a live replica); its sequence."""
    obs = await store(js, replicas)
    with tempfile.TemporaryDirectory(prefix="sarp-ckpt-") as tmp:
        data = Path(tmp) / "data"
        res = await take(data)
        archive = Path(tmp) / "ckpt.tar"
        await asyncio.to_thread(_tar, data, archive)
        with open(archive, "rb") as fh:
            await obs.put(object_name(shard, res.applied_seq), fh,
                          meta=ObjectMeta(description=json.dumps(
                              {"applied_seq": res.applied_seq, "time": time.time()})))
    seqs = await listed(obs, shard)
    for old in seqs[:-keep]:
        await obs.delete(object_name(shard, old))
    kept = seqs[-keep:]
    if kept:
        floor = kept[0] + 1 if live_floor is None else min(kept[0], live_floor) + 1
        if floor > 1:
            await log.trim_below(js, shard, floor)
    logger.info("shard %s: checkpoint at seq %d published (%d kept)", shard,
                res.applied_seq, len(kept))
    return res.applied_seq


async def fetch_newest(js: JetStreamContext, shard: str, data_dir: Path) -> int | None:
    """Unpack the shard's newest checkpoint into `data_dir` (which must hold no backend
    yet); its applied sequence, or None when the shard has none."""
    try:
        obs = await js.object_store(CKPT_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        return None
    seqs = await listed(obs, shard)
    if not seqs:
        return None
    seq = seqs[-1]
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sarp-boot-", dir=data_dir) as tmp:
        archive = Path(tmp) / "ckpt.tar"
        with open(archive, "wb") as fh:
            await obs.get(object_name(shard, seq), writeinto=fh)
        await asyncio.to_thread(_untar, archive, data_dir)
    logger.info("shard %s: started from the checkpoint at seq %d", shard, seq)
    return seq


def _tar(src: Path, archive: Path) -> None:
    with tarfile.open(archive, "w") as tar:
        for path in sorted(src.iterdir()):
            tar.add(path, arcname=path.name)


def _untar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")  # no links out, no absolute paths

