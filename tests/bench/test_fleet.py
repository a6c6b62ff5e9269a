"""`python -m tools.bench.fleet`: a whole run in-process (every index that is here
agrees with the model; a missing one is reported as skipped), the table, and the
JSON the CLI writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.bench.fleet_workload import WORKERS, small_timeline
from tools.bench import fleet_run
from tools.bench.fleet import main, parse_speedups, run_fleet, table
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Timeline


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return small_timeline(seed=5, n=120)


def test_speedups_repeat_or_comma_separate() -> None:
    assert parse_speedups(("4,16", "64")) == [4.0, 16.0, 64.0]


def test_run_fleet_in_process_every_index_agrees(tmp_path: Path, timeline: Timeline,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_run, "dynamo_available", lambda: False)
    cfg = FleetConfig(WORKERS, WORKERS)
    doc = run_fleet(timeline, list(fleet_run.INDEXES), [0.0, 50.0], cfg, "in-process", tmp_path)
    rows = [r for r in doc["results"] if "agreement" in r]
    assert {r["index"] for r in rows} >= {"sarp", "sarp-ns-per-worker"}
    for r in rows:
        assert r["agreement"] == 1.0 and r["holder_blocks_error"] == 0, r
        assert r["queries_answered"] == timeline.totals.requests
        assert r["block_ops_per_s"] > 0 and r["query_us_p50"] > 0
        assert (r["offered_block_ops_per_s"] is None) == (r["speedup"] == 0)
    paced = next(r for r in rows if r["index"] == "sarp" and r["speedup"] == 50)
    assert paced["offered_block_ops_per_s"] == pytest.approx(
        timeline.totals.block_ops / (timeline.span_ms / 1000 / 50))
    assert paced["seconds"] >= paced["window_s"]  # paced by the timeline
    assert paced["recovery_s"] is None  # the crash run is at the first speedup
    crash = next(r for r in rows if r["index"] == "sarp" and r["speedup"] == 0)
    assert crash["recovery_s"] > 0 and crash["agreement_after_recovery"] == 1.0
    skipped = doc["results"][0]
    assert skipped["index"] == "dynamo-radix" and skipped["speedup"] is None
    assert "dynamo-radix" in table(doc) and "not installed" in table(doc)
    assert {q["vs"] for q in doc["ratios"]} >= {"sarp-ns-per-worker"}


def test_cli_writes_config_and_results(tmp_path: Path) -> None:
    sizes = [4 + i % 5 for i in range(40)]  # 16-token blocks: 2-4 ids of 32 tokens
    rows = [{"timestamp": 100 * i, "input_length": 16 * m, "output_length": 2,
             "hash_ids": [0, *range(10 * i + 1, 10 * i + (m + 1) // 2)]}
            for i, m in enumerate(sizes)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "fleet.json"
    res = CliRunner().invoke(main, [
        "--trace", str(trace), "--trace-block-tokens", "32", "--workers", "3",
        "--gpu-blocks", "8", "--speedup", "0", "--in-process", "--index", "sarp",
        "--no-crash", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert list(doc)[:3] == ["schema", "benchmark", "trace"]
    assert doc["workers"] == 3 and doc["holders"] == 3 and doc["transport"] == "in-process"
    assert doc["requests"] == 40 and doc["block_ops"] > 0
    (r,) = doc["results"]
    assert r["index"] == "sarp" and r["agreement"] == 1.0
    assert "sarp" in res.output
    # the default transport: a real bridge per engine into a sarpd of its own
    res = CliRunner().invoke(main, [
        "--trace", str(trace), "--trace-block-tokens", "32", "--workers", "3",
        "--gpu-blocks", "8", "--speedup", "0", "--index", "sarp", "--no-crash",
        "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["transport"] == "bridge" and doc["results"][0]["agreement"] == 1.0
