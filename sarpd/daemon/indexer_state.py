"""The indexer API's own state beside the index: one SQLite file in the data directory
(``indexer.sqlite``, WAL mode), so that after a restart (kill -9 included) sarpd
resubscribes every registered worker and goes on from where each listener stopped.

    meta(key TEXT PRIMARY KEY, value BLOB)      "registry": `Registry.to_json`
    watermarks(slot INTEGER PRIMARY KEY, seq)   the newest batch applied, per worker
    engine(slot, hash, id BLOB, tiers, PRIMARY KEY (slot, hash)) WITHOUT ROWID
                                                each worker's engine hash -> sarp id
                                                (hash as SQLite's signed 64-bit int)

A registration is written (and synced) before /register answers. The engine maps and
the watermarks are written together, in one transaction, about once a second and at a
stop (`flush`): a watermark never runs ahead of the map changes of the batches it
covers, and every batch past it is replayed from the engine at the restart (the
translation of a batch is the same again; applying it again changes nothing that its
first application did not). Writes run on a thread of their own (`asyncio.to_thread`):
the file is only touched by one call at a time.
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
    tiers INTEGER NOT NULL, PRIMARY KEY (slot, hash)) WITHOUT ROWID;
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
            rows = self._db.execute("SELECT slot, hash, id, tiers FROM engine").fetchall()
        for slot, h, raw, tiers in rows:
            yield slot, h % (1 << 64), bytes(raw), tiers

    def save_registry(self, reg: Registry) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('registry', ?)",
                             (reg.to_json(),))

    def flush(self, changes: list[Change], watermarks: dict[int, int],
              forgotten: set[int]) -> None:
        """Map changes (in order: the last one of a hash wins) and watermarks in one
        transaction; `forgotten`: slots whose workers are gone (their watermarks
        dropped; their maps were cleared through `changes`)."""
        final: dict[tuple[int, int], tuple[bytes, int]] = {}
        for s, h, raw, t in changes:
            final[(s, _signed(h))] = (raw, t)
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany("DELETE FROM watermarks WHERE slot = ?",
                               [(s,) for s in forgotten])
                db.executemany("INSERT OR REPLACE INTO engine VALUES (?, ?, ?, ?)",
                               [(s, h, raw, t) for (s, h), (raw, t) in final.items() if t])
                db.executemany("DELETE FROM engine WHERE slot = ? AND hash = ?",
                               [k for k, (_, t) in final.items() if not t])
                db.executemany("INSERT OR REPLACE INTO watermarks VALUES (?, ?)",
                               list(watermarks.items()))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
