"""The replay behind `sarpctl bench` (tools.bench.runner): batches, the cache
budget, one replay through an index, a whole run on two indexes, results as JSON."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sarpd.core import native
from tools.bench.api import Ids, RecoveryResult, Turn
from tools.bench.baselines import baseline_class
from tools.bench.baselines._common import U64
from tools.bench.baselines.blockhash import SsdBlockHash
from tools.bench.baselines.segment_radix import SegmentRadix
from tools.bench.preload import preload, shape_of
from tools.bench.runner import (
    FIT_DIR,
    BenchResult,
    IndexFailure,
    IndexResult,
    batches,
    cache_budget,
    fitted_radix,
    index_factories,
    replay,
    run_bench,
    run_index,
)
from tools.bench.workloads import get_workload


class Broken(SsdBlockHash):
    """An index that fails on purpose, in the middle of its replay."""

    name = "broken"

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        if self.backend_reads():
            raise RuntimeError("broken on purpose")
        return super().match_many(prompts, ns)


class Timed(SsdBlockHash):
    """A real index whose successive recoveries report the scripted timings."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.timings = [(0.5, 0.9), (0.2, 0.7), (0.4, 0.3)]
        self.recoveries = 0

    def recover(self) -> RecoveryResult:
        real = super().recover()
        seconds, spawn = self.timings[self.recoveries]
        self.recoveries += 1
        return RecoveryResult(seconds, spawn, real.detail)


def with_broken_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `broken` one of the indexes the harness knows (tests/bench/test_cli.py too)."""
    import tools.bench.runner as runner

    known = runner.index_factories()
    monkeypatch.setattr(runner, "index_factories", lambda: {**known, "broken": Broken})


def turn(session: int, prompt: list[int], extra: list[int] | None = None,
         ns: str = "") -> Turn:
    seq = np.array(prompt + (extra or []), dtype=np.uint64)
    return Turn(session=session, ns=ns, prompt=seq[: len(prompt)], sequence=seq)


def test_batches_keep_one_turn_per_session() -> None:
    turns = list(get_workload("codeact").turns())
    seen = 0
    for start, chunk in batches(turns, 16):
        assert start == seen
        keys = [(t.ns, t.session) for t in chunk]
        assert len(keys) == len(set(keys)) and 0 < len(chunk) <= 16
        seen += len(chunk)
    assert seen == len(turns)


def test_batches_split_at_the_size_and_at_a_repeated_session() -> None:
    turns = [turn(0, [1]), turn(1, [2]), turn(0, [1, 3]), turn(2, [4]), turn(3, [5])]
    assert [(s, len(c)) for s, c in batches(turns, 2)] == [(0, 2), (2, 2), (4, 1)]
    assert [(s, len(c)) for s, c in batches(turns, 16)] == [(0, 2), (2, 3)]
    assert batches([], 4) == []


def test_cache_budget_is_a_tenth_of_the_blockhash_store() -> None:
    assert cache_budget([]) == (0, 1 << 20)
    few = [turn(0, [1, 2, 3]), turn(1, [1, 2], [9])]
    assert cache_budget(few) == (4, 1 << 20)  # at least 1 MiB
    many = [turn(0, list(range(1, 700_001)))]
    assert cache_budget(many) == (700_000, 1_120_000)


def test_replay_counts_reuse_and_sees_the_previous_turn(tmp_path: Path) -> None:
    index = baseline_class("dram-blockhash")()
    index.open(tmp_path / "d", "memory", 0)
    turns = [turn(0, [1, 2], [3]), turn(1, [1, 7]), turn(0, [1, 2, 3, 4]), turn(1, [1, 7, 8])]
    seen: list[tuple[float, float]] = []
    try:
        match_us, total, inserting, reused, queried = replay(
            index, turns, 16, on_batch=lambda m, i: seen.append((m, i)))
        metas = index.match_many([np.array([1, 2, 3, 4], dtype=np.uint64)], [""])[0]
    finally:
        index.close()
    assert len(match_us) == 4 and len(seen) == 2  # two batches: a session repeats
    assert reused == 0 + 0 + 3 + 2 and queried == 2 + 2 + 4 + 3
    assert total >= inserting >= 0
    assert metas.tolist() == [1, 1, 1, 3]  # meta = the turn's number; first insert wins


def test_run_bench_on_two_indexes_and_json_roundtrip(tmp_path: Path) -> None:
    wl = get_workload("codeact")
    res = run_bench(wl, ["dram-blockhash", "ssd-blockhash"], "rocksdb", tmp_path)
    a, b = res.results
    assert (a.index, b.index) == ("dram-blockhash", "ssd-blockhash")
    assert a.tokens_reused == b.tokens_reused > 0 and a.requests == res.requests
    assert a.backend == "rocksdb" and a.recovery_s > 0 and b.disk_bytes > 0
    back = BenchResult.from_json(res.to_json())
    assert res.to_json()["recovery_runs"] == back.recovery_runs == 3
    assert back.by_name()["ssd-blockhash"].tokens_reused == b.tokens_reused
    assert back.by_name()["ssd-blockhash"].match_us == []  # per-request list not saved
    assert "match_us" not in res.to_json()["results"][0]
    with pytest.raises(ValueError, match="unknown index nope"):
        run_bench(wl, ["nope"], "rocksdb", tmp_path)


def test_recovery_is_timed_recovery_runs_times_and_the_fastest_reported(
        tmp_path: Path) -> None:
    turns = list(get_workload("codeact").turns())[:40]
    index = Timed()
    res = run_index("timed", index, turns, tmp_path, "rocksdb", 1 << 20, 8, recovery_runs=3)
    assert index.recoveries == 3
    assert (res.recovery_s, res.recovery_spawn_s) == (0.2, 0.3)
    assert res.recovery_detail.endswith("fastest of 3 recoveries")
    assert res.tokens_reused > 0  # the index still answers after its recoveries
    with pytest.raises(ValueError, match="recovery_runs must be at least 1, got 0"):
        run_index("timed", Timed(), turns, tmp_path / "b", "rocksdb", 1 << 20, 8,
                  recovery_runs=0)


def test_index_factories_put_sarp_first() -> None:
    names = list(index_factories())
    assert names[:4] == ["sarp", "sarp-py", "sarp-cap4", "sarp-no-locators"]
    assert "segment-radix" in names


def test_sarp_and_sarp_py_report_native_paths_and_kernel_efficiency(tmp_path: Path) -> None:
    turns = list(get_workload("codeact").turns())[:48]
    sarp, py = (run_index(name, index_factories()[name](), turns, tmp_path, "rocksdb", 1 << 20,
                          8, recovery_runs=1) for name in ("sarp", "sarp-py"))
    assert py.native == {"match": False, "hash": False, "write": False}
    assert py.verifier == "numpy"
    assert sarp.native is not None and set(sarp.native) == {"match", "hash", "write"}
    assert sarp.native["match"] == native.status()["match"]
    assert sarp.tokens_reused == py.tokens_reused > 0  # same answers both ways
    assert sarp.kernel_efficiency > 0 and py.kernel_efficiency > 0
    doc = BenchResult("w", "", 48, 0, 0, [sarp, py]).to_json()["results"]
    assert doc[1]["native"] == py.native and doc[0]["kernel_efficiency"] == sarp.kernel_efficiency
    dram = run_index("dram-blockhash", baseline_class("dram-blockhash")(), turns, tmp_path,
                     "rocksdb", 1 << 20, 8, recovery_runs=1)
    assert dram.native is None and dram.kernel_efficiency == 0.0


def test_a_failing_index_costs_only_its_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_broken_index(monkeypatch)
    wl = get_workload("codeact")
    res = run_bench(wl, ["ssd-blockhash", "broken", "dram-blockhash"], "rocksdb", tmp_path,
                    direct_io=True)
    good, broken, exact = res.results
    assert broken == IndexFailure("broken", "broken: RuntimeError: broken on purpose")
    assert isinstance(good, IndexResult) and isinstance(exact, IndexResult)
    assert good.tokens_reused == exact.tokens_reused > 0
    assert [f.index for f in res.failed()] == ["broken"]
    doc = res.to_json()
    assert doc["results"][1] == {"index": "broken", "error": broken.error}
    assert doc["schema"] == 2 and doc["direct_io"] is True and doc["preload_blocks"] == 0
    back = BenchResult.from_json(doc)
    assert back.failed() == [broken] and back.direct_io and back.schema == 2
    # the counters behind the new columns
    assert good.reads_per_match > 1 and exact.reads_per_match == 0
    assert good.memory_bytes > 0 and exact.memory_bytes > good.memory_bytes
    assert good.routing_bytes == 0
    assert 0 < good.recovery_s < good.recovery_spawn_s


def tree_digest(root: Path) -> str:
    """Every file under `root`, by name and content."""
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def per_node(index: SegmentRadix) -> Callable[[], float]:
    """A recovery time of 1 ms per resident node (a model: fits are deterministic)."""
    return lambda: 1e-3 * index.resident_nodes()


PRELOAD = 20_000  # blocks: a tree about the size of codeact's own


def test_with_a_preload_the_cap_is_fitted_on_the_preloaded_store(tmp_path: Path) -> None:
    turns = list(get_workload("codeact").turns())
    _, cache = cache_budget(turns, PRELOAD)
    store = tmp_path / "segment-radix"
    preload("segment-radix", SegmentRadix, store, "rocksdb", cache, shape_of(turns), PRELOAD)
    before = tree_digest(store)
    trial_ix = SegmentRadix()
    _, trial = fitted_radix(trial_ix, turns, tmp_path, "rocksdb", cache, 16, 1e9,
                            measure=per_node(trial_ix))
    # a target the workload's tree alone meets: the trial replay needs no cap ...
    target = 1e-3 * trial.total_nodes
    assert trial.cap_bytes is None and trial.total_nodes > 0
    ix = SegmentRadix()
    index, fit = fitted_radix(ix, turns, tmp_path, "rocksdb", cache, 16, target,
                              preloaded=store, measure=per_node(ix))
    # ... but the preloaded tree (preload + replay) does: the cap is below its whole tree
    assert fit.total_nodes > 1.5 * trial.total_nodes and fit.reached
    assert fit.cap_bytes is not None and 0 < fit.cap_bytes < fit.whole_bytes
    assert 0.5 * trial.total_nodes < fit.resident_nodes <= trial.total_nodes
    assert isinstance(index, SegmentRadix) and index.cap_bytes == fit.cap_bytes
    assert tree_digest(store) == before and not (tmp_path / FIT_DIR).exists()
    res = run_index("segment-radix", index, turns, tmp_path, "rocksdb", cache, 16)
    tree, runs = res.recovery_detail.split("; ")[-2:]
    assert runs == "fastest of 3 recoveries"
    resident, _, total = tree.split(" ")[:3]
    assert int(total) == fit.total_nodes  # the measured run's tree: preload + replay
    assert 0 < int(resident) < fit.total_nodes  # under the fitted cap
    assert res.routing_bytes <= max(fit.cap_bytes, 200)


def test_run_bench_fits_the_radix_cap_after_the_preload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_bench hands the preloaded store to the fit, and the measured run recovers
    the preloaded tree under the fitted cap (a model target: half the tree's nodes)."""
    import tools.bench.runner as runner

    seen: list[Path | None] = []
    fit = runner.fitted_radix

    def model_fit(index: Any, *args: Any, preloaded: Path | None = None) -> tuple[Any, Any]:
        seen.append(preloaded)
        *head, _target, direct_io = args
        return fit(index, *head, 0.5, direct_io, preloaded=preloaded,
                   measure=lambda: index.resident_nodes() / max(1, index.total_nodes()))

    monkeypatch.setattr(runner, "fitted_radix", model_fit)
    res = run_bench(get_workload("codeact"), ["segment-radix", "sarp"], "rocksdb",
                    tmp_path, preload=PRELOAD)
    assert res.failed() == []
    assert seen == [tmp_path / "segment-radix"]
    detail = res.by_name()["segment-radix"].recovery_detail
    load, runs, note = detail.split("; ")[-3:]
    assert runs == "fastest of 3 recoveries"
    assert note.startswith("cap fitted to 1.5x sarp's recovery (")
    assert "on a copy of the preloaded store after the workload's replay: cap " in note
    resident, _, total = load.split(" ")[:3]
    assert f"of {int(total):,} nodes resident" in note  # the fit's tree is the measured one
    assert 0 < int(resident) <= int(total) // 2  # the fitted cap held in the measured run


def test_no_index_gives_its_engine_more_than_the_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SSD index opens its backend with at most the run's budget as the engine's
    `cache_bytes` (its whole memory: cache and write buffers), sarp's with its engine
    share (the bulk build's backend too), and its memory stays within the budget."""
    import tools.bench.baselines._common as common
    import tools.bench.sarp_index as sarp_index
    import tools.bench.sarp_recover as sarp_recover
    from backends.base import Backend

    opened: list[tuple[str, int]] = []
    real = sarp_index.open_backend

    def spy(name: str, path: Path, *, cache_bytes: int, direct_io: bool = False) -> Backend:
        opened.append((name, cache_bytes))
        return real(name, path, cache_bytes=cache_bytes, direct_io=direct_io)

    monkeypatch.setattr(common, "open_backend", spy)
    monkeypatch.setattr(sarp_index, "open_backend", spy)  # the bulk build's
    monkeypatch.setattr(sarp_recover, "open_backend", spy)  # every open's
    budget = 2 << 20
    seqs = [np.arange(1 + 1000 * i, 1 + 1000 * i + 256, dtype=np.uint64) for i in range(8)]
    metas = [np.ones(256, np.uint64)] * 8
    for name, factory in index_factories().items():
        if name == "redis":
            continue
        index = factory()
        opened.clear()
        index.open(tmp_path / name, "rocksdb", budget, direct_io=True)
        try:
            index.insert_many(seqs, [""] * 8, metas)
            engine = sarp_recover.split_budget(budget)[0] if name.startswith("sarp") else budget
            assert opened == [("rocksdb", engine)], name
            if name != "dram-blockhash":  # its dict is its whole footprint, outside
                assert index.memory_bytes() <= budget, name
        finally:
            index.close()
    opened.clear()
    bulk = sarp_index.SarpBench()
    bulk.bulk_open(tmp_path / "bulk", "rocksdb", budget, [(seqs, [""] * 8, metas)])
    bulk.close()
    assert opened == [("rocksdb", sarp_recover.split_budget(budget)[0])] * 2
