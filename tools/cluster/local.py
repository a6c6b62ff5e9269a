"""A whole sarp cluster on loopback: N nats-server nodes and R sarpd replicas per shard.

`sarpctl cluster local` (the click command `local` below; `python -m
tools.cluster.local`), and what tests and benchmarks start a cluster with.
Layout under DIR: `nats/` (tools.cluster.nats_local: one config, store and log per
node), `<shard>-<replica>/` (each replica's data directory) with its log
`<shard>-<replica>.log` beside it; sockets live in a short temp directory (a Unix
socket path is at most 107 bytes). Shards are named s0, s1, ...; replicas r0, r1, ...
Each shard's stream keeps min(3, N) copies.

`start()` returns once every replica answers `ping` (it caught up with its shard's log
and serves); `describe()` is the JSON `sarpctl cluster local` prints; `kill(i)` SIGKILLs
replica i, `restart(i)` starts it again on its data; `stop()` stops the replicas
(SIGTERM: each answers what it holds, snapshots and exits), then the NATS nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from sarpd.client import SarpConnectionError, SyncClient
from sarpd.cluster import log
from sarpd.cluster.mapkv import write_shard_map
from sarpd.cluster.shardmap import RULES, ShardMap
from sarpd.ctl.common import EXIT_ERROR
from sarpd.errors import SarpError
from tools.cluster.nats_local import NatsCluster, NatsClusterError, log_tail

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


class LocalClusterError(RuntimeError):
    """A replica exited or did not get ready; the message ends with its log."""


@dataclass(slots=True)
class ReplicaProc:
    shard: str
    name: str
    data_dir: Path
    socket: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


@dataclass(slots=True)
class LocalCluster:
    directory: Path
    nats_nodes: int = 3
    replicas: int = 3  # per shard
    shards: int = 2
    backend: str = "rocksdb"
    config: Path | None = None  # a TOML file every replica reads (--config)
    rule: str = "block0"  # the shard map's rule (sarpd.cluster.shardmap.RULES)
    nats: NatsCluster | None = None
    procs: list[ReplicaProc] = field(default_factory=list)
    _sock_dir: Path | None = None

    def start(self) -> None:
        for what, n in (("nats", self.nats_nodes), ("replicas", self.replicas),
                        ("shards", self.shards)):
            if n < 1:
                raise LocalClusterError(f"{what}: {n} must be >= 1")
        if self.rule not in RULES.values():
            raise LocalClusterError(f"rule: {self.rule!r} is not one of "
                                    f"{', '.join(RULES.values())}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.nats = NatsCluster(self.directory / "nats", self.nats_nodes)
        self.nats.start()
        asyncio.run(self._write_shard_map())
        self._sock_dir = Path(tempfile.mkdtemp(prefix="sarp-cl-", dir="/tmp"))
        for s in range(self.shards):
            for r in range(self.replicas):
                name = f"s{s}-r{r}"
                self.procs.append(ReplicaProc(
                    f"s{s}", f"r{r}", self.directory / name, self._sock_dir / f"{name}.sock",
                    self.directory / f"{name}.log"))
        for i in range(len(self.procs)):
            self._spawn(i)
        for p in self.procs:
            self._wait_ready(p)

    async def _write_shard_map(self) -> None:
        assert self.nats is not None
        nc = await log.connect(self.nats.urls, name="sarpctl-cluster-local")
        try:
            version = {v: k for k, v in RULES.items()}[self.rule]
            await write_shard_map(nc.jetstream(timeout=10),
                                  ShardMap(tuple(self.shard_names), version),
                                  min(3, self.nats_nodes))
        finally:
            await nc.close()

    @property
    def shard_names(self) -> list[str]:
        return [f"s{s}" for s in range(self.shards)]

    def argv(self, p: ReplicaProc) -> list[str]:
        assert self.nats is not None
        return [sys.executable, "-m", "sarpd.daemon", "--data-dir", str(p.data_dir),
                "--socket", str(p.socket), "--backend", self.backend, "--sync", "always",
                "--cluster", ",".join(self.nats.urls), "--shard", p.shard,
                "--replica-id", p.name, "--stream-replicas", str(min(3, self.nats_nodes)),
                *(["--config", str(self.config)] if self.config is not None else [])]

    def _spawn(self, i: int) -> None:
        p = self.procs[i]
        p.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(p.log_path, "ab") as log:
            p.proc = subprocess.Popen(self.argv(p), stdout=log, stderr=subprocess.STDOUT,
                                      env=env, cwd=REPO)

    def _wait_ready(self, p: ReplicaProc, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert p.proc is not None
            if p.proc.poll() is not None:
                raise LocalClusterError(f"replica {p.shard}/{p.name} exited with "
                                        f"{p.proc.returncode}:\n{log_tail(p.log_path)}")
            with contextlib.suppress(SarpConnectionError, SarpError, OSError), \
                    SyncClient(p.socket, timeout=5) as c:
                c.ping()
                return
            time.sleep(0.05)
        raise LocalClusterError(f"replica {p.shard}/{p.name} not ready after {timeout_s:g} s:"
                                f"\n{log_tail(p.log_path)}")

    def describe(self) -> dict[str, object]:
        assert self.nats is not None
        return {"nats": self.nats.urls, "nats_pids": self.nats.pids,
                "replicas": [{"shard": p.shard, "replica": p.name, "socket": str(p.socket),
                              "pid": p.pid} for p in self.procs]}

    def kill(self, i: int) -> None:
        proc = self.procs[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart(self, i: int, wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> None:
        self._spawn(i)
        if wait:
            self._wait_ready(self.procs[i], timeout_s)

    def stop(self) -> None:
        """SIGTERM every replica (SIGKILL past STOP_TIMEOUT_S), then the NATS nodes."""
        live = [p.proc for p in self.procs if p.proc is not None and p.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.nats is not None:
            self.nats.stop()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)


@contextlib.contextmanager
def local_sarp_cluster(directory: Path, **kw: int | str | Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(directory, **kw)  # type: ignore[arg-type]
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@click.command("local")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Where the NATS nodes and the replicas keep their data "
              "and logs.")
@click.option("--nats", "nats_nodes", type=click.IntRange(1, 9), default=3, show_default=True,
              help="nats-server nodes (a shard's stream keeps min(3, NATS) copies).")
@click.option("--replicas", type=click.IntRange(1, 16), default=3, show_default=True,
              help="sarpd replicas per shard.")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Shards (s0, s1, ...).")
@click.option("--backend", default="rocksdb", show_default=True,
              help="Every replica's storage engine.")
@click.option("--rule", type=click.Choice(sorted(RULES.values())), default="block0",
              show_default=True, help="The shard map's rule: block0 (a sequence lives on "
              "the shard of its first block) or heads (shared heads are split and their "
              "branches spread: docs/CLUSTER.md).")
def local(directory: Path, nats_nodes: int, replicas: int, shards: int, backend: str,
          rule: str) -> None:
    """Start a whole cluster on loopback and stay in the foreground until SIGTERM or
    Ctrl-C, then stop everything cleanly. Once every replica serves, prints ONE JSON
    line: {"nats": [URL, ...], "nats_pids": [...], "replicas": [{"shard", "replica",
    "socket", "pid"}, ...]}. Logs: DIR/nats/*.log and DIR/<shard>-<replica>.log.

    \b
    Example (in a source checkout; also `python -m tools.cluster.local ...`):
      sarpctl cluster local --dir /tmp/sarp-cluster --nats 3 --replicas 3 --shards 2
    """
    lc = LocalCluster(directory, nats_nodes, replicas, shards, backend, rule=rule)
    # SIGTERM as Ctrl-C: the finally below stops everything, also mid-start
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        click.echo(f"starting {nats_nodes} NATS nodes and {replicas * shards} replicas "
                   f"in {directory}", err=True)
        lc.start()
        click.echo(json.dumps(lc.describe()))
        sys.stdout.flush()
        signal.pause()
    except (LocalClusterError, NatsClusterError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping", err=True)
        lc.stop()


if __name__ == "__main__":
    local(prog_name="python -m tools.cluster.local")
