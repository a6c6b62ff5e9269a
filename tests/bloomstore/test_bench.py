"""bloomstore/bench.py: the sarp-shaped key mix and one small measurement run (its
table's rows; no assertion on speed)."""

from __future__ import annotations

from pathlib import Path

from bloomstore.bench import run, sarp_batches


def test_sarp_batches_have_the_key_mix_of_one_insert() -> None:
    batches = sarp_batches(200, seed=1)
    assert len(batches) == 4 and sarp_batches(200, seed=1) == batches  # seeded
    for seg, batch in enumerate(batches):
        kinds = sorted(k[:1] for k in batch)
        assert kinds == [b"B"] * 64 + [b"L", b"S"]
        assert len(batch[b"S" + seg.to_bytes(8, "big")]) == 1600
        assert batch[b"L" + seg.to_bytes(8, "big")] == seg.to_bytes(8, "little")
        assert all(len(v) == 12 for k, v in batch.items() if k[:1] == b"B")


def test_run_reports_every_row(tmp_path: Path) -> None:
    rows = run(tmp_path, keys=2000, bits_per_key=10)
    assert list(rows) == [
        "keys", "bits/key, hashes", "pages, max chain", "target FP / measured FP",
        "extra page reads / lookup", "RAM B/key (index, +buffers)", "disk bytes/key",
        "writes (keys/s)", "lookups present (batches of 100)",
        "lookups absent (batches of 100)", "reopen", "L scan newest 1 %", "compaction"]
    assert rows["keys"] == "2,046" and rows["bits/key, hashes"] == "10, 7"
    assert rows["L scan newest 1 %"].startswith("0 keys")  # 31 segments: 1 % of none
    assert (tmp_path / "bench-10").is_dir()
