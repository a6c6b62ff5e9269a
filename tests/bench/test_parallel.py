"""The parallel match bench (tools.bench.parallel): its JSON, and answers from several
threads equal to one thread's (never its speed)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sarpd.config import IndexConfig
from sarpd.core import SarpIndex, open_backend
from tools.bench.parallel import main, make_batches, measure, parse_threads, preload


def test_a_tiny_run_reports_every_thread_count_and_its_conditions() -> None:
    res = CliRunner().invoke(main, ["--threads", "1,2", "--blocks", "3000", "--batches", "12",
                                    "--batch", "4", "--runs", "2", "--json", "-"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [r["threads"] for r in out["results"]] == [1, 2]
    for r in out["results"]:
        assert r["match_blocks_per_s"] >= r["match_blocks_per_s_median"] > 0
        assert len(r["runs"]) == 2
        for run in r["runs"]:
            assert run["batches"] == 12 and run["matched_blocks"] > 0
            assert run["seconds"] > 0 and run["cpu_s"] >= 0 and run["others_cpu_s"] >= 0
            assert run["matched_blocks"] == out["matched_blocks_per_pass"]  # the same batches
    assert out["results"][0]["speedup"] == 1.0
    assert out["exact"] is True and out["blocks"] >= 3000 and out["batch"] == 4
    assert out["backend"] == "rocksdb" and out["direct_io"] is False
    assert out["page_cache"] == "used" and out["segment_cache"] > 0
    assert set(out["native"]) >= {"match", "verify"} and out["cpus"] >= 1
    assert out["queried_blocks_per_pass"] >= out["matched_blocks_per_pass"] > 0


@pytest.mark.parametrize("threads", [2, 3])
def test_answers_from_threads_are_the_answers_of_one_thread(threads: int) -> None:
    """Every batch answered on several threads at once (each once, and cycling for a
    while) is answered as one thread answers it, blocks and metas bit for bit."""
    root = Path(tempfile.mkdtemp(prefix="sarp-parallel-test-"))
    index = SarpIndex(open_backend("rocksdb", root / "db", cache_bytes=8 << 20), IndexConfig(),
                      None, sync=False)
    try:
        index.recover()
        loaded = preload(index, ["ultrachat", "codeact"], 4000, seed=3)
        assert index.counters.blocks >= 4000 and loaded.prompts
        index.store.cache_segments = 8  # reads go to the backend, the cache churns
        work = make_batches(loaded.prompts, 40, 5, seed=3)
        one = measure(index, work, 1, None)
        assert sorted(one.got) == list(range(40)) and one.blocks > 0
        many = measure(index, work, threads, None)
        assert many.batches == 40 and many.blocks == one.blocks
        for i, got in many.got.items():
            assert got == one.got[i]
        timed = measure(index, work, threads, 0.2)  # cycling: batches again and again
        assert timed.batches > 0
        for i, got in timed.got.items():
            assert all(g == one.got[i][0] for g in got)
    finally:
        index.close()
        shutil.rmtree(root, ignore_errors=True)


def test_thread_counts_are_parsed_and_checked() -> None:
    assert parse_threads("1,2, 4,2") == [1, 2, 4]
    for bad in ("", "0,1", "a"):
        with pytest.raises(click.BadParameter):
            parse_threads(bad)
