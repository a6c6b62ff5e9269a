"""sarpd/daemon/indexer_state.py: the registry, the watermarks and the engine maps in
indexer.sqlite: a flush keeps the last change of each hash, forgets the watermarks of
gone workers, and a reopened file gives back what was flushed (64-bit hashes too); a
snapshot replaces the log; files of the older row-per-block layout are read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from sarpd.daemon.indexer_state import (
    _LEGACY,
    COMPACT_MIN_ROWS,
    FILENAME,
    LIVE_FACTOR,
    IndexerStore,
)
from sarpd.indexer.ingest import Entry, Ingest
from sarpd.indexer.workers import Registry


def test_a_flush_and_a_reopen_give_back_the_maps_watermarks_and_registry(
        tmp_path: Path) -> None:
    reg = Registry(16)
    w = reg.register("m", "default", 2**64 - 1, 0, 16, "tcp://h:1", "tcp://h:2")
    reg.add_peer("http://peer:1")
    ing = Ingest(reg)
    big = 2**64 - 5
    ids = np.arange(8, dtype=np.uint64).reshape(4, 2)
    m = ing.engine_map(w.slot)
    m.add((1, 2, big), ids[:3].tobytes(), 0, [10, 20, 2**63 + 3], None, 0, 2**64 - 9)
    m.drop((2,), 0)  # gone within the same flush
    m.add((2,), ids[3:].tobytes(), 1, [21], 1, 1, 0)  # ... and back, on another tier
    m.add((5,), ids[:1].tobytes(), 0, [50], None, 0, 0)
    store = IndexerStore(tmp_path)
    store.save_registry(reg)
    store.flush(list(ing.journal), {w.slot: 41, 9: 3}, set())
    store.flush([], {}, {9})  # a gone worker: its watermark dropped
    m.drop((5,), 0)
    store.flush(list(ing.journal[-1:]), {w.slot: 42}, set())
    store.close()

    again = IndexerStore(tmp_path)
    back = again.load_registry(16)
    assert back.workers == reg.workers and back.peers == ["http://peer:1"]
    assert again.watermarks() == {w.slot: 42}
    loaded = Ingest(back)
    loaded.load(again.engine_rows())
    assert loaded.maps[w.slot].blocks == m.blocks
    assert set(m.blocks) == {1, 2, big} and m.blocks[2][1:] == (0b10, 21, 1, 1, 0)
    assert m.blocks[big][2] == 2**63 + 3 and m.blocks[big][5] == 2**64 - 9
    again.close()


def test_a_new_file_is_an_empty_registry(tmp_path: Path) -> None:
    store = IndexerStore(tmp_path)
    assert store.load_registry(16).workers == {} and store.watermarks() == {}
    assert list(store.engine_rows()) == []
    store.close()


def _maps(store: IndexerStore, reg: Registry) -> dict[int, dict[int, Entry]]:
    ing = Ingest(reg)
    ing.load(store.engine_rows())
    return {slot: m.blocks for slot, m in ing.maps.items()}


def test_a_snapshot_replaces_the_log_and_a_reopen_reads_the_same_maps(tmp_path: Path) -> None:
    reg = Registry(16)
    w = reg.register("m", "default", 7, 0, 16, "tcp://h:1", None)
    ing = Ingest(reg)
    m = ing.engine_map(w.slot)
    ids = np.arange(16, dtype=np.uint64).reshape(8, 2)
    store = IndexerStore(tmp_path)
    m.add((1, 2, 3, 4), ids[:4].tobytes(), 0, [11, 12, 13, 14], None, 0, 0)
    store.flush(ing.journal[:], {w.slot: 1}, set())
    assert store.logged == 4
    m.drop((3, 4), 0)
    m.add((9,), ids[4:5].tobytes(), 2, [19], 2, 2, 5)
    del ing.journal[:4]
    assert not store.compact_due(len(ing.journal), len(m.blocks))  # far below the floor
    store.flush([], {w.slot: 2}, set(), snapshot=[(w.slot, dict(m.blocks))])
    assert store.logged == 3  # the snapshot's rows: the log before it is gone
    assert list(store.engine_rows()) == [(w.slot, h, *e) for h, e in m.blocks.items()]
    store.close()
    again = IndexerStore(tmp_path)
    assert again.watermarks() == {w.slot: 2}
    assert _maps(again, reg) == {w.slot: m.blocks}
    assert again.logged == 3  # counted as the log is read
    again.close()


def test_the_log_is_due_for_compaction_past_a_multiple_of_the_live_blocks(
        tmp_path: Path) -> None:
    store = IndexerStore(tmp_path)
    store.logged = COMPACT_MIN_ROWS
    assert not store.compact_due(0, 10) and store.compact_due(1, 10)
    store.logged = LIVE_FACTOR * COMPACT_MIN_ROWS
    assert not store.compact_due(0, COMPACT_MIN_ROWS)
    assert store.compact_due(1, COMPACT_MIN_ROWS)
    store.close()


def test_a_file_of_the_row_per_block_layout_is_read_then_compacted_away(
        tmp_path: Path) -> None:
    """Files written before the log kept a row per block in `engine`: read first, the
    log's changes after them, the table dropped by the next snapshot."""
    db = sqlite3.connect(tmp_path / FILENAME)
    db.executescript("""CREATE TABLE engine (slot INTEGER NOT NULL, hash INTEGER NOT NULL,
        id BLOB, tiers INTEGER NOT NULL, local INTEGER NOT NULL, parent INTEGER,
        pos INTEGER NOT NULL, salt INTEGER NOT NULL, PRIMARY KEY (slot, hash)) WITHOUT ROWID;""")
    db.execute("INSERT INTO engine VALUES (1, -1, ?, 1, -2, NULL, 0, -3)", (b"a" * 16,))
    db.execute("INSERT INTO engine VALUES (1, 5, ?, 1, 6, -1, 1, -3)", (b"b" * 16,))
    db.commit()
    db.close()
    store = IndexerStore(tmp_path)
    top = 2**64 - 1
    store.flush([(1, 5, b"", 0, 0, None, 0, 0)], {}, set())  # 5 forgotten after
    assert list(store.engine_rows()) == [(1, top, b"a" * 16, 1, top - 1, None, 0, top - 2),
                                         (1, 5, b"b" * 16, 1, 6, top, 1, top - 2),
                                         (1, 5, b"", 0, 0, None, 0, 0)]
    store.flush([], {}, set(), snapshot=[(1, {top: (b"a" * 16, 1, top - 1, None, 0, top - 2)})])
    assert list(store.engine_rows()) == [(1, top, b"a" * 16, 1, top - 1, None, 0, top - 2)]
    store.close()
    db = sqlite3.connect(tmp_path / FILENAME)
    assert db.execute(_LEGACY).fetchone() is None
    db.close()
