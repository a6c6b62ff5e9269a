"""The fleet benchmark's runner and CLI: scoring, a whole run in-process, sarp's kill -9
run against its own sarpd, and the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.bench.fleet_workload import fleet_requests
from tools.bench import fleet_run
from tools.bench.fleet import main, run_fleet, table
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Query, Timeline, build_timeline
from tools.bench.fleet_run import run_crash, score

WORKERS = 4


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return build_timeline(fleet_requests(5, n=120, workers=WORKERS), WORKERS, 14, tpot_ms=4.0)


def _q(truth: list[int]) -> Query:
    h = np.arange(1, 6, dtype=np.uint64)
    return Query(0, 0.0, h, h, np.array(truth, dtype=np.int32))


def test_score_agreement_and_holder_error() -> None:
    qs = [_q([3, 3, 0, 1]), _q([3, 3, 0, 1]), _q([0, 0, 0, 0]), _q([0, 2, 0, 0]), _q([1, 0, 0, 0])]
    answers = [
        {0: 3, 1: 3, 3: 1},  # exact
        {1: 3, 3: 2},  # first-ranked is worker 1 (tied best): agrees; error 3 + 1
        {},  # nobody holds block 0: an empty answer agrees
        {},  # worker 1 holds 2 blocks: an empty answer does not
        None,  # not answered: not scored
    ]
    agreement, error, answered = score(qs, answers, holders=4)
    assert (agreement, error, answered) == (0.75, 6, 4)
    assert score(qs, answers, holders=4, start=3) == (0.0, 2, 1)
    # K = 1: the model's answer is its top holder (ties by smaller worker)
    assert score(qs[:1], [{0: 3}], holders=1) == (1.0, 0, 1)
    assert score(qs[:1], [{1: 3}], holders=1) == (1.0, 6, 1)


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


def test_kill_9_run_against_its_own_sarpd(tmp_path: Path, timeline: Timeline) -> None:
    doc = run_crash(timeline, 0.0, FleetConfig(WORKERS, WORKERS), "direct", tmp_path / "c")
    assert doc["sync"] == "always" and doc["recovery_s"] > 0
    assert doc["agreement_after_recovery"] == 1.0 and doc["holder_blocks_error_after"] == 0
    assert doc["killed_after_queries"] > 0
    assert not (tmp_path / "c").exists()


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
    bad = CliRunner().invoke(main, ["--trace", str(trace), "--bridge"])
    assert bad.exit_code == 2 and "not built yet" in bad.output
