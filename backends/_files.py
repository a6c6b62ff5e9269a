"""Small helpers every on-disk engine adapter shares: a per-process guard against
opening one directory twice (the engines' own refusals name neither the directory
nor the other open), and the bytes a directory holds on disk."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from backends.errors import BackendIOError
from bloomstore.files import copy_synced, fsync_dir  # one copy of these file helpers

__all__ = ["OpenPaths", "copy_synced", "dir_bytes", "fsync_dir"]


class OpenPaths:
    """Directories an engine has open in this process (resolved paths)."""

    def __init__(self, engine: str, cls_name: str) -> None:
        self.engine, self.cls_name = engine, cls_name
        self._lock = threading.Lock()
        self._paths: set[str] = set()

    def claim(self, key: str) -> None:
        with self._lock:
            if key in self._paths:
                raise BackendIOError(f"{self.engine} {key}: already open in this process "
                                     f"(close the other {self.cls_name} on it first)")
            self._paths.add(key)

    def release(self, key: str) -> None:
        with self._lock:
            self._paths.discard(key)


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files directly in `path` (0 if it cannot be listed)."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:  # removed by a compaction or log recycling meanwhile
            continue
    return total

