"""sarpd/daemon/indexer_state.py: the registry, the watermarks and the engine maps in
indexer.sqlite: a flush keeps the last change of each hash, forgets the watermarks of
gone workers, and a reopened file gives back what was flushed (64-bit hashes too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sarpd.daemon.indexer_state import IndexerStore
from sarpd.indexer.ingest import Ingest
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
    m.add((1, 2, big), ids[:3], 0, [10, 20, 2**63 + 3], None, 0, 2**64 - 9)
    m.drop((2,), 0)  # gone within the same flush
    m.add((2,), ids[3:], 1, [21], 1, 1, 0)  # ... and back, on another tier
    m.add((5,), ids[:1], 0, [50], None, 0, 0)
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
