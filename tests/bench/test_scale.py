"""Recovery at scale (tools.bench.scale, `sarpctl bench --recovery-only`): the
generated sequences, the fill, and a measured cold recovery on tiny sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.bench.baselines import baseline_class
from tools.bench.runner import IndexFailure
from tools.bench.scale import SEQ_BLOCKS, ScaleResult, fill, recovery_at_scale, sequences


def test_sequences_total_the_blocks_and_share_prompts() -> None:
    seqs = list(sequences(5 * SEQ_BLOCKS + 100, seed=2))
    assert [len(s) for s in seqs] == [SEQ_BLOCKS] * 5 + [100]
    heads = [s[:64].tobytes() for s in seqs]
    assert len(set(heads)) < len(heads) or len(seqs) < 8  # some share a prompt
    everything = np.concatenate(seqs)
    assert (everything != 0).all()
    assert [s.tobytes() for s in sequences(3000, 2)] == [s.tobytes() for s in sequences(3000, 2)]


def test_fill_inserts_every_block(tmp_path: Path) -> None:
    index = baseline_class("dram-blockhash")()
    index.open(tmp_path / "d", "memory", 0)
    done: list[int] = []
    try:
        fill(index, 3 * SEQ_BLOCKS, done.append)
        first = next(sequences(3 * SEQ_BLOCKS))
        assert len(index.match_many([first], [""])[0]) == SEQ_BLOCKS
    finally:
        index.close()
    assert sum(done) == 3 * SEQ_BLOCKS


def test_recovery_at_scale_on_tiny_sizes(tmp_path: Path) -> None:
    bars: list[str] = []

    def progress(name: str, total: int) -> object:
        bars.append(name)
        return lambda n: None

    res = recovery_at_scale(["sarp", "ssd-blockhash"], 2000, "rocksdb", tmp_path,
                            progress)  # type: ignore[arg-type]
    assert [r.index for r in res] == bars == ["sarp", "ssd-blockhash"]
    for r in res:
        assert isinstance(r, ScaleResult)
        assert r.blocks == 2000 and r.build_s > 0 and r.recovery_s > 0 and r.disk_bytes > 0
        assert r.recovery_spawn_s > r.recovery_s
    with pytest.raises(ValueError, match="unknown index nope"):
        recovery_at_scale(["nope"], 10, "rocksdb", tmp_path)


def test_sarp_takes_the_bulk_path_unless_an_ssd_baseline_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.bench.sarp_index import SarpBench

    calls: list[Path] = []
    real = SarpBench.bulk_open

    def spy(self: SarpBench, data_dir: Path, *args: object, **kw: object) -> None:
        calls.append(data_dir)
        real(self, data_dir, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SarpBench, "bulk_open", spy)
    res = recovery_at_scale(["sarp", "dram-blockhash"], 3000, "rocksdb", tmp_path / "a")
    assert calls == [tmp_path / "a" / "sarp"]
    assert "0 segments re-routed" in res[0].detail  # the bulk build's snapshot is whole
    recovery_at_scale(["sarp", "ssd-blockhash"], 3000, "rocksdb", tmp_path / "b")
    assert len(calls) == 1  # inserts for every SSD index


def test_bulk_open_serves_what_inserts_would(tmp_path: Path) -> None:
    from tools.bench.sarp_index import SarpBench

    seqs = list(sequences(3 * SEQ_BLOCKS + 300, seed=4))
    metas = [np.arange(len(s), dtype=np.uint64) + 7 for s in seqs]
    bulk, ref = SarpBench(), SarpBench()
    bulk.bulk_open(tmp_path / "bulk", "rocksdb", 1 << 20, [(seqs, [""] * len(seqs), metas)])
    ref.open(tmp_path / "ref", "rocksdb", 1 << 20)
    ref.insert_many(seqs, [""] * len(seqs), metas)
    probes = [s[: len(s) // 2] for s in seqs] + [s[:64] for s in seqs] + seqs
    got, want = bulk.match_many(probes, [""] * len(probes)), ref.match_many(
        probes, [""] * len(probes))
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert sum(len(g) for g in got) > 0
    bulk.close()
    ref.close()
def test_a_failing_index_costs_only_its_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.bench.test_runner import with_broken_index

    with_broken_index(monkeypatch)
    import tools.bench.runner as runner
    import tools.bench.scale as scale

    monkeypatch.setattr(scale, "index_factories", runner.index_factories)
    broken, good = recovery_at_scale(["broken", "ssd-blockhash"], 1500, "rocksdb", tmp_path,
                                     direct_io=True)
    assert broken == IndexFailure("broken", "broken: RuntimeError: broken on purpose")
    assert isinstance(good, ScaleResult) and good.recovery_s > 0
