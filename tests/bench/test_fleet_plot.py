"""tools/bench/fleet_plot.py: the sweep read from a fleet result, and a real PNG."""

from __future__ import annotations

from pathlib import Path

from tools.bench.fleet_plot import plot, sweep

DOC = {"workers": 2, "requests": 10, "transport": "bridge", "results": [
    {"index": "sarp", "offered_block_ops_per_s": 400.0, "block_ops_per_s": 300.0,
     "query_us_p99": 2000.0},
    {"index": "sarp", "offered_block_ops_per_s": 100.0, "block_ops_per_s": 100.0,
     "query_us_p99": 900.0},
    {"index": "dynamo-radix", "skipped": "not installed"},
]}


def test_sweep_is_by_offered_load_per_index() -> None:
    assert sweep(DOC) == {"sarp": [(100.0, 100.0, 900.0), (400.0, 300.0, 2000.0)]}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "fleet.png"
    plot(DOC, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
