"""tools/bench/import_scale.py: import N blocks with `sarpctl import`, then time
recovery in-process and of a real sarpd (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tools.bench.import_scale import main


def test_import_then_recovery_on_a_tiny_size(tmp_path: Path) -> None:
    d = tmp_path / "d"
    res = CliRunner().invoke(main, ["--blocks", "20000", "--data-dir", str(d)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    imp = doc["import"]
    assert imp["blocks"] >= 20_000 and imp["blocks_per_s"] > 0 and imp["records"] > imp["blocks"]
    rec = doc["recovery_in_process"]
    assert rec["rerouted"] == 0 and rec["full_scan"] == 0 and rec["in_process_s"] > 0
    sarpd = doc["recovery_sarpd"]
    assert sarpd["sarpd_blocks"] == imp["blocks"] and sarpd["spawn_to_first_match_s"] > 0
    assert not d.exists() and not (tmp_path / "d.jsonl").exists()  # removed without --keep
