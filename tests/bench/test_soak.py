"""The soak benchmark (tools.bench.soak): the plateau rule, the report, a one-second
drive of a real sarpd by a few clients, and a short soak through the command."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tools.bench.soak import (
    Interval,
    Recorder,
    drive,
    ids,
    main,
    plateaued,
    print_report,
    rss_mb,
    summarize,
)
from tools.bench.spawn import start_daemon, stop_daemon


def test_plateau_rule() -> None:
    assert plateaued([50, 80, 90, 91, 92, 92], 0.05)
    assert not plateaued([50, 60, 70, 80, 90, 100], 0.05)
    assert not plateaued([50, 60], 0.05)  # too short to tell
    assert plateaued([10, 100, 100, 105], 0.05)  # 5 % over the middle third's peak


def test_recorder_takes_what_came_since_the_last_take() -> None:
    rec = Recorder()
    rec.lat += [0.001, 0.002]
    rec.errors = 1
    lat, err = rec.take()
    assert lat.tolist() == [0.001, 0.002] and err == 1
    lat, err = rec.take()
    assert lat.size == 0 and err == 0


def test_ids_are_nonzero_caller_hashes() -> None:
    a = ids(np.random.default_rng(1), 5)
    assert a.shape == (5, 2) and (a[:, 0] != 0).all() and (a[:, 1] == 0).all()


def test_summary_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    ivs = [Interval(1.0, 100, 100.0, 1.0, 2.0, 0, 50.0),
           Interval(2.0, 300, 300.0, 1.0, 4.0, 1, 60.0),
           Interval(3.0, 200, 200.0, 1.0, 3.0, 0, 61.0)]
    rep = summarize(ivs, clients=3, rss0=40.0, tol=0.05)
    assert (rep.requests, rep.errors, rep.rps, rep.p99_ms) == (600, 1, 200.0, 4.0)
    assert (rep.rss_start_mb, rep.rss_end_mb, rep.rss_peak_mb) == (40.0, 61.0, 61.0)
    assert rep.plateaued  # 61 <= 60 * 1.05
    print_report(rep)
    out = capsys.readouterr().out
    assert "3 clients, 3 s: 600 requests (200/s), 1 errors" in out
    assert out.rstrip().endswith("plateaued")
    empty = summarize([], clients=1, rss0=10.0, tol=0.05)
    assert empty.requests == 0 and empty.rps == 0.0 and not empty.plateaued


def test_rss_of_this_process_and_of_no_process() -> None:
    assert rss_mb(os.getpid()) > 1
    assert np.isnan(rss_mb(2**22 + 1))


def test_a_short_drive_of_a_real_daemon(tmp_path: Path) -> None:
    proc, sock = start_daemon(tmp_path / "data", backend="memory")
    try:
        opts: dict[str, int | bool] = {"sessions": 2, "turns": 2, "prompts": 2, "evict": True}
        ivs = asyncio.run(drive(str(sock), proc.pid, 2, 1.0, 0.5, opts))
    finally:
        stop_daemon(proc, sock)
    assert len(ivs) == 2
    assert sum(iv.requests for iv in ivs) > 0 and all(iv.errors == 0 for iv in ivs)
    assert all(iv.rss_mb > 0 for iv in ivs) and ivs[-1].blocks > 0


def test_soak_reports_throughput_latency_and_rss(tmp_path: Path) -> None:
    """A 5-second soak through the real command: the report has every interval,
    requests and no errors, and the daemon's RSS (the plateau rule is checked apart)."""
    out = tmp_path / "soak.json"
    res = CliRunner().invoke(
        main, ["--duration", "5", "--clients", "3", "--interval", "1", "--json", str(out)]
    )
    assert res.exit_code in (0, 1), res.output  # 1: RSS still growing (5 s is warm-up)
    report = json.loads(out.read_text())
    assert len(report["intervals"]) >= 4 and report["requests"] > 0 and report["errors"] == 0
    assert report["rss_peak_mb"] > 10 and report["p99_ms"] > 0
    assert ("plateaued" in res.output) == report["plateaued"]
