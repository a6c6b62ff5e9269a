"""`sarpd`: the daemon's entry point.

Start-up: check every setting (sarpd.config: TOML, flags and their SARPD_* variables)
and the paths (the socket's directory and the data directory's parent must exist)
before anything is created, lock the data directory, bind the socket at once (every
request is answered `unavailable` while recovering), open the backend, recover the
index in the worker thread with progress in the log and in sd_notify STATUS=, then
serve (READY=1). Periodic snapshots are written, and logged, only after a change.
SIGTERM / SIGINT: stop accepting, answer the requests already received, snapshot,
close the backend, remove the socket, exit 0.

Operations: `--log-format json` logs one JSON object per line (python-json-logger);
`--metrics-port` serves Prometheus metrics on 127.0.0.1 (sarpd.daemon.metrics). Recovery
progress, with an ETA, goes to the log, to sd_notify STATUS=, to the `unavailable`
message every request gets meanwhile, and to the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from backends.registry import backend_names
from sarpd.config import ServerConfig, SettingError, choices, load_config, show
from sarpd.core.index import RecoveryReport, SarpIndex
from sarpd.daemon import sdnotify
from sarpd.daemon.server import Server, check_socket_path
from sarpd.daemon.service import Service
from sarpd.daemon.syncer import Syncer
from sarpd.errors import ConfigError, SarpError, missing_extra
from sarpd.model import SnapshotResult

if TYPE_CHECKING:
    from sarpd.cluster.node import ClusterNode

log = logging.getLogger("sarpd")

LOCK_NAME = "sarpd.pid"
PROGRESS_EVERY_S = 2.0
SNAPSHOT_POLL_S = 0.25  # how often the snapshot loop looks at the changed segments


class DataDirLocked(SarpError):
    code = "unavailable"


class _Cancelled(Exception):
    """Raised from the recovery progress callback when a stop signal arrived."""


def lock_data_dir(data_dir: Path) -> IO[str]:
    """An exclusive flock on data_dir/sarpd.pid (holding our pid), kept for the process
    lifetime: two daemons can never share a data directory. The directory is created
    if its parent exists; a missing parent is an error (never a `mkdir -p`)."""
    if not data_dir.parent.is_dir():
        raise ConfigError(f"data dir {data_dir}: its parent directory {data_dir.parent} "
                          "does not exist (sarpd creates the data directory, not its parents)")
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"data dir {data_dir}: exists and is not a directory")
    data_dir.mkdir(exist_ok=True)
    path = data_dir / LOCK_NAME
    fh = open(path, "a+")  # noqa: SIM115 - held open for the process lifetime
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        fh.seek(0)
        other = fh.read().strip() or "?"
        fh.close()
        raise DataDirLocked(
            f"data dir {data_dir}: in use by another sarpd (pid {other}, lock {path})"
        ) from exc
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


class Daemon:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.server = Server(config)
        self._stop = asyncio.Event()
        self._stop_requested = threading.Event()  # read by the recovery thread
        self._last_progress = 0.0
        self._recovery_started = time.monotonic()
        self._metrics_http: Any = None
        self._api: Any = None  # sarpd.daemon.indexer_api.IndexerApi, with --http-port
        self._api_http: Any = None  # sarpd.daemon.api_http.ApiServer, its port

    def request_stop(self, signame: str) -> None:
        if not self._stop.is_set():
            log.info("%s: shutting down", signame)
        self._stop_requested.set()
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        try:
            await self.server.start()
        except SarpError as exc:
            log.error("%s", exc.message)
            return 1
        try:
            await self._start_metrics()
            return await self._serve()
        except SarpError as exc:
            log.error("%s", exc.message)
            await self.server.stop()
            return 1
        finally:
            if self._api_http is not None:
                await self._api_http.close()
            if self._metrics_http is not None:
                await self._metrics_http.cleanup()  # /readyz said 503 until here
            self.server.remove_socket()
            self.server.executor.shutdown(wait=True)
            if self.server.match_pool is not None:
                self.server.match_pool.shutdown(wait=True)

    async def _start_metrics(self) -> None:
        """/metrics, /healthz, /readyz on metrics_host:metrics_port (sarpd.daemon.http)
        and the indexer API on http_host:http_port (sarpd.daemon.api_http, with those
        three too), on this loop; a ConfigError if either cannot listen."""
        cfg = self.config
        if not cfg.metrics_port and not cfg.http_port:
            return
        from sarpd.daemon.http import listen_error, make_app, server_readiness, start, url

        readiness = server_readiness(self.server)
        if cfg.metrics_port:
            self._metrics_http = await start(make_app(self.server.metrics, readiness),
                                             cfg.metrics_host, cfg.metrics_port)
        if cfg.http_port:
            if cfg.cluster.enabled:
                raise ConfigError("http_port: the indexer API serves a single sarpd, not a "
                                  "cluster replica (leave --http-port out with --cluster)")
            from sarpd.daemon.api_http import ApiServer
            from sarpd.daemon.indexer_api import IndexerApi

            self._api = IndexerApi(self.server)
            self._api_http = ApiServer(self._api.routes(readiness), self._api.max_body())
            try:
                await self._api_http.listen(cfg.http_host, cfg.http_port)
            except OSError as exc:
                raise listen_error(exc, "http_port", cfg.http_host, cfg.http_port) from exc
            log.info("http on %s: the indexer API (docs/HTTP.md), /metrics, /healthz, "
                     "/readyz", url(cfg.http_host, cfg.http_port))
        self.server.metrics.exported = True

    async def _serve(self) -> int:
        sdnotify.status("recovering")
        if not self.config.cluster.enabled:
            return await self._serve_once()
        from sarpd.daemon.cluster_mode import Rebootstrap, set_aside

        while True:
            try:
                return await self._serve_once()
            except Rebootstrap as exc:  # cluster mode: the log moved on without us
                log.warning("shard %s: %s: starting again from the newest checkpoint",
                            self.config.cluster.shard, exc)
                set_aside(self.config.data_dir, self.config.backend)

    async def _serve_once(self) -> int:
        """Open, recover, (cluster mode: bootstrap and join), serve until a stop
        signal; `Rebootstrap` once the index is closed, when its data must go."""
        cfg = self.config
        if cfg.cluster.enabled:  # nats and the cluster code load only in cluster mode
            from sarpd.daemon.cluster_mode import Rebootstrap, bootstrap, join, leave
        if cfg.cluster.enabled and not await bootstrap(cfg, self.server):
            await self.server.stop()
            return 1
        try:
            index, backend_name = await self.server.run_exclusive(self._open)
        except (SarpError, OSError) as exc:
            log.error("cannot open the %s backend in %s: %s", cfg.backend, cfg.data_dir, exc)
            await self.server.stop()
            return 1
        report = await self._recover(index)
        if report is None:
            await self.server.stop()
            await self._close(index, snapshot=False)
            return 0 if self._stop.is_set() else 1
        # group commit (sarpd/daemon/syncer.py): a single node that syncs every write;
        # a replica's writes are the shard log's, applied by the replica
        group = cfg.sync == "always" and not cfg.cluster.enabled
        service = Service(
            index, cfg, backend_name, group_commit=group,
            recovered_in_s=report.seconds, extra_stats=self.server.extra_stats,
            match_pool=self.server.match_pool,
        )
        self.server.syncer = Syncer(index.sync_now) if group else None
        joined = None
        if cfg.cluster.enabled:
            try:
                joined = await join(cfg, self.server, index, self._stop)
            except Rebootstrap:
                await self._close(index, snapshot=False)
                raise
            if joined is None:
                await self.server.stop()
                await self._close(index, snapshot=False)
                return 0 if self._stop.is_set() else 1
        self.server.metrics.set_ready(report.seconds)
        self.server.set_ready(service)
        if self._api is not None:
            await self._api.start()
        # What exists now (modules, the recovered index, the engine maps) lives as long
        # as the daemon: frozen out of the collector's full passes, which walk every
        # tracked object each time the heap grew by a quarter and stop the whole
        # daemon meanwhile (issue 26: 21-75 ms each under a fleet's events; 8-42 ms).
        gc.collect()
        gc.freeze()
        sdnotify.notify("READY=1", f"STATUS=serving on {cfg.socket}")
        log.info("ready: serving on %s (backend %s, sync %s)", cfg.socket, backend_name, cfg.sync)
        snapshots = asyncio.create_task(self._periodic_snapshots(service))
        gap = await self._until_stop(joined[0] if joined else None)
        snapshots.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await snapshots
        if gap:  # the replica's log was trimmed past it while it ran
            await self.server.suspend(f"shard {cfg.cluster.shard}: re-bootstrapping ({gap})")
        else:
            sdnotify.notify("STOPPING=1", "STATUS=shutting down")
            if self._api is not None:
                await self._api.stop()  # its listeners' last batches answered, saved
            if joined is not None:
                await joined[1].stop()  # no new remote requests
            await self.server.stop()
        if joined is not None:
            await leave(self.server, *joined)  # the writes in flight end first
        if self.server.syncer is not None:  # every answer went out: no sync pending
            self.server.syncer.close()
            self.server.syncer = None
        await self._close(index, snapshot=not gap)
        if gap:
            raise Rebootstrap(gap)
        log.info("stopped")
        return 0

    async def _until_stop(self, node: ClusterNode | None) -> str:
        """Wait for a stop signal, or (cluster mode, `rebootstrap` on) for the replica
        to halt on a gap in its log: why it halted, "" for a stop."""
        if node is None or not self.config.cluster.rebootstrap:
            await self._stop.wait()
            return ""
        waits = [asyncio.create_task(self._stop.wait()),
                 asyncio.create_task(node.replica.halted.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        return "" if self._stop.is_set() else node.replica.failed

    def _open(self) -> tuple[SarpIndex, str]:
        from sarpd.core.store import data_paths, open_backend

        cfg = self.config
        backend_dir, snapshot_dir = data_paths(cfg.data_dir, cfg.backend)
        backend = open_backend(cfg.backend, backend_dir, cache_bytes=cfg.cache_bytes)
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        # a replica records branch links from its first write: its shard's splits read
        # a head's branches from them (issue 27)
        icfg = replace(cfg.index, branch_links=True) if cfg.cluster.enabled else cfg.index
        index = SarpIndex(backend, icfg, snapshot_dir, sync=cfg.sync == "always")
        return index, backend.name

    async def _recover(self, index: SarpIndex) -> RecoveryReport | None:
        log.info("recovering the index from %s", self.config.data_dir)
        self._recovery_started = time.monotonic()
        try:
            report = await self.server.run_exclusive(lambda: index.recover(self._progress))
        except _Cancelled:
            log.info("recovery interrupted by a stop signal")
            return None
        except Exception:
            log.exception("recovery failed")
            sdnotify.status("recovery failed")
            return None
        if self._stop.is_set():
            return None
        log.info(
            "recovered in %.3f s (snapshot up to segment %d, %d segments re-routed%s)",
            report.seconds,
            report.snapshot_segment_id,
            report.segments_rerouted,
            ", full scan" if report.full_scan else "",
        )
        if report.warning:
            log.warning("recovery: %s", report.warning)
        return report

    def _progress(self, done: int, total: int) -> None:
        """Called from the worker thread during recovery."""
        if self._stop_requested.is_set():
            raise _Cancelled("stop requested during recovery")
        now = time.monotonic()
        elapsed = now - self._recovery_started
        eta = elapsed * (total - done) / done if done else None
        text = f"recovering: {done} of {total} segments" + (
            f" ({100 * done / total:.0f}%, ETA {eta:.1f} s)" if eta is not None and total else ""
        )
        self.server.status = text  # a str assignment: safe across threads
        self.server.metrics.set_recovery(done, total, elapsed, eta)
        if now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            log.info(
                "%s", text,
                extra={"recovery_done": done, "recovery_total": total, "eta_s": eta},
            )
            sdnotify.status(text)

    async def _periodic_snapshots(self, service: Service) -> None:
        """A snapshot every `snapshot_interval_s`, and as soon as
        `snapshot_changed_segments` segments changed since the last one."""
        interval = self.config.index.snapshot_interval_s
        changed = self.config.index.snapshot_changed_segments
        if interval <= 0 and changed <= 0:
            return
        loop = asyncio.get_running_loop()
        tick = min(t for t in (interval, SNAPSHOT_POLL_S if changed > 0 else 0.0) if t > 0)
        last = loop.time()
        while True:
            await asyncio.sleep(tick)
            if not ((interval > 0 and loop.time() - last >= interval)
                    or (changed > 0 and service.index.changed_segments >= changed)):
                continue
            last = loop.time()
            try:
                res = await self._snapshot_aside(service)
            except Exception:
                log.exception("periodic snapshot failed")
                continue
            if res is None:  # an idle daemon writes nothing and says so only at DEBUG
                log.debug("periodic snapshot: nothing changed since the last one")
            else:
                log.info("snapshot up to segment %d in %.3f s", res.segment_id, res.seconds)

    async def _snapshot_aside(self, service: Service) -> SnapshotResult | None:
        """A snapshot whose file is written off the worker: requests are served while
        it is written (`SarpIndex.prepare_snapshot`); None if nothing changed."""
        pending = await self.server.run_exclusive(service.prepare_periodic_snapshot)
        if pending is None:
            return None
        path = await asyncio.to_thread(pending.write)
        return await self.server.run_exclusive(partial(service.finish_snapshot, pending, path))

    async def _close(self, index: SarpIndex, *, snapshot: bool) -> None:
        def work() -> None:
            if snapshot:
                try:
                    res = index.snapshot()
                    log.info("final snapshot up to segment %d", res.segment_id)
                except Exception:
                    log.exception("final snapshot failed (the next start re-routes more)")
            index.close()

        try:
            await self.server.run_exclusive(work)
        except Exception:
            log.exception("closing the index failed")


def setup_logging(level: str, fmt: str = "text") -> None:
    """Text lines, or one JSON object per line (timestamp, level, logger, message and
    any `extra` fields such as recovery_done / recovery_total / eta_s)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "name": "logger", "asctime": "time"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


HELP = """Serve the SARP prefix index of LLM KV-cache blocks on a Unix socket.

Clients send msgpack requests (see docs/PROTOCOL.md): match a token prefix, insert
the blocks of a sequence with their metadata, remove or clear blocks. The index lives
on SSD under DATA_DIR/<backend>/, with directory snapshots in
DATA_DIR/snapshots/<backend>/.

Settings come from --config (TOML tables [server], [index] and [cluster]); flags
override them. Each flag may instead be set by the environment variable named in its
help (SARPD_BATCH_MAX=512 is --batch-max 512; a flag on the command line wins).
Every setting is checked, by type and range, before anything starts: a bad one stops
sarpd with a message naming it and exit status 1 (2 for a bad flag). The socket's
directory and the data directory's parent must exist (sarpd creates no parents).

With --cluster, sarpd is a replica of one shard: its writes go through the shard's
log on NATS JetStream and it applies the log (docs/DECISIONS.md).

\b
Examples:
  sarpd --data-dir ./var --socket ./var/sarpd.sock
  sarpd --config /etc/sarpd/sarpd.toml
  SARPD_LOG_LEVEL=DEBUG sarpd --config /etc/sarpd/sarpd.toml
  sarpd --data-dir ./r1 --socket ./r1.sock --cluster nats://127.0.0.1:4222 \\
        --shard s0 --replica-id r1
"""


class EnvOption(click.Option):
    """A flag that may also be given as SARPD_<FLAG> (e.g. --batch-max: SARPD_BATCH_MAX),
    converted and checked as the flag is (click's errors name the variable)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("show_envvar", True)
        super().__init__(*args, **kw)
        if self.envvar is None:
            long = max(self.opts, key=len)
            self.envvar = "SARPD_" + long.lstrip("-").replace("-", "_").upper()


def option(*decls: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(*decls, cls=EnvOption, **kw)


@click.command(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file with [server], [index] and [cluster] tables (see systemd/sarpd.toml).",
)
@option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the index data (default /var/lib/sarpd); created if its parent "
    "exists.",
)
@option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Unix socket to listen on (default /run/sarpd/sarpd.sock); its directory must "
    "exist.",
)
@option(
    "--backend",
    type=click.Choice(sorted(backend_names())),
    help="Storage engine (default rocksdb).",
)
@option(
    "--sync",
    type=click.Choice(["always", "none"]),
    help="always: fsync every write batch before answering (default); none: leave "
    "it to the OS (acknowledged inserts may be lost on a crash).",
)
@option("--batch-window-ms", type=float,
        help="Gather requests this long per batch (default 0.5; >= 0).")
@option("--batch-max", type=int,
        help="Run a batch once this many requests are queued (default 256; >= 1).")
@option("--worker-threads", type=int,
        help="Threads that answer a batch's matches at once (default 0: one per core; "
        "writes keep one ordered thread).")
@option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log verbosity (default INFO).",
)
@option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="text (default) or json: one JSON object per line, for log shippers.",
)
@option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 = off, the default).",
)
@option(
    "--metrics-host",
    metavar="HOST",
    help="Address the metrics port listens on (default 127.0.0.1: this machine only; "
    "0.0.0.0: every interface).",
)
@option(
    "--http-port",
    type=click.IntRange(0, 65535),
    help="Serve the indexer API (Dynamo's standalone KV indexer's endpoints: /register, "
    "/query, ...; docs/HTTP.md) and /metrics at http://HOST:PORT (0 = off, the default).",
)
@option(
    "--http-host",
    metavar="HOST",
    help="Address the indexer API listens on (default 127.0.0.1: this machine only; "
    "0.0.0.0: every interface; it does not authenticate callers).",
)
@option(
    "--cluster",
    "cluster_urls",
    metavar="URL[,URL...]",
    help="Run as a replica (issue 15): the NATS cluster whose JetStream stream holds the "
    "shard's log, e.g. nats://10.0.0.1:4222,nats://10.0.0.2:4222. Needs --shard and "
    "--replica-id; without it sarpd is a single node (the default).",
)
@option("--shard", help="The shard this replica serves (with --cluster).")
@option("--replica-id", help="This replica's name within its shard, unique there "
        "(with --cluster; its durable log reader is named after it).")
@option("--stream-replicas", type=click.IntRange(1, 5),
        help="Copies of the shard's stream when this replica creates it (default 3; "
        "at most the NATS nodes).")
@click.version_option(package_name="sarp", prog_name="sarpd")
@click.pass_context
def main(
    ctx: click.Context,
    config_file: Path | None,
    data_dir: Path | None,
    socket_path: Path | None,
    backend: str | None,
    sync: str | None,
    batch_window_ms: float | None,
    batch_max: int | None,
    worker_threads: int | None,
    log_level: str | None,
    log_format: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
    http_port: int | None,
    http_host: str | None,
    cluster_urls: str | None,
    shard: str | None,
    replica_id: str | None,
    stream_replicas: int | None,
) -> None:
    urls = tuple(u.strip() for u in cluster_urls.split(",") if u.strip()) if cluster_urls else None
    try:
        cfg = load_config(
            config_file,
            cluster={"urls": urls, "shard": shard, "replica_id": replica_id,
                     "stream_replicas": stream_replicas},
            data_dir=data_dir,
            socket=socket_path,
            backend=backend,
            sync=sync,
            batch_window_ms=batch_window_ms,
            batch_max=batch_max,
            worker_threads=worker_threads,
            log_level=log_level.upper() if log_level else None,
            log_format=log_format,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            http_port=http_port,
            http_host=http_host,
        )
        check_backend(cfg, config_file)
        check_extras(cfg)
        check_socket_path(cfg.socket)  # before anything is created: a missing directory
        lock = lock_data_dir(cfg.data_dir)
    except SettingError as exc:
        raise _as_click(ctx, exc) from exc
    except (SarpError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    setup_logging(cfg.log_level, cfg.log_format)
    try:
        rc = run(cfg)
    finally:
        lock.close()
    sys.exit(rc)


def check_backend(cfg: ServerConfig, config_file: Path | None) -> None:
    """The `[server] backend` of a config file names a registered engine (the flag is
    checked by click)."""
    names = sorted(backend_names())
    if cfg.backend not in names:
        err = SettingError("server", "backend", cfg.backend, f"is not one of {choices(names)}")
        raise err.at_file(config_file) if config_file is not None else err


def check_extras(cfg: ServerConfig) -> None:
    """Cluster mode needs nats-py (the `cluster` extra): say so before anything starts."""
    if cfg.cluster.enabled and importlib.util.find_spec("nats") is None:
        raise ConfigError(f"cluster mode {missing_extra('nats')}")


def _as_click(ctx: click.Context, exc: SettingError) -> click.ClickException:
    """A bad flag (or its SARPD_* variable) is a usage error of that flag, as click's
    own type checks report it (exit 2); a bad config file setting exits 1."""
    for param in ctx.command.params:
        if exc.flag is not None and exc.flag in param.opts:
            return click.BadParameter(f"{show(exc.value)} {exc.rule}", ctx, param)
    return click.ClickException(exc.message)


def run(cfg: ServerConfig, loop_factory: Callable[[], Any] | None = None) -> int:
    """Run the daemon until a stop signal; the process exit code."""
    if loop_factory is None:
        import uvloop

        loop_factory = uvloop.new_event_loop

    async def amain() -> int:
        return await Daemon(cfg).run()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(amain())


if __name__ == "__main__":
    main()
