"""`python -m tools.bench.cold_start` (tools/bench/cold_start.py): a real store built by
sarp's bulk path, its files evicted, a spawned process that recovers it and answers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tools.bench import cold_start
from tools.bench.sarp_index import SarpBench


def build(root: Path, blocks: int = 2000) -> int:
    rng = np.random.default_rng(4)
    seqs = [rng.integers(1, 2**63, blocks // 8, dtype=np.uint64) for _ in range(8)]
    metas = [np.zeros(len(s), np.uint64) for s in seqs]
    bench = SarpBench()
    bench.bulk_open(root, "rocksdb", 8 << 20, [(seqs, [""] * 8, metas)])
    bench.close()
    return sum(len(s) for s in seqs)


@pytest.mark.parametrize("layout", ["bench", "sarpd"])
def test_a_cold_start_recovers_from_the_snapshot(tmp_path: Path, layout: str) -> None:
    blocks = build(tmp_path / "d")
    if layout == "sarpd":  # snapshots/<backend>/, as sarpd and `sarpctl import` keep them
        snaps = tmp_path / "d" / "snapshots"
        snaps.rename(tmp_path / "rocksdb")
        snaps.mkdir()
        (tmp_path / "rocksdb").rename(snaps / "rocksdb")
    assert cold_start.evict(tmp_path / "d") > 0
    res = CliRunner().invoke(cold_start.main, ["--data-dir", str(tmp_path / "d"), "--runs", "2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["blocks"] == blocks and len(doc["runs"]) == 2
    for run in doc["runs"]:
        assert run["full_scan"] == 0 and run["evicted_bytes"] > 0
        assert 0 < run["in_process_s"] < run["spawn_s"]
        assert run["in_process_s"] >= run["recover_s"]
    spawns = [r["spawn_s"] for r in doc["runs"]]
    assert doc["median"]["spawn_s"] == sum(spawns) / 2  # the median of two


def test_a_store_without_a_snapshot_is_refused(tmp_path: Path) -> None:
    build(tmp_path / "d", 400)
    shutil.rmtree(tmp_path / "d" / "snapshots")
    res = CliRunner().invoke(cold_start.main, ["--data-dir", str(tmp_path / "d"), "--runs", "1"])
    assert res.exit_code == 1 and "no usable snapshot, the start was a full scan" in res.output
