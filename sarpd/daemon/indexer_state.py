"""The indexer API's own state beside the index: one SQLite file in the data directory
(``indexer.sqlite``, WAL mode), so that after a restart (kill -9 included) sarpd
resubscribes every registered worker and goes on from where each listener stopped.

    meta(key TEXT PRIMARY KEY, value BLOB)      "registry": `Registry.to_json`
    watermarks(slot INTEGER PRIMARY KEY, seq)   the newest batch applied, per worker
    engine(slot, hash, id BLOB, tiers, local, parent, pos, salt, PRIMARY KEY (slot, hash))
        WITHOUT ROWID                           each worker's engine hash -> its sarp id,
                                                tiers, Dynamo hash, parent's engine hash
                                                (NULL: none), position and salt term
                                                (`Entry`; 64-bit values as SQLite's signed
                                                integers)

A registration is written (and synced) before /register answers. The engine maps and
the watermarks are written together, in one transaction, as soon as batches were
applied (`flush`; the daemon groups what accumulates while one runs): a watermark
never runs ahead of the map changes of the batches it covers, and every batch past it
is replayed from the engine at the restart (the translation of a batch is the same
again, and applying it again ends where its first application did; meanwhile a query
may see the older states it passes through, so little is replayed). These commits are
written to the WAL without an fsync (synchronous=NORMAL): a kill -9 of sarpd loses
none of them; a power loss may lose the last ones, which then costs a replay. Writes
run on a thread of their own (`asyncio.to_thread`): the file is only touched by one
call at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from sarpd.indexer.ingest import Change
from sarpd.indexer.workers import Registry

__all__ = ["FILENAME", "IndexerStore"]

FILENAME = "indexer.sqlite"
_SIGN = 1 << 63
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB);
CREATE TABLE IF NOT EXISTS watermarks (slot INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS engine (slot INTEGER NOT NULL, hash INTEGER NOT NULL, id BLOB,
    tiers INTEGER NOT NULL, local INTEGER NOT NULL, parent INTEGER, pos INTEGER NOT NULL,
    salt INTEGER NOT NULL, PRIMARY KEY (slot, hash)) WITHOUT ROWID;
"""


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= _SIGN else h


class IndexerStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILENAME
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def load_registry(self, block_tokens: int) -> Registry:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='registry'").fetchone()
        if row is None:
            return Registry(block_tokens)
        return Registry.from_json(row[0], block_tokens, str(self.path))

    def watermarks(self) -> dict[int, int]:
        with self._lock:
            return dict(self._db.execute("SELECT slot, seq FROM watermarks").fetchall())

    def engine_rows(self) -> Iterator[Change]:
        with self._lock:
            rows = self._db.execute(
                "SELECT slot, hash, id, tiers, local, parent, pos, salt FROM engine").fetchall()
        m = 1 << 64
        for slot, h, raw, tiers, local, parent, pos, salt in rows:
            yield (slot, h % m, bytes(raw), tiers, local % m,
                   None if parent is None else parent % m, pos, salt % m)

    def save_registry(self, reg: Registry) -> None:
        with self._lock:
            self._db.execute("PRAGMA synchronous=FULL")  # synced before /register answers
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('registry', ?)",
                             (reg.to_json(),))

    def flush(self, changes: list[Change], watermarks: dict[int, int],
              forgotten: set[int]) -> None:
        """Map changes (in order: the last one of a hash wins) and watermarks in one
        transaction; `forgotten`: slots whose workers are gone (their watermarks
        dropped; their maps were cleared through `changes`)."""
        final: dict[tuple[int, int], tuple[bytes, int, int, int | None, int, int]] = {}
        for s, h, raw, t, local, parent, pos, salt in changes:
            final[(s, _signed(h))] = (raw, t, _signed(local),
                                      None if parent is None else _signed(parent), pos,
                                      _signed(salt))
        with self._lock:
            db = self._db
            db.execute("PRAGMA synchronous=NORMAL")  # the registry's saves are FULL
            db.execute("BEGIN")
            try:
                db.executemany("DELETE FROM watermarks WHERE slot = ?",
                               [(s,) for s in forgotten])
                db.executemany("INSERT OR REPLACE INTO engine VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               [(*k, *e) for k, e in final.items() if e[1]])
                db.executemany("DELETE FROM engine WHERE slot = ? AND hash = ?",
                               [k for k, e in final.items() if not e[1]])
                db.executemany("INSERT OR REPLACE INTO watermarks VALUES (?, ?)",
                               list(watermarks.items()))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
