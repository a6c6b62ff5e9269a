"""Start real `sarpd` processes for tests, and talk raw msgpack to them.

`SarpdProc` runs `python -m sarpd.daemon` on a temp data dir and a short socket path
(Unix socket paths are limited to 107 bytes, so sockets live in a short /tmp dir),
with `--sync always`, and waits until a `ping` is answered `ok` (recovery done).
`RawConn` is a tiny blocking msgpack connection for tests that need exact bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client.parser import text_string_to_metric_families

READY_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parent.parent


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(path: Path, tables: Mapping[str, Mapping[str, object]]) -> Path:
    lines: list[str] = []
    for table, items in tables.items():
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in items.items())
    path.write_text("\n".join(lines) + "\n")
    return path


class RawConn:
    """Blocking msgpack over the daemon's socket."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.unpacker = msgpack.Unpacker(raw=False)

    def send(self, msg: object) -> None:
        self.sock.sendall(msgpack.packb(msg, use_bin_type=True))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        while True:
            for msg in self.unpacker:
                assert isinstance(msg, dict), msg
                return msg
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            self.unpacker.feed(data)

    def call(self, op: str, req_id: int = 1, **fields: object) -> dict[str, Any]:
        self.send({"id": req_id, "op": op, **fields})
        return self.recv()

    def closed_by_server(self) -> bool:
        """True once the server has closed its end (EOF)."""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
                self.unpacker.feed(data)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SarpdProc:
    """One sarpd process (restartable on the same data dir and socket)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        backend: str = "rocksdb",
        sync: str = "always",
        config: Mapping[str, Mapping[str, object]] | None = None,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.backend = backend
        self.sync = sync
        self.extra_args = extra_args
        self.env = dict(env or {})
        self._sock_dir = Path(tempfile.mkdtemp(prefix="sarp-", dir="/tmp"))
        self.socket = self._sock_dir / "sarpd.sock"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.config_path: Path | None = None
        if config:
            self.config_path = write_config(data_dir.parent / f"{data_dir.name}.toml", config)
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "sarpd.daemon", "--data-dir", str(self.data_dir)]
        args += ["--socket", str(self.socket), "--backend", self.backend, "--sync", self.sync]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        return args + list(self.extra_args)

    def start(self, wait: bool = True) -> SarpdProc:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
            )
        if wait:
            self.wait_ready()
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"sarpd exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), RawConn(self.socket, timeout=5) as conn:
                if conn.call("ping").get("ok"):
                    return
            time.sleep(0.05)
        raise TimeoutError(f"sarpd not ready after {timeout} s:\n{self.log()}")

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `sig` and wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cleanup(self) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                self.kill()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


class Launcher:
    """Creates SarpdProcs under one base directory and cleans them all up."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[SarpdProc] = []

    def __call__(self, backend: str = "rocksdb", start: bool = True, **kw: Any) -> SarpdProc:
        data_dir = self.base / f"data{len(self.procs)}"
        data_dir.mkdir(parents=True)
        proc = SarpdProc(data_dir, backend=backend, **kw)
        self.procs.append(proc)
        return proc.start() if start else proc

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.cleanup()


@contextlib.contextmanager
def launcher(base: Path) -> Iterator[Launcher]:
    lau = Launcher(base)
    try:
        yield lau
    finally:
        lau.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> dict[str, float]:
    """Every sample as 'name{label="v",...}' -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
