"""Start a real `sarpd` for a benchmark: a fresh process on a temp socket, ready.

One launcher for every benchmark that measures the daemon over its socket (loadgen,
soak, the bridge bench), so they all start it the same way.

`compile_bytecode()` runs before every timed spawn (this launcher, and the recovery
children of sarp and of the baselines): a deployed sarpd (`pip install`) starts from
bytecode compiled at install time, and an environment with PYTHONDONTWRITEBYTECODE
set (this machine's) would otherwise recompile every project module on every spawn
(~50 ms of a cold start), for every index alike.
"""

from __future__ import annotations

import compileall
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sarpd.client import SarpConnectionError, SyncClient
from sarpd.errors import Unavailable

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("sarpd", "backends", "bloomstore", "tools")  # what spawned children import


@functools.cache
def compile_bytecode() -> None:
    """Compile the project's modules to bytecode (__pycache__), once per process;
    an up-to-date module is left as it is."""
    for pkg in PACKAGES:
        compileall.compile_dir(REPO / pkg, quiet=2)


class DaemonStartError(RuntimeError):
    """sarpd exited or did not answer a ping in time; the message ends with its log."""


def start_daemon(data_dir: Path, *, backend: str = "rocksdb", sync: str = "none",
                 extra: Sequence[str] = (), timeout_s: float = 60.0,
                 sock: Path | None = None, wait: bool = True,
                 ) -> tuple[subprocess.Popen[bytes], Path]:
    """Start sarpd on `data_dir` with a socket in a fresh temp directory (Unix socket
    paths are short), or on `sock` (a restart on the same socket; its log is appended
    to); return once it answers `ping` (recovery done), or at once without `wait`."""
    if sock is None:
        sock = Path(tempfile.mkdtemp(prefix="sarp-bench-", dir="/tmp")) / "sarpd.sock"
    log_path = sock.parent / "sarpd.log"
    data_dir.parent.mkdir(parents=True, exist_ok=True)  # sarpd creates only the last level
    argv = [sys.executable, "-m", "sarpd.daemon", "--data-dir", str(data_dir),
            "--socket", str(sock), "--backend", backend, "--sync", sync,
            "--log-level", "WARNING", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    compile_bytecode()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    if not wait:
        return proc, sock
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DaemonStartError(f"sarpd exited with {proc.returncode}: "
                                   f"{log_path.read_text()[-2000:]}")
        try:
            with SyncClient(sock, timeout=1) as c:
                c.ping()
                return proc, sock
        except (SarpConnectionError, Unavailable, OSError):
            time.sleep(0.05)
    proc.kill()
    raise DaemonStartError(f"sarpd did not become ready in {timeout_s:.0f} s: "
                           f"{log_path.read_text()[-2000:]}")


def stop_daemon(proc: subprocess.Popen[bytes], sock: Path) -> None:
    """SIGTERM (sarpd answers what it holds, snapshots, exits), then remove the socket's
    temp directory and its log."""
    proc.terminate()
    try:
        proc.wait(60)
    finally:
        shutil.rmtree(sock.parent, ignore_errors=True)
