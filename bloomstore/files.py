"""Small file helpers: whole writes at an offset, fsync of files and directories,
atomic replacement, and a file handle that scans may keep alive."""

from __future__ import annotations

import os
from pathlib import Path


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of `data` at `offset` (a short write is retried; its error raised)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(f"pwrite returned {n} at offset {offset + done}")
        done += n


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise EOFError(f"short read: {len(data)} of {size} bytes at offset {offset}")
    return data


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_synced(src: Path, dst: Path) -> None:
    """Copy the file `src` to the new file `dst`, fsync'd."""
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        while chunk := fi.read(1 << 20):
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())


def write_atomic(path: Path, data: bytes, fsync: bool) -> None:
    """Replace `path` by `data` all at once: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def file_bytes(path: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total


class DataFile:
    """An open file descriptor. A scan may hold one after the store moved on to a new
    file generation (compaction unlinks the old file): the descriptor stays valid
    until the last holder drops it or the store closes (`close()` sets fd to -1,
    so a stale holder never reads a reused descriptor number). `uncached` (the
    store's `direct_io` tuning): after each read, and after each fsync of the whole
    file, posix_fadvise(DONTNEED) drops its pages from the OS page cache, so a read
    is served by the store's own cache or by the device, never by the page cache
    (a written page stays cached until it is written back and synced or read)."""

    __slots__ = ("fd", "path", "uncached")

    def __init__(self, path: Path, create: bool, truncate: bool = False,
                 uncached: bool = False) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
        self.path = path
        self.uncached = uncached
        self.fd = -1  # until the open succeeds (__del__ then has nothing to close)
        self.fd = os.open(path, flags, 0o644)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def read(self, size: int, offset: int) -> bytes:
        if self.fd < 0:
            raise OSError(f"{self.path} is closed")
        data = pread_exact(self.fd, size, offset)
        if self.uncached:  # the page cache must not serve the next read of it
            os.posix_fadvise(self.fd, offset, size, os.POSIX_FADV_DONTNEED)
        return data

    def write(self, data: bytes | memoryview, offset: int) -> None:
        pwrite_all(self.fd, data, offset)

    def sync(self) -> None:
        os.fdatasync(self.fd)
        if self.uncached:  # written back, so clean: drop what the writes left cached
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def size(self) -> int:
        return os.fstat(self.fd).st_size
