"""tools/bench/cluster.py on a tiny run: every configuration's figures in the JSON,
every match answer checked against the fill, and a new replica's catch-up timed from
the whole log and from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tools.bench.cluster import main


def test_a_tiny_run_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    res = CliRunner().invoke(main, [
        "--configs", "1x2", "--sequences", "30", "--clients", "2", "--seconds", "0.5",
        "--catch-up", "1280", "--dir", str(tmp_path / "run"), "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    single, cluster = doc["results"]
    assert (single["shards"], cluster["shards"], cluster["replicas"]) == (0, 1, 2)
    for r in (single, cluster):
        assert r["writes"] == 30 and r["match_rps"] > 0
        assert 0 < r["write_us_p50"] <= r["write_us_p99"] and r["match_us_p99"] > 0
    assert cluster["lag_seq_p99"] >= 0 and doc["vs_single"][0]["match_rps_x"] > 0
    # every write timed on both replicas: its seq visible there after the ack
    assert 0 < cluster["lag_ms_p50"] <= cluster["lag_ms_p99"] < 60_000
    (catch,) = doc["catch_up"]
    assert catch["blocks"] == 1280
    assert catch["catch_up_s"] > 0 and catch["catch_up_from_checkpoint_s"] > 0


def test_skew_block_0_against_the_heads_rule() -> None:
    """Every codeact session starts on the same 1,024 common tokens (64 blocks): block 0
    alone puts every request on one shard at any shard count; the heads rule splits
    the prompts and spreads them, writing the heads once more per extra shard."""
    from tools.bench.cluster import skew

    got = skew("codeact", scale=2)
    assert got["requests"] > 400 and got["rule"] == "heads"
    for n in ("2", "4", "8"):
        shares = got[n]["shares"]
        assert len(shares) == int(n) and abs(sum(shares) - 1) < 1e-9
        assert got[n]["block0_max_share"] == 1.0
        assert got[n]["splits"] >= 1 and got[n]["max_share"] < 0.75
        assert 1.0 < got[n]["write_amplification"] < 1.3
        assert sum(got[n]["new_blocks"]) > got["single_new_blocks"]
