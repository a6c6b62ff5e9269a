"""A replica's link to its cluster: the NATS connection, its shard's stream, the
applier (`Replica`), the catch-up a start does before it serves, its progress
reports and the cluster's status (the shard map in the KV bucket: sarpd.cluster.mapkv)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from sarpd.cluster import checkpoints, log, route
from sarpd.cluster.log import LogConfigError
from sarpd.cluster.mapkv import bucket, read_shard_map
from sarpd.cluster.replica import WRITE_KINDS, Replica, Runner
from sarpd.config import ClusterConfig
from sarpd.core import SarpIndex
from sarpd.model import CheckpointResult
from sarpd.protocol.requests import Limits

__all__ = ["CHECKPOINT_POLL_S", "JS_TIMEOUT_S", "REPORT_S", "SILENT_S", "ClusterNode",
           "live_floor", "progress_key", "progress_report", "read_reports", "read_status"]

logger = logging.getLogger("sarpd.cluster.node")

JS_TIMEOUT_S = 5.0  # one JetStream API call (log.retrying retries transient failures)
# how often a replica reports its applied sequence (the report's age says it is alive:
# `[cluster] trim_grace_s`, at least config.MIN_TRIM_GRACE_S, must exceed it)
REPORT_S = 1.0
SILENT_S = 10 * REPORT_S  # a replica whose last report is older is shown as not live
CHECKPOINT_POLL_S = 30.0  # how often a replica looks for its shard's newest checkpoint


def progress_key(shard: str, replica: str) -> str:
    """The KV key of a replica's progress report (`progress_report`)."""
    return f"applied.{shard}.{replica}"


def progress_report(replica: Replica, now: float) -> dict[str, float]:
    """What a replica puts under its `progress_key`, as JSON: its applied sequence, the
    report's epoch `time`, its index's `blocks` and `segments` as of that sequence,
    and what it applied from the log since its start: `entries_applied` and the
    `inserts`, `removes` and `clears` among them."""
    return {"applied_seq": replica.applied_seq, "time": now,
            "blocks": replica.size.blocks, "segments": replica.size.segments,
            "entries_applied": replica.entries_applied, **replica.applied_writes}


@dataclass(slots=True)
class ClusterNode:
    nc: NATS
    replica: Replica
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # the shard's newest published checkpoint (by any replica), as last seen
    checkpoint: checkpoints.Published | None = None

    def checkpoint_age_s(self, now: float) -> float | None:
        """Seconds since the shard's newest checkpoint was published (epoch `now`)."""
        ckpt = self.checkpoint
        return None if ckpt is None else ckpt.age_s(now)

    @classmethod
    async def start(cls, cfg: ClusterConfig, index: SarpIndex, limits: Limits,
                    run: Runner[object],
                    observe: Callable[[Sequence[float]], None] | None = None) -> ClusterNode:
        """Connect, make sure the shard's stream exists, start applying from the
        index's `applied_seq + 1`, and return once the replica applied everything the
        stream held when it started (a restarted or new replica serves caught up).
        `observe`: the replica's apply delays, per run (sarpd.cluster.replica).
        `LogGap` when the log was trimmed past the index's applied sequence."""
        nc = await log.connect(list(cfg.urls), name=f"sarpd-{cfg.shard}-{cfg.replica_id}")
        try:
            js = nc.jetstream(timeout=JS_TIMEOUT_S)
            smap = await read_shard_map(js)
            if smap is not None and cfg.shard not in smap.names:
                raise LogConfigError(f"shard {cfg.shard}: not in the cluster's shard map "
                                     f"{list(smap.names)}")
            info = await log.ensure_stream(js, cfg.shard, cfg.stream_replicas)
            replica = Replica(index, js, cfg.shard, cfg.replica_id, limits, run,
                              cfg.publish_retry_s, observe, smap)
            await replica.load_splits()
            await replica.start()
            t0, last = time.monotonic(), info.state.last_seq
            logger.info("shard %s: replica %s at seq %d, the log at %d: catching up",
                        cfg.shard, cfg.replica_id, replica.applied_seq, last)
            await replica.wait_applied(last, cfg.catch_up_timeout_s)
            logger.info("shard %s: caught up to seq %d in %.2f s", cfg.shard, last,
                        time.monotonic() - t0)
        except BaseException:
            await nc.close()
            raise
        node = cls(nc, replica)
        node.tasks.append(asyncio.create_task(node._report(js, cfg)))
        node.tasks.append(asyncio.create_task(node._watch_checkpoints(js, cfg.shard)))
        if cfg.checkpoint_interval_s > 0:
            node.tasks.append(asyncio.create_task(node._checkpoints(js, cfg, index, run)))
        return node

    async def _checkpoints(self, js: JetStreamContext, cfg: ClusterConfig,
                           index: SarpIndex, run: Runner[object]) -> None:
        """Every checkpoint_interval_s, when the applied sequence moved: publish a
        checkpoint (sarpd.cluster.checkpoints). Failures are logged, never fatal."""
        done = 0

        async def take(dest: Path) -> CheckpointResult:
            res = await run(lambda: index.checkpoint(dest))
            assert isinstance(res, CheckpointResult)
            return res

        while True:
            await asyncio.sleep(cfg.checkpoint_interval_s)
            if self.replica.applied_seq <= done:
                continue
            try:
                floor = await live_floor(js, cfg.shard, cfg.trim_grace_s)
                done = await checkpoints.publish(js, cfg.shard, cfg.stream_replicas, take,
                                                 cfg.checkpoint_keep, floor)
                self.checkpoint = checkpoints.Published(done, time.time())
            except Exception as exc:
                logger.warning("shard %s: publishing a checkpoint failed: %s", cfg.shard, exc)

    async def _watch_checkpoints(self, js: JetStreamContext, shard: str) -> None:
        """Every CHECKPOINT_POLL_S: the shard's newest checkpoint, whoever published it
        (what the checkpoint age metric reads). Failures are logged, never fatal."""
        while True:
            try:
                newest = await checkpoints.newest(js, shard)
                mine = self.checkpoint
                if newest is not None and (mine is None or newest.seq >= mine.seq):
                    self.checkpoint = newest
            except Exception as exc:
                logger.warning("shard %s: reading the checkpoints failed: %s", shard, exc)
            await asyncio.sleep(CHECKPOINT_POLL_S)

    async def _report(self, js: JetStreamContext, cfg: ClusterConfig) -> None:
        """Put this replica's progress report (`progress_report`) into the shard map's
        bucket (what `sarpctl cluster status`, the trim's live floor and the lag
        figures read) every REPORT_S. Failures are logged, never fatal."""
        key = progress_key(cfg.shard, cfg.replica_id)
        while True:
            try:
                kv = await bucket(js, cfg.stream_replicas)
                report = progress_report(self.replica, time.time())
                await kv.put(key, json.dumps(report).encode())
            except Exception as exc:  # NATS down: the next round tries again
                logger.warning("shard %s: progress report failed: %s", cfg.shard, exc)
            await asyncio.sleep(REPORT_S)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.replica.stop()
        await self.nc.close()


async def live_floor(js: JetStreamContext, shard: str, grace_s: float) -> int | None:
    """The lowest applied sequence among the shard's replicas that reported progress
    in the last `grace_s` (None: none did)."""
    now = time.time()
    seqs = [int(rep.get("applied_seq", 0))
            for rep in (await read_reports(js, shard)).get(shard, {}).values()
            if now - float(rep.get("time", 0.0)) < grace_s]
    return min(seqs) if seqs else None


async def read_reports(js: JetStreamContext, shard: str | None = None,
                       ) -> dict[str, dict[str, dict[str, float]]]:
    """shard -> replica -> its last progress report ({"applied_seq", "time"}), of
    every shard or of `shard` alone."""
    reports: dict[str, dict[str, dict[str, float]]] = {}
    try:
        kv = await js.key_value(route.SHARD_BUCKET)
        keys = await kv.keys()
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError):
        return reports
    for key in keys:
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "applied" and shard in (None, parts[1]):
            entry = await kv.get(key)
            reports.setdefault(parts[1], {})[parts[2]] = json.loads(entry.value or b"{}")
    return reports


async def read_status(js: JetStreamContext, now: float | None = None) -> dict[str, Any]:
    """What `sarpctl cluster status` shows, from ONE read of the progress reports:
    per shard, the stream's first and last sequence and leader, the newest published
    checkpoint (its sequence and age, s), the shard's blocks and segments (`_size`),
    and each replica's report (`_replica`). At the top, the shard map and the blocks
    and segments of every shard (None while a shard's are unknown), and `silent_after_s`
    (SILENT_S: a replica whose report is older is not `live`)."""
    smap = await read_shard_map(js)
    names = [] if smap is None else list(smap.names)
    reports = await read_reports(js)
    t = time.time() if now is None else now
    shown = names or sorted(reports)
    newest = await checkpoints.newest_of(js, shown)
    shards = []
    for shard in shown:
        name = log.stream_name(shard)
        info = await log.retrying(partial(js.stream_info, name), f"stream {name}")
        last = int(info.state.last_seq)
        replicas = [_replica(r, rep, last, t) for r, rep in sorted(reports.get(shard, {}).items())]
        ckpt = newest.get(shard)
        age = None if ckpt is None else ckpt.age_s(t)
        shards.append({"shard": shard, "last_seq": last, "first_seq": int(info.state.first_seq),
                       "leader": info.cluster.leader if info.cluster else None,
                       **_size(replicas), "replicas": replicas,
                       "checkpoint": None if ckpt is None else {
                           "seq": ckpt.seq, "age_s": None if age is None else round(age, 3)}})
    return {"shard_map": names, "rule": None if smap is None else smap.rule,
            "splits": None if smap is None else len(smap.splits),
            "placements": None if smap is None else len(smap.placements),
            "silent_after_s": SILENT_S, "blocks": _total(shards, "blocks"),
            "segments": _total(shards, "segments"), "shards": shards}


def _replica(name: str, rep: dict[str, float], last: int, now: float) -> dict[str, Any]:
    """A replica's line of the status: its applied sequence, lag (sequences behind the
    log), report age (s) and whether it is `live` (reported in the last SILENT_S);
    its index's `blocks` and `segments`; and `applied`, the writes it applied from the
    log since its start (`entries`, and the `inserts`, `removes`, `clears` among
    them). None where an older replica's report does not say."""
    seq, age = int(rep.get("applied_seq", 0)), now - float(rep.get("time", 0.0))
    applied = None
    if "entries_applied" in rep:
        applied = {"entries": int(rep["entries_applied"]),
                   **{k: int(rep.get(k, 0)) for k in WRITE_KINDS}}
    return {"replica": name, "applied_seq": seq, "lag": last - seq,
            "report_age_s": round(age, 3), "live": age < SILENT_S,
            "blocks": _int_or_none(rep.get("blocks")),
            "segments": _int_or_none(rep.get("segments")), "applied": applied}


def _size(replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """A shard's blocks and segments: as reported by its replica that applied the most
    of its log (the newer report on a tie), named in `size_of` with that sequence in
    `size_seq`. Replicas at the same sequence hold the same blocks; their segments
    may differ (each cuts the log into write batches its own way)."""
    known = [r for r in replicas if r["blocks"] is not None]
    if not known:
        return {"blocks": None, "segments": None, "size_of": None, "size_seq": None}
    best = max(known, key=lambda r: (r["applied_seq"], -r["report_age_s"]))
    return {"blocks": best["blocks"], "segments": best["segments"],
            "size_of": best["replica"], "size_seq": best["applied_seq"]}


def _total(shards: list[dict[str, Any]], key: str) -> int | None:
    values = [sh[key] for sh in shards]
    return None if any(v is None for v in values) else sum(values)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)
