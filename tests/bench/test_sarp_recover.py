"""sarp's recovery child (tools.bench.sarp_recover): the budget split, one timed
recovery answering a match, and a child that imports only what a restart needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from sarpd.config import IndexConfig
from tools.bench.sarp_index import SarpBench
from tools.bench.sarp_recover import (
    BLOCK_MAP_SHARE,
    DELTA_SHARE,
    OWN_CACHE_SHARE,
    SEGMENT_BYTES,
    recover_once,
    split_budget,
    within_budget,
)
from tools.bench.spawn import REPO

U64 = np.uint64


def test_the_budget_is_split_between_the_engine_and_the_segment_cache() -> None:
    budget = 10 << 20
    engine, segments = split_budget(budget)
    own = int(budget * OWN_CACHE_SHARE)
    cfg = within_budget(IndexConfig(), budget)  # the block map and the deltas (issue 24)
    assert cfg.block_map_bytes == int(budget * BLOCK_MAP_SHARE) > 0
    assert cfg.delta_bytes == int(budget * DELTA_SHARE) > 0
    assert engine == budget - own - cfg.block_map_bytes - cfg.delta_bytes
    assert segments == own // SEGMENT_BYTES
    assert engine + segments * SEGMENT_BYTES + cfg.block_map_bytes + cfg.delta_bytes <= budget
    assert split_budget(0) == (0, 0)


def test_recover_once_opens_recovers_and_answers(tmp_path: Path) -> None:
    bench = SarpBench()
    bench.open(tmp_path, "rocksdb", 1 << 20)
    seqs = [np.arange(1, 4, dtype=U64), np.arange(100, 300, dtype=U64)]
    bench.insert_many(seqs, ["", ""], [np.full(3, 7, U64), np.full(200, 9, U64)])
    bench.flush()
    bench.close()
    ix, out = recover_once(tmp_path, "rocksdb", 1 << 20, True, False)
    try:
        assert out["seconds"] > 0 and out["full_scan"] is False
        assert ix.counters.blocks == 203  # everything back: the snapshot was loaded
    finally:
        ix.close()


def test_the_child_imports_neither_the_harness_nor_the_bulk_builder(tmp_path: Path) -> None:
    """What the child's spawn time counts is a restart's imports, not the bench's."""
    code = ("import sys, runpy; sys.argv = ['x', '--data-dir', sys.argv[1]]; "
            "runpy.run_module('tools.bench.sarp_recover', run_name='__main__'); "
            "import json; print(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith(('tools', 'sarpd')))))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True,
                         capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.splitlines()
    assert json.loads(out[0])["rerouted"] == 0  # an empty directory: nothing to re-route
    loaded = set(json.loads(out[1]))
    assert "sarpd.core.index" in loaded
    assert not loaded & {"tools.bench.api", "tools.bench.sarp_index", "sarpd.core.bulk",
                         "sarpd.daemon", "sarpd.client"}
