"""Cluster mode's part of the daemon's life (issue 15): start from a checkpoint, join
the shard, and start again from a checkpoint when the log moved on without us.

- `bootstrap`: a data directory with no backend yet (a new replica) is filled with
  the shard's newest published checkpoint (sarpd.cluster.checkpoints) before the
  index opens; with none published, the replica replays the log from seq 1.
- `join`: connect, catch up with the shard's log (`ClusterNode.start`), then forward
  the socket's writes to the log (sarpd.daemon.forward) and take the requests of
  routers on other hosts (sarpd.daemon.nats_front).
- **Re-bootstrap.** The log is trimmed below its checkpoints, never past a replica
  that reported progress in the last `[cluster] trim_grace_s`. A replica that was
  down, or cut off from NATS, for longer than that can find the entries it needs
  gone (`LogGap`): at its start, or when its reader reopens while it runs. Its data
  is then consistent but old, and no replay can bring it up to date. With
  `[cluster] rebootstrap` on (the default), `join` raises `Rebootstrap` at a start,
  and `Replica.halted` says it while running; the daemon then stops serving that
  index (requests answer `unavailable` meanwhile), closes it, moves its files aside
  (`set_aside`), and starts again: bootstrap, recover, join. Nothing acknowledged is
  lost: every acknowledged write is in the log or in the checkpoint that replaced it.
  Off, the replica exits with the error (an operator empties the data directory).

The files set aside go to DATA/stale/<UTC time>/ (the backend and its directory
snapshots, as `data_paths` lays them out); only the newest such copy is kept, for an
operator to look at, since the cluster holds everything in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sarpd.cluster import checkpoints
from sarpd.cluster import log as cluster_log
from sarpd.cluster.log import LogGap
from sarpd.cluster.node import ClusterNode
from sarpd.config import ServerConfig
from sarpd.core.store import data_paths
from sarpd.daemon import sdnotify
from sarpd.daemon.forward import Forwarder
from sarpd.daemon.nats_front import NatsFront

if TYPE_CHECKING:
    from sarpd.core.index import SarpIndex
    from sarpd.daemon.server import Server

log = logging.getLogger("sarpd.daemon.cluster")

STALE_DIR = "stale"


class Rebootstrap(Exception):
    """The shard's log no longer holds what this replica must replay: set its data
    aside and start again from a checkpoint."""


async def bootstrap(cfg: ServerConfig, server: Server) -> bool:
    """A data directory without a backend yet: fetch the shard's newest checkpoint
    into it, if there is one. False (logged) when the cluster cannot be read."""
    if data_paths(cfg.data_dir, cfg.backend)[0].exists():
        return True
    c = cfg.cluster
    server.status = f"fetching shard {c.shard}'s newest checkpoint"
    try:
        async with asyncio.timeout(c.catch_up_timeout_s):
            nc = await cluster_log.connect(list(c.urls), name=f"sarpd-{c.shard}-boot")
            try:
                seq = await checkpoints.fetch_newest(nc.jetstream(timeout=30), c.shard,
                                                     cfg.data_dir)
            finally:
                await nc.close()
    except Exception as exc:
        log.error("cluster %s: cannot fetch shard %s's checkpoint: %s", ",".join(c.urls),
                  c.shard, exc)
        return False
    if seq is None:
        log.info("shard %s has no checkpoint yet: replaying its log from the start", c.shard)
    return True


async def join(cfg: ServerConfig, server: Server, index: SarpIndex,
               stop: asyncio.Event) -> tuple[ClusterNode, NatsFront] | None:
    """Catch up with the shard's log, then forward writes and take remote requests.
    None (logged) when that fails or `stop` was set; `Rebootstrap` when the log was
    trimmed past the index's applied sequence and `rebootstrap` is on."""
    c = cfg.cluster
    server.status = f"catching up with shard {c.shard}'s log"
    sdnotify.status(server.status)
    starting = asyncio.create_task(ClusterNode.start(
        c, index, server.limits, server.run_exclusive, observe=server.metrics.record_apply))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
        return None
    try:
        node = starting.result()
    except LogGap as exc:
        if c.rebootstrap:
            raise Rebootstrap(str(exc)) from exc
        log.error("shard %s: %s; rebootstrap is off: empty %s to start from a checkpoint",
                  c.shard, exc, cfg.data_dir)
        return None
    except Exception as exc:
        log.error("cluster %s: cannot join shard %s as replica %s: %s",
                  ",".join(c.urls), c.shard, c.replica_id, exc)
        return None
    server.forwarder = Forwarder(server, node, c.write_timeout_s)
    front = NatsFront(server, node.nc, c.shard)
    await front.start()
    log.info("replica %s of shard %s: applied seq %d", c.replica_id, c.shard,
             node.replica.applied_seq)
    return node, front


async def leave(server: Server, node: ClusterNode, front: NatsFront) -> None:
    """Stop taking remote requests (again: a stop did it before the server's), end the
    writes in flight, close the node."""
    await front.stop()
    forwarder = server.forwarder
    if forwarder is not None:
        await forwarder.stop()
    server.forwarder = None
    await node.stop()


def set_aside(data_dir: Path, backend: str) -> Path:
    """Move the backend's files and its directory snapshots to DATA/stale/<UTC time>/
    (removing an older set aside copy); where they went."""
    stale = data_dir / STALE_DIR
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(stale)
    dest = stale / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest.mkdir(parents=True)
    for path in data_paths(data_dir, backend):
        if path.exists():
            target = dest / path.relative_to(data_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
    log.warning("data of %s set aside in %s", data_dir, dest)
    return dest
