"""A real sarpd on a failing disk: inserts are refused (`unavailable`, naming the
cause), nothing refused is acknowledged, matches keep working, inserts resume once
the disk works again, and `check` stays clean, across a restart too.

Two ways to fail the disk:
- injected faults (backends/faulty.py through $SARPD_FAULT_FILE): ENOSPC before the
  engine sees the batch, or a failed fsync after the engine applied it;
- a real full filesystem: sarpd runs in a private mount namespace (`unshare -m`) on
  a tmpfs of a few MiB mounted over its data directory; the test fills it with a
  file (through /proc/PID/root) and deletes the file again. Skipped where mounting
  is not allowed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from backends.registry import backend_names
from sarpd.client import Client, SyncClient
from sarpd.errors import SarpError
from tests.daemon_helpers import Launcher, SarpdProc

BT = 16
PERSISTENT = [n for n in backend_names() if n != "memory"]


def seq(k: int, blocks: int = 5) -> list[int]:
    return [(k * 7919 + i) % (1 << 32) for i in range(blocks * BT)]


def meta(k: int, blocks: int = 5) -> list[int]:
    return [(k << 16) | j for j in range(blocks)]


def assert_all_matched(c: SyncClient, acked: list[int]) -> None:
    for k in acked:
        got = c.match(tokens=seq(k))
        assert got["meta"] == meta(k), f"acknowledged insert {k} is not matched in full"


def assert_check_clean(c: SyncClient) -> None:
    report = c.check()
    assert report["clean"], report["problems"]


def assert_refused(exc: BaseException) -> None:
    assert isinstance(exc, SarpError), exc
    assert exc.code == "unavailable", (exc.code, exc.message)


async def pipelined(path: str, refused: list[int], acked: list[int]) -> list[object]:
    """Inserts and matches in flight together on one connection."""
    async with await Client.connect(path) as c:
        calls = []
        for r, a in zip(refused, acked, strict=False):
            calls.append(c.insert(tokens=seq(r), meta=meta(r)))
            calls.append(c.match(tokens=seq(a)))
        return list(await asyncio.gather(*calls, return_exceptions=True))


@pytest.mark.parametrize("mode", ["enospc", "fsync"])
@pytest.mark.parametrize("backend", PERSISTENT)
def test_injected_faults(sarpd_factory: Launcher, tmp_path: Path, backend: str,
                         mode: str) -> None:
    control = tmp_path / "fault"
    proc = sarpd_factory(backend=backend, env={"SARPD_FAULT_FILE": str(control)})
    acked: list[int] = []
    with SyncClient(proc.socket) as c:
        for k in range(3):
            c.insert(tokens=seq(k), meta=meta(k))
            acked.append(k)
        control.write_text(mode)
        out = asyncio.run(pipelined(str(proc.socket), [100, 101, 102], acked))
        for i, res in enumerate(out):
            if i % 2 == 0:
                assert_refused(res)  # type: ignore[arg-type]
                assert "injected fault" in res.message  # type: ignore[attr-defined]
            else:
                assert res["meta"] == meta(acked[i // 2]), res  # type: ignore[index]
        assert c.stats()["backend_faults_injected"] >= 1
        assert_all_matched(c, acked)
        control.unlink()
        for k in (100, 101, 102):
            c.insert(tokens=seq(k), meta=meta(k))
            acked.append(k)
        assert_all_matched(c, acked)
        assert_check_clean(c)
    assert proc.stop() == 0
    proc.start()
    with SyncClient(proc.socket) as c:
        assert_all_matched(c, acked)
        assert_check_clean(c)


# -- a real full filesystem ------------------------------------------------------------
TMPFS_SIZE = "24m"


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        try:
            done = subprocess.run(["unshare", "-m", "sh", "-c",
                                   f"mount -t tmpfs -o size=1m none {d}"],
                                  capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0


class TmpfsSarpd(SarpdProc):
    """sarpd in its own mount namespace, its data directory a size-limited tmpfs."""

    def argv(self) -> list[str]:
        script = f'mount -t tmpfs -o size={TMPFS_SIZE} none "$0" && exec "$@"'
        return ["unshare", "-m", "sh", "-c", script, str(self.data_dir), *super().argv()]

    def inside(self, name: str) -> Path:
        """A path in the tmpfs, as this (outside) process reaches it."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root") / self.data_dir.relative_to("/") / name


def fill(path: Path) -> int:
    """Write `path` until the filesystem is full; the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    total = 0
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            data = b"\0" * chunk
            try:
                while True:
                    total += os.write(fd, data)
            except OSError as exc:
                assert exc.errno in (28, 27), exc  # ENOSPC (EFBIG at a size limit)
    finally:
        os.close(fd)
    return total


def resume_insert(c: SyncClient, k: int, timeout: float = 10.0) -> None:
    """Insert k, retrying while sarpd still answers `unavailable`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            c.insert(tokens=seq(k), meta=meta(k))
            return
        except SarpError as exc:
            assert_refused(exc)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("backend", ["rocksdb", "bloomstore"])
def test_full_filesystem(sarpd_factory: Launcher, backend: str) -> None:
    """(WiredTiger preallocates its 2 MB log files, so a full disk reaches it only at
    the next log file; the injected faults above cover it.)"""
    if not _can_mount_tmpfs():
        pytest.skip("mounting a tmpfs in a private mount namespace is not allowed here")
    data = sarpd_factory.base / f"tmpfs-{backend}"
    data.mkdir()
    proc = TmpfsSarpd(data, backend=backend)
    sarpd_factory.procs.append(proc)
    proc.start()
    acked: list[int] = []
    with SyncClient(proc.socket) as c:
        for k in range(3):
            c.insert(tokens=seq(k), meta=meta(k))
            acked.append(k)
        filler = proc.inside("filler")
        assert fill(filler) > 0
        refused = 0
        for k in range(1000, 1200):  # until the engine's own slack is used up
            try:
                c.insert(tokens=seq(k), meta=meta(k))
            except SarpError as exc:
                assert_refused(exc)
                assert "No space left on device" in exc.message, exc.message
                refused += 1
                if refused == 3:
                    break
            else:
                acked.append(k)
        assert refused == 3, "the full filesystem never refused an insert"
        assert_all_matched(c, acked)
        with pytest.raises(SarpError, match="No space left on device") as snap:
            c.snapshot()
        assert snap.value.code == "unavailable"
        filler.unlink()
        resume_insert(c, 2000)  # RocksDB retries its reopen once a second
        acked.append(2000)
        for k in range(2001, 2003):
            c.insert(tokens=seq(k), meta=meta(k))
            acked.append(k)
        assert_all_matched(c, acked)
        assert_check_clean(c)
    assert proc.stop() == 0, proc.log()
