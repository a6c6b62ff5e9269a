"""The quick scale measurement (tools/scale.py): build an index of about N blocks,
then recover it in fresh processes from the snapshot and by a full scan."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tools.scale import build, main, recover_once


def test_build_then_recover_once(tmp_path: Path) -> None:
    built = build(tmp_path, "rocksdb", blocks=500, seed=1, batch=32)
    assert built["blocks"] >= 500 and built["segments"] > 0 and built["build_s"] > 0
    assert 0 < built["directory_bytes_per_block"] < 8
    assert list((tmp_path / "snapshots").iterdir())
    rec = recover_once(tmp_path, "rocksdb")
    assert rec["full_scan"] == 0.0 and rec["to_first_match_s"] >= rec["recover_s"] > 0


def test_cli_measures_snapshot_and_full_scan(tmp_path: Path) -> None:
    data = tmp_path / "scale"
    data.mkdir()
    (data / "stale").write_text("wiped first")
    res = CliRunner().invoke(main, ["--blocks", "300", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert set(out) == {"build", "from_snapshot", "full_scan"}
    assert out["from_snapshot"]["full_scan"] == 0.0 and out["full_scan"]["full_scan"] == 1.0
    assert not (data / "stale").exists()
