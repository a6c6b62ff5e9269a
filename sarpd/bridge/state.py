"""The bridge's persisted state: its position file and its namespace map.

Position file (JSON, replaced atomically: write ``<path>.tmp``, fsync, rename, fsync
the directory)::

    {"format": 1, "endpoint": "tcp://...", "worker": 3,
     "last_seq": 41207,              # newest batch whose every request sarpd acknowledged
     "namespaces": ["", "lora=sql"]} # every namespace this worker's blocks went to

Namespace map (``<path>.nsmap``, msgpack, written at a clean stop, replaced by
rename)::

    {"format": 1, "last_seq": 41207,  # valid for exactly this position
     "ns": ["", "lora=sql"],          # the namespaces, sorted
     "map": [[hash, index into ns], ...]}

Invariant: ``last_seq`` never passes a batch that sarpd has not acknowledged in full,
so a restarted bridge asks the engine to replay from ``last_seq + 1`` and loses
nothing. The file is rewritten after every round of requests (atomic rename) and
fsync'd at most every `save_interval_s`, so after a crash of the bridge process it
is exact, and after a crash of the machine it may lag by that interval: those
events are applied again, which is harmless except that a store whose parent was
evicted within that interval is then refused as `unknown_parent` (a block missing
from the index, never one that is not in the engine).

A position file that cannot be read, of another format, or malformed raises
`ConfigError` (an operator's file); one of another endpoint or worker is ignored. A
damaged or stale namespace map is ignored (the translator guesses instead,
`sarpd.events.mapping`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgpack

from sarpd.errors import ConfigError

STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Position:
    last_seq: int | None
    namespaces: tuple[str, ...]


def load_position(path: Path | None, endpoint: str, worker: int) -> Position:
    """The saved position, or an empty one (no file, or another endpoint/worker)."""
    if path is not None and not path.parent.is_dir():
        raise ConfigError(f"state file {path}: directory {path.parent} does not exist "
                          "(create it, or give another --state)")
    if path is None or not path.exists():
        return Position(None, ())
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"state file {path}: unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"state file {path}: expected a JSON object, got "
                          f"{type(doc).__name__}")
    if doc.get("format") != STATE_FORMAT:
        raise ConfigError(f"state file {path}: format {doc.get('format')!r}, "
                          f"expected {STATE_FORMAT}")
    if doc.get("endpoint") != endpoint or doc.get("worker") != worker:
        return Position(None, ())
    last = doc.get("last_seq")
    ns = doc.get("namespaces") or []
    if (last is not None and type(last) is not int) or not all(isinstance(n, str) for n in ns):
        raise ConfigError(f"state file {path}: last_seq or namespaces malformed")
    return Position(last, tuple(ns))


def save_position(
    path: Path,
    endpoint: str,
    worker: int,
    last_seq: int | None,
    namespaces: Iterable[str],
    durable: bool = True,
) -> None:
    """Replace the position file atomically; `durable`: also fsync (a machine crash
    keeps it), else only a crash of the process is covered."""
    doc = {
        "format": STATE_FORMAT,
        "endpoint": endpoint,
        "worker": worker,
        "last_seq": last_seq,
        "namespaces": sorted(namespaces),
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def nsmap_path(state: Path) -> Path:
    return state.with_name(state.name + ".nsmap")


def save_nsmap(state: Path, last_seq: int | None, ns_of: dict[int, str]) -> None:
    """At a clean stop: the translator's hash -> namespace map, valid for exactly
    this position (layout in the module doc), so a restart need not guess."""
    names = sorted(set(ns_of.values()))
    index = {n: i for i, n in enumerate(names)}
    doc = {"format": STATE_FORMAT, "last_seq": last_seq, "ns": names,
           "map": [[h, index[n]] for h, n in ns_of.items()]}  # fmt: skip
    tmp = nsmap_path(state).with_name(nsmap_path(state).name + ".tmp")
    tmp.write_bytes(msgpack.packb(doc))
    os.replace(tmp, nsmap_path(state))


def load_nsmap(state: Path | None, last_seq: int | None) -> dict[int, str] | None:
    """The map saved at a clean stop at `last_seq`; None if there is none for it."""
    if state is None or last_seq is None or not nsmap_path(state).exists():
        return None
    try:
        doc = msgpack.unpackb(nsmap_path(state).read_bytes(), strict_map_key=False)
        if doc.get("format") != STATE_FORMAT or doc.get("last_seq") != last_seq:
            return None
        names = doc["ns"]
        return {int(h): str(names[i]) for h, i in doc["map"]}
    except (OSError, ValueError, KeyError, IndexError, TypeError, msgpack.UnpackException):
        return None  # a damaged map is only a lost optimisation: guess instead


class StateFile:
    """One bridge's position file (and namespace map) and when it was last written:
    `save` rewrites the position when it moved, fsync'ing at most every
    `save_interval_s` (or when forced, at a stop)."""

    __slots__ = ("_saved", "_saved_at", "_synced", "endpoint", "path", "save_interval_s",
                 "worker")

    def __init__(self, path: Path | None, endpoint: str, worker: int,
                 save_interval_s: float) -> None:
        self.path = path
        self.endpoint = endpoint
        self.worker = worker
        self.save_interval_s = save_interval_s
        self._saved: tuple[int | None, int] = (None, 0)  # (last_seq, namespaces) on disk
        self._saved_at = 0.0
        self._synced = True

    def load(self) -> tuple[Position, dict[int, str] | None]:
        """The saved position and the namespace map saved with it (None: none)."""
        pos = load_position(self.path, self.endpoint, self.worker)
        self._saved = (pos.last_seq, len(set(pos.namespaces)))
        return pos, load_nsmap(self.path, pos.last_seq)

    def save(self, last_seq: int | None, namespaces: Collection[str],
             force: bool = False) -> None:
        """Rewrite the position when it moved; fsync at most every save_interval_s."""
        now = time.monotonic()
        current = (last_seq, len(namespaces))
        durable = force or now - self._saved_at >= self.save_interval_s
        if self.path is None or (current == self._saved and (self._synced or not durable)):
            return
        save_position(self.path, self.endpoint, self.worker, last_seq, namespaces,
                      durable=durable)  # fmt: skip
        self._saved, self._synced = current, durable
        if durable:
            self._saved_at = now

    def save_map(self, last_seq: int | None, ns_of: dict[int, str]) -> None:
        """At a clean stop: the namespace map, valid for exactly `last_seq`."""
        if self.path is not None:
            save_nsmap(self.path, last_seq, ns_of)
