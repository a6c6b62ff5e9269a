"""The cold-start process of a baseline (tools.bench.baselines.recover): it opens the
baseline on its data directory, answers one match of the probe and prints one JSON
line with the probe's metas and the time of each step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools.bench.baselines import baseline_class
from tools.bench.baselines.recover import main

U64 = np.uint64


def test_recover_answers_the_probe_from_disk(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "ssd"
    ids = np.arange(1, 101, dtype=U64)
    index = baseline_class("ssd-blockhash")(sync=True)
    index.open(data, "rocksdb", 1 << 20)
    index.insert_many([ids], ["t"], [np.arange(100, dtype=U64) + U64(7)])
    index.close()
    probe = tmp_path / "probe.npy"
    np.save(probe, np.concatenate([ids[:60], np.array([999], dtype=U64)]))

    code = main(["ssd-blockhash", "--data-dir", str(data), "--backend", "rocksdb",
                 "--cache-bytes", str(1 << 20), "--probe", str(probe), "--ns", "t",
                 "--options", json.dumps({"sync": True})])
    assert code == 0
    (line,) = capsys.readouterr().out.splitlines()
    report = json.loads(line)
    assert report["metas"] == list(range(7, 67))  # 60 known blocks, then an unknown one
    assert all(report[k] >= 0 for k in ("import_s", "open_s", "match_s"))
    assert report["detail"] == ""


def test_recover_in_another_namespace_matches_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "radix"
    ids = np.arange(1, 81, dtype=U64)
    index = baseline_class("segment-radix")()
    index.open(data, "rocksdb", 1 << 20)
    index.insert_many([ids], ["a"], [np.zeros(80, dtype=U64)])
    index.close()  # writes the snapshot
    probe = tmp_path / "probe.npy"
    np.save(probe, ids)
    args = ["segment-radix", "--data-dir", str(data), "--backend", "rocksdb",
            "--cache-bytes", str(1 << 20), "--probe", str(probe)]
    assert main([*args, "--ns", "b"]) == 0
    assert json.loads(capsys.readouterr().out)["metas"] == []
    assert main([*args, "--ns", "a", "--options", json.dumps({"cap_bytes": None})]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metas"] == [0] * 80 and "resident from the snapshot" in report["detail"]
