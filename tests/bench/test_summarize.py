"""Markdown tables from saved bench results (tools.bench.summarize): one table per
file, for a full run and for a --recovery-only run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.test_report import bench
from tools.bench.report import markdown_table
from tools.bench.summarize import SchemaMixError, main


def test_one_table_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = tmp_path / "full.json"
    full.write_text(json.dumps(bench().to_json()))
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"schema": 2, "blocks": 5000, "backend": "rocksdb", "results": [
        {"index": "sarp", "build_s": 1.25, "recovery_s": 0.5, "recovery_spawn_s": 0.75,
         "memory_bytes": 2048, "disk_bytes": 10_000},
        {"index": "redis", "build_s": 3.0, "recovery_s": 1.5, "recovery_spawn_s": 1.5,
         "memory_bytes": 4096, "disk_bytes": 20_000},
        {"index": "ssd-blockhash", "error": "ssd-blockhash: OSError: gone"}]}))
    main([str(full), str(rec)])
    out = capsys.readouterr().out
    table = markdown_table(bench())
    assert out.startswith(table)
    assert "### recovery at 5,000 blocks (rocksdb)" in out
    assert "| sarp | 1.2 | 0.500 | 0.750 | 1.00 | 2,048 | 10,000 |" in out
    assert "| redis | 3.0 | 1.500 | 1.500 | 3.00 | 4,096 | 20,000 |" in out
    assert "FAILED ssd-blockhash: ssd-blockhash: OSError: gone" in out


def test_schema_1_and_2_files_are_not_mixed(tmp_path: Path) -> None:
    new = tmp_path / "new.json"
    new.write_text(json.dumps(bench().to_json()))
    old_doc = bench().to_json()
    del old_doc["schema"]  # what every run before schema 2 wrote
    old = tmp_path / "old.json"
    old.write_text(json.dumps(old_doc))
    main([str(old)])  # one schema at a time is fine
    with pytest.raises(SchemaMixError, match=r"old.json is schema 1, .*new.json is schema 2"):
        main([str(new), str(old)])


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        main([str(tmp_path / "none.json")])
