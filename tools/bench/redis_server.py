"""A real `redis-server` process for the bench's `redis` baseline (and its tests).

The harness starts its own server; nothing relies on a system service. It listens on
a Unix socket only (`port 0`) in a short private temp directory (a socket path must
fit in 107 bytes), keeps its data in `data_dir`, and persists with both an AOF
(`appendonly yes`, `appendfsync always` for sync runs, `everysec` otherwise,
RDB preamble in rewritten base files) and RDB snapshots (Redis' default save points).

`start()` returns the seconds from spawn until PING is answered (not LOADING);
`restart(first)` stops the server cleanly (SHUTDOWN: AOF fsync'd, RDB saved), starts it
again on the same files and times both readiness and the first answer of `first`
(e.g. the first MGET of a match), retrying while Redis answers LOADING.
`rewrite_aof()` compacts the AOF with BGREWRITEAOF and waits for it; Redis may be
running its own automatic rewrite at that moment (auto-aof-rewrite-percentage), and
a second BGREWRITEAOF is then refused ("Background append only file rewriting
already in progress"), so it first waits for a running rewrite to finish.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

T = TypeVar("T")
SAVE_POINTS = "3600 1 300 100 60 10000"  # Redis' defaults
POLL_S = 0.0005
REWRITE_POLL_S = 0.001
IN_PROGRESS = "already in progress"  # BGREWRITEAOF's refusal while one runs
_PR_SET_PDEATHSIG = 1


class RedisServerError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Restart:
    ready_s: float  # spawn -> PING answered (data loaded)
    first_s: float  # spawn -> `first` answered
    result: Any = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the harness process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def redis_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if found is None:
        raise RedisServerError("redis-server not found (Debian: apt-get install redis-server)")
    return found


class RedisServer:
    """One redis-server on `data_dir` (see the module docstring). Not thread-safe."""

    def __init__(self, data_dir: Path, *, sync: bool = True, binary: str | None = None,
                 timeout_s: float = 600.0) -> None:
        self.data_dir = Path(data_dir)
        self.sync = sync
        self.binary = binary or redis_binary()
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock_dir: str | None = None
        self._client: redis.Redis | None = None

    @property
    def socket_path(self) -> str:
        if self._sock_dir is None:
            self._sock_dir = tempfile.mkdtemp(prefix="sarp-redis-", dir="/tmp")
        return os.path.join(self._sock_dir, "redis.sock")

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def args(self) -> list[str]:
        return [
            self.binary, "--port", "0", "--unixsocket", self.socket_path,
            "--unixsocketperm", "700", "--dir", str(self.data_dir), "--daemonize", "no",
            "--logfile", str(self.log_path), "--appendonly", "yes",
            "--appendfsync", "always" if self.sync else "everysec",
            "--appenddirname", "appendonlydir", "--aof-use-rdb-preamble", "yes",
            "--dbfilename", "dump.rdb", "--save", SAVE_POINTS,
        ]

    def _new_client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket_path, socket_timeout=self.timeout_s,
                           socket_connect_timeout=self.timeout_s, retry=Retry(NoBackoff(), 0))

    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _spawn(self) -> float:
        if self.proc is not None and self.proc.poll() is None:
            raise RedisServerError(f"redis-server already running (pid {self.proc.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "redis.stdout", "ab") as out:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        # never outlive this object or this interpreter (a crashed harness included)
        weakref.finalize(self, _terminate, self.proc)
        return t0

    def _until(self, t0: float, call: Callable[[redis.Redis], T]) -> T:
        """Retry `call` until it answers (not LOADING, socket up) or the server dies."""
        probe = self.client()
        while True:
            try:
                return call(probe)
            except (RedisConnectionError, BusyLoadingError, FileNotFoundError):
                probe.connection_pool.disconnect()
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RedisServerError(f"redis-server exited with {self.proc.returncode}: "
                                       f"{self.log_tail()}")
            if time.perf_counter() - t0 > self.timeout_s:
                raise RedisServerError(f"redis-server not ready after {self.timeout_s} s: "
                                       f"{self.log_tail()}")
            time.sleep(POLL_S)

    def start(self) -> float:
        """Spawn and wait until PING is answered; the seconds that took."""
        t0 = self._spawn()
        self._until(t0, lambda c: c.ping())
        return time.perf_counter() - t0

    def stop(self) -> None:
        """Clean shutdown (AOF fsync'd, RDB saved), waiting for the process to exit."""
        proc, self.proc = self.proc, None
        if self._client is not None:
            self._client.close()
            self._client = None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # redis-server: same as SHUTDOWN (saves)
        try:
            proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RedisServerError(f"redis-server did not stop in {self.timeout_s} s") from None
        if proc.returncode != 0:
            raise RedisServerError(f"redis-server stopped with {proc.returncode}: "
                                   f"{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL (a crash); the next start recovers from the AOF."""
        proc, self.proc = self.proc, None
        if self._client is not None:
            self._client.close()
            self._client = None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, first: Callable[[redis.Redis], T]) -> Restart:
        """Stop cleanly, start again and time readiness and the first answer."""
        self.stop()
        t0 = self._spawn()
        self._until(t0, lambda c: c.ping())
        ready = time.perf_counter() - t0
        result = self._until(t0, first)
        return Restart(ready, time.perf_counter() - t0, result)

    def _rewriting(self) -> bool:
        info = self.client().info("persistence")
        return bool(info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"])

    def _wait_rewrite(self) -> None:
        t0 = time.perf_counter()
        while self._rewriting():
            if time.perf_counter() - t0 > self.timeout_s:
                raise RedisServerError(f"AOF rewrite still running after {self.timeout_s} s: "
                                       f"{self.log_tail()}")
            time.sleep(REWRITE_POLL_S)

    def rewrite_aof(self) -> None:
        """BGREWRITEAOF of everything written so far, and wait until it is done (after
        any rewrite already running: Redis refuses a second one meanwhile)."""
        while True:
            self._wait_rewrite()
            try:
                self.client().bgrewriteaof()
                break
            except ResponseError as exc:
                if IN_PROGRESS not in str(exc):
                    raise
        self._wait_rewrite()
        status = self.client().info("persistence").get("aof_last_bgrewrite_status")
        if status != "ok":
            raise RedisServerError(f"BGREWRITEAOF failed ({status}): {self.log_tail()}")

    def disk_bytes(self) -> int:
        """AOF files plus the RDB file."""
        total = 0
        aof = self.data_dir / "appendonlydir"
        files = [*aof.iterdir()] if aof.is_dir() else []
        for f in [*files, self.data_dir / "dump.rdb"]:
            try:
                total += f.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._sock_dir is not None:
                shutil.rmtree(self._sock_dir, ignore_errors=True)
                self._sock_dir = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
