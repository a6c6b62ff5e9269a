"""Directory growth and match latency at growing index sizes (tools.bench.growth),
and the timing of one directory merge."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner


def test_growth_measures_each_size(tmp_path: Path) -> None:
    from tools.bench.growth import main as growth

    out, png = tmp_path / "g.json", tmp_path / "g.png"
    res = CliRunner().invoke(growth, ["--sizes", "3000,6000", "--probe", "codeact",
                                      "--data-dir", str(tmp_path / "d"), "--json", str(out),
                                      "--plot", str(png)])
    assert res.exit_code == 0, res.output
    points = json.loads(out.read_text())
    blocks = [p["blocks"] for p in points]  # the probes' own inserts add to the fill
    assert blocks[0] >= 3000 and blocks[1] >= blocks[0] + 3000
    for p in points:
        assert p["index"] == "sarp" and p["probe_turns"] > 100
        assert p["throughput_rps"] > 0 and p["recovery_s"] > 0
        assert p["match_us_max"] >= p["match_us_p99"] >= 0 and p["disk_bytes"] > 0
        assert 0 < p["directory_bytes_per_block"] < 2
    assert png.stat().st_size > 0


def test_growth_times_one_merge() -> None:
    from tools.bench.growth import main as growth

    res = CliRunner().invoke(growth, ["--merge-base", "20000"])
    assert res.exit_code == 0, res.output
    assert "one merge of 8,193 delta entries into 20,000:" in res.output
