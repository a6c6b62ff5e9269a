"""tools/bench/preload.py: the fill has the workload's shape, every index gets the
same one, a filled index is reused from the cache, and at 1e8 blocks the in-memory
indexes are left out with a note."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tools.bench import preload as pl
from tools.bench.runner import index_factories, run_bench
from tools.bench.sarp_index import SarpBench, capped, reference
from tools.bench.workloads import get_workload


def codeact_shape() -> pl.Shape:
    return pl.shape_of(list(get_workload("codeact").turns()))


def test_shape_reads_system_prompts_and_turns() -> None:
    shape = codeact_shape()
    lens = [len(p) for _, p in shape.prompts]
    assert len(lens) == 12  # one per session
    assert min(lens) >= 1024 // 16  # every codeact prompt shares the 1,024 common tokens
    assert max(lens) > min(lens)  # ... and some share a whole system prompt
    assert shape.turn_blocks.min() > 0 and shape.session_turns.min() >= 10
    assert shape.digest() == codeact_shape().digest()


def test_sequences_branch_share_prompts_and_count_new_blocks() -> None:
    shape = codeact_shape()
    prompts = {p.tobytes() for _, p in shape.prompts}
    seqs = list(pl.sequences(shape, 200_000, seed=1))
    assert sum(n for _, _, n in seqs) == 200_000
    starts = sum(1 for _, s, n in seqs
                 if any(s[: len(s) - n].tobytes() == p for p in prompts))
    branches = len(seqs) - starts  # sequences that leave another one mid-way
    assert starts > 10 and branches > 0.1 * len(seqs)
    ids = np.concatenate([s[len(s) - n:] for _, s, n in seqs])
    assert len(np.unique(ids)) == len(ids) == 200_000  # new blocks are new
    again = list(pl.sequences(shape, 200_000, seed=1))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(seqs, again, strict=True))


def test_preload_fills_then_reuses_the_cache(tmp_path: Path) -> None:
    shape = codeact_shape()
    steps: list[int] = []
    args = ("rocksdb", 1 << 20, shape, 20_000, 0, tmp_path / "cache")
    assert not pl.preload("sarp", SarpBench, tmp_path / "a", *args, progress=steps.append)
    assert sum(steps) == 20_000
    assert pl.preload("sarp", SarpBench, tmp_path / "b", *args)  # copied, not rebuilt
    for d in ("a", "b"):
        ix = SarpBench()
        ix.open(tmp_path / d, "rocksdb", 1 << 20)
        blocks = ix.stats()["blocks"]
        assert isinstance(blocks, int) and blocks >= 20_000
        ix.close()


def test_sarp_py_reuses_sarps_cached_store(tmp_path: Path) -> None:
    """The reference writes what sarp writes: one cached fill serves both."""
    args = ("rocksdb", 1 << 20, codeact_shape(), 5_000, 0, tmp_path / "cache")
    assert not pl.preload("sarp", SarpBench, tmp_path / "a", *args)
    assert pl.preload("sarp-py", reference, tmp_path / "b", *args)  # copied, not rebuilt
    assert not pl.preload("sarp-cap4", capped, tmp_path / "c", *args)  # its own store
    ix = reference()
    ix.open(tmp_path / "b", "rocksdb", 1 << 20)
    try:
        blocks = ix.stats()["blocks"]
        assert isinstance(blocks, int) and blocks >= 5_000
    finally:
        ix.close()


def test_memory_indexes_left_out_at_1e8() -> None:
    names = ["sarp", "dram-blockhash", "ssd-blockhash", "redis"]
    assert pl.left_out(names, 10_000_000) == (names, "")
    kept, note = pl.left_out(names, 100_000_000)
    assert kept == ["sarp", "ssd-blockhash"]
    assert "dram-blockhash, redis left out" in note


def test_run_bench_preloads_every_index_the_same(tmp_path: Path) -> None:
    wl = get_workload("codeact")
    names = ["sarp", "dram-blockhash", "ssd-blockhash"]
    assert set(names) <= set(index_factories())
    res = run_bench(wl, names, "rocksdb", tmp_path, preload=30_000,
                    preload_cache=tmp_path / "cache")
    assert res.to_json()["preload_blocks"] == 30_000
    assert res.cache_bytes >= (res.blocks + 30_000) * 16 // 10
    reused = {r.index: r.tokens_reused for r in res.results}
    assert reused["sarp"] == reused["dram-blockhash"] == reused["ssd-blockhash"] > 0
    assert len(list((tmp_path / "cache").iterdir())) == len(names)


def test_cli_preload_options(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from tools.bench.cli import bench

    args = ["-w", "codeact", "--index", "sarp,dram-blockhash", "--preload", "5000",
            "--preload-cache", str(tmp_path / "c"), "--json", "-"]
    res = CliRunner().invoke(bench, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["preload_blocks"] == 5000
    assert [r["index"] for r in doc["results"]] == ["sarp", "dram-blockhash"]
    assert len(list((tmp_path / "c").iterdir())) == 2
