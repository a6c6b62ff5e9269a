"""The indexer API's own state beside the index: one SQLite file in the data directory
(``indexer.sqlite``, WAL mode), so that after a restart (kill -9 included) sarpd
resubscribes every registered worker and goes on from where each listener stopped.

    meta(key TEXT PRIMARY KEY, value BLOB)      "registry": `Registry.to_json`
    watermarks(slot INTEGER PRIMARY KEY, seq)   the newest batch applied, per worker
    maplog(n INTEGER PRIMARY KEY, rows INTEGER, data BLOB)
                                                the engine maps as a log: each `data`
                                                a msgpack array of records, replayed in
                                                `n` order (`Ingest.load`): a map
                                                operation as called (`Logged`: add,
                                                drop, clear) or a block's state
                                                ``[slot, engine hash, sarp id (bin 16),
                                                tiers, Dynamo hash, parent's engine hash
                                                or nil, position, salt term]``
                                                (`Change`, a snapshot's rows); `rows`:
                                                the blocks they name (`weight`)
    engine(slot, hash, id, tiers, local, parent, pos, salt)   the maps as one row per
                                                block (files written before the log;
                                                read first, emptied by the next compaction)

A registration is written (and synced) before /register answers. The maps' changes
and the watermarks are written together, in one transaction, as soon as batches were
applied (`flush`; the daemon groups what accumulates while one runs): one blob per
flush, not a row per block (a B-tree row per change cost a third of sarpd's CPU under
the fleet's events). A watermark never runs ahead of the map changes of the batches
it covers, and every batch past it is replayed from the engine at the restart (the
translation of a batch is the same again, and applying it again ends where its first
application did; meanwhile a query may see the older states it passes through, so
little is replayed). When the log holds more than `compact_due` says, a flush writes
the whole maps instead (`snapshot`: the state after its changes) and drops the log
before it, in the same transaction. These commits go to the WAL without an fsync
(synchronous=NORMAL): a kill -9 of sarpd loses none of them; a power loss may lose the
last ones, which then costs a replay. Writes run on a thread of their own
(`asyncio.to_thread`): the file is only touched by one call at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgpack

from sarpd.indexer.ingest import Change, Entry, Logged
from sarpd.indexer.workers import Registry

__all__ = ["COMPACT_MIN_ROWS", "FILENAME", "IndexerStore", "Snapshot", "weight"]

FILENAME = "indexer.sqlite"
COMPACT_MIN_ROWS = 1 << 16  # the log is compacted past max(this, 4x the live blocks)
LIVE_FACTOR = 4
CHUNK_ROWS = 8_192  # rows per blob of a snapshot (its unpacking holds the GIL: ~3 ms)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB);
CREATE TABLE IF NOT EXISTS watermarks (slot INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS maplog (n INTEGER PRIMARY KEY, rows INTEGER NOT NULL,
    data BLOB NOT NULL);
"""
_LEGACY = "SELECT name FROM sqlite_master WHERE type='table' AND name='engine'"
Snapshot = Sequence[tuple[int, dict[int, Entry]]]  # every worker's map: (slot, blocks)


def weight(records: Sequence[Logged]) -> int:
    """The blocks `records` name (what replaying them costs)."""
    return sum(len(r[2]) if r[0] == "add" or r[0] == "drop" else 1 for r in records)


class IndexerStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILENAME
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        # changes in the log since its last snapshot: counted by `engine_rows` (reading
        # them here would read every blob before the index even opens)
        self.logged = 0

    def load_registry(self, block_tokens: int) -> Registry:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='registry'").fetchone()
        if row is None:
            return Registry(block_tokens)
        return Registry.from_json(row[0], block_tokens, str(self.path))

    def watermarks(self) -> dict[int, int]:
        with self._lock:
            return dict(self._db.execute("SELECT slot, seq FROM watermarks").fetchall())

    def engine_rows(self) -> Iterator[Logged]:
        """Every change saved, in order (the last one of a hash wins); read once, at
        the start, before any `flush`."""
        with self._lock:
            legacy = self._db.execute(_LEGACY).fetchone() is not None
            rows = (self._db.execute("SELECT slot, hash, id, tiers, local, parent, pos, "
                                     "salt FROM engine").fetchall() if legacy else [])
            blobs = self._db.execute("SELECT rows, data FROM maplog ORDER BY n").fetchall()
        self.logged = sum(n for n, _ in blobs)
        m = 1 << 64
        for slot, h, raw, tiers, local, parent, pos, salt in rows:
            yield (slot, h % m, bytes(raw), tiers, local % m,
                   None if parent is None else parent % m, pos, salt % m)
        for _, data in blobs:
            yield from msgpack.unpackb(data, use_list=False)

    def compact_due(self, changes: int, live: int) -> bool:
        """Whether the log, with `changes` more rows (`weight`), should give way to a
        snapshot of the `live` blocks (past max(COMPACT_MIN_ROWS, LIVE_FACTOR * live)
        rows: a snapshot costs a pass over every live block, the log a replay at the
        next start, read off the query path)."""
        return self.logged + changes > max(COMPACT_MIN_ROWS, LIVE_FACTOR * live)

    def save_registry(self, reg: Registry) -> None:
        with self._lock:
            self._db.execute("PRAGMA synchronous=FULL")  # synced before /register answers
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('registry', ?)",
                             (reg.to_json(),))

    def flush(self, changes: list[Logged], watermarks: dict[int, int],
              forgotten: set[int], snapshot: Snapshot | None = None) -> None:
        """Map operations and watermarks in one transaction; `forgotten`: slots whose
        workers are gone (their watermarks dropped; their maps were cleared through
        `changes`). `snapshot`: the whole maps after `changes`, written instead of them,
        the log before it dropped."""
        if snapshot is None:
            blobs = [(weight(changes), msgpack.packb(changes))] if changes else []
        else:
            blobs = [(len(part), msgpack.packb(part)) for part in _chunks(snapshot)]
        with self._lock:
            db = self._db
            db.execute("PRAGMA synchronous=NORMAL")  # the registry's saves are FULL
            db.execute("BEGIN")
            try:
                if snapshot is not None:
                    db.execute("DELETE FROM maplog")
                    if db.execute(_LEGACY).fetchone() is not None:
                        db.execute("DROP TABLE engine")
                db.executemany("DELETE FROM watermarks WHERE slot = ?",
                               [(s,) for s in forgotten])
                db.executemany("INSERT INTO maplog (rows, data) VALUES (?, ?)", blobs)
                db.executemany("INSERT OR REPLACE INTO watermarks VALUES (?, ?)",
                               list(watermarks.items()))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        added = sum(n for n, _ in blobs)
        self.logged = added if snapshot is not None else self.logged + added

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _chunks(snapshot: Snapshot) -> Iterator[list[Change]]:
    part: list[Change] = []
    for slot, blocks in snapshot:
        for h, e in blocks.items():
            part.append((slot, h, *e))
            if len(part) == CHUNK_ROWS:
                yield part
                part = []
    if part:
        yield part
