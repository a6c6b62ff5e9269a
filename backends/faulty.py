"""FaultyBackend: injects write and fsync failures into any backend, for fault tests.

A test switches faults on and off in a RUNNING daemon by writing a control file whose
path is in the environment variable `SARPD_FAULT_FILE` (read by `open_backend`, which
then wraps the engine it opens). The file holds one word; no file (or an empty one)
means no fault:

    enospc   every write and sync raises BackendIOError (ENOSPC) before the engine sees
             anything: the batch is not applied (a full disk refusing the log append)
    fsync    every write is applied WITHOUT sync, then raises BackendIOError (EIO from
             fsync): the batch is visible in the engine but was never acknowledged;
             sync() raises too
    eio      like enospc, with EIO (a failing device)

Reads, scans and stats always pass through: a full or failing disk still serves what
it holds. `faults` counts the failures injected; `stats()` reports it as
`faults_injected`. The control file is re-read when its mtime or size changes (one
stat per write), so a fault takes effect at the next write batch.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from backends.base import Backend, WriteBatch, ingest_by_batches
from backends.errors import BackendIOError

ENV = "SARPD_FAULT_FILE"
MODES = ("enospc", "fsync", "eio")


class FaultyBackend:
    """Wraps `inner`; faults come from `control` (a path) or `set_mode` (in-process)."""

    def __init__(self, inner: Backend, control: Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.persistent = inner.persistent
        self.direct_io = inner.direct_io
        self.control = control
        self.faults = 0
        self._mode = ""
        self._seen: tuple[int, int] | None = None

    def set_mode(self, mode: str) -> None:
        if mode and mode not in MODES:
            raise ValueError(f"fault mode {mode!r} is not one of {', '.join(MODES)}")
        self._mode = mode

    def mode(self) -> str:
        if self.control is None:
            return self._mode
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            self._seen, self._mode = None, ""
            return ""
        key = (st.st_mtime_ns, st.st_size)
        if key != self._seen:
            self._seen = key
            self.set_mode(self.control.read_text().strip())
        return self._mode

    def _fail(self, action: str, code: int) -> BackendIOError:
        self.faults += 1
        return BackendIOError(f"{self.name}: {action} failed: [Errno {code}] "
                              f"{os.strerror(code)} (injected fault)")

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return self.inner.get_many(keys)

    def write(self, batch: WriteBatch, sync: bool) -> None:
        mode = self.mode()
        if mode in ("enospc", "eio"):
            code = errno.ENOSPC if mode == "enospc" else errno.EIO
            raise self._fail(f"write of {len(batch)} ops (sync={sync})", code)
        if mode == "fsync":
            self.inner.write(batch, False)
            raise self._fail(f"fsync after a write of {len(batch)} ops", errno.EIO)
        self.inner.write(batch, sync)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan(start, end)

    def sync(self) -> None:
        mode = self.mode()
        if mode:
            raise self._fail("sync", errno.EIO if mode != "enospc" else errno.ENOSPC)
        self.inner.sync()

    def flush_buffers(self) -> None:
        mode = self.mode()
        if mode:
            raise self._fail("flush_buffers", errno.EIO if mode != "enospc" else errno.ENOSPC)
        self.inner.flush_buffers()

    def resume(self) -> None:
        self.inner.resume()

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Write batches through this wrapper, so that its faults apply."""
        return ingest_by_batches(self, items)

    def copy_to(self, dest: Path) -> None:
        """The inner engine's copy; a fault mode fails it (a full or failing disk)."""
        mode = self.mode()
        if mode:
            raise self._fail(f"copy_to {dest}", errno.EIO if mode != "enospc" else errno.ENOSPC)
        self.inner.copy_to(dest)

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict[str, int | float | str]:
        out = dict(self.inner.stats())
        out["faults_injected"] = self.faults
        return out


def wrap_from_env(backend: Backend) -> Backend:
    """`backend` wrapped in a FaultyBackend when $SARPD_FAULT_FILE is set, else itself."""
    path = os.environ.get(ENV)
    if not path:
        return backend
    return FaultyBackend(backend, Path(path))
