"""Prometheus metrics (sarpd.daemon.metrics): scraped from a real daemon, and a
`Metrics` fed by hand, whose index counters are read from their owner (`Sources`),
never copied."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.client import SyncClient
from sarpd.core import Activity
from sarpd.daemon.metrics import Metrics, _Hist
from sarpd.daemon.reports import Reports
from sarpd.errors import SarpError
from sarpd.model import Match, MatchResult, Ping, Report, SeqSpec
from tests.daemon_helpers import Launcher, RawConn, SarpdProc, free_port, scrape


def toks(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


@dataclass
class FakeSources:
    """What a `Server` gives its metrics: gauges, reports, the index's activity."""

    index: Activity | None = None
    reports: Reports | None = None
    replica: dict[str, object] | None = None  # cluster mode: the replica's stats

    def gauges(self) -> Mapping[str, float]:
        return {"queue_depth": 2.0}

    def reported(self) -> Mapping[str, Mapping[str, float]]:
        return {} if self.reports is None else self.reports.snapshot()

    def activity(self) -> Activity | None:
        return self.index

    def cluster(self) -> Mapping[str, object] | None:
        return self.replica


def family(metrics: Metrics, name: str) -> Any:
    (fam,) = [f for f in metrics.families() if f.name == name]
    return fam


@pytest.fixture(scope="module")
def metrics_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.daemon_helpers import launcher

    port = free_port()
    with launcher(tmp_path_factory.mktemp("metrics")) as lau:
        proc = lau(extra_args=("--metrics-port", str(port)))
        yield proc, port


def test_metrics_count_requests_errors_and_matches(
    metrics_daemon: tuple[SarpdProc, int],
) -> None:
    proc, port = metrics_daemon
    with SyncClient(proc.socket) as c:
        c.insert(tokens=toks(160, 1), meta=4, ns="m")  # 10 blocks
        assert c.match(tokens=toks(320, 1), ns="m")["blocks"] == 10  # 10 of 20
        assert c.match(tokens=toks(160, 9999), ns="m")["blocks"] == 0  # 0 of 10
        with pytest.raises(SarpError):
            c.match(tokens=toks(16, 1), ns="m" * 2000)  # ns too long
        c.stats()  # refreshes nothing by itself; index gauges refresh per second
    with RawConn(proc.socket) as conn:
        conn.send({"id": 5, "op": "nope"})
        assert conn.recv()["error"]["code"] == "unknown_op"
    m = scrape(port)
    assert m['sarpd_requests_total{op="insert"}'] >= 1
    assert m['sarpd_requests_total{op="match"}'] >= 2
    assert m["sarpd_match_queried_blocks_total"] >= 30
    assert m["sarpd_match_hit_blocks_total"] >= 10
    assert 0 < m["sarpd_match_hit_ratio"] < 1
    assert m["sarpd_match_depth_blocks_count"] >= 2
    assert m['sarpd_match_depth_blocks_bucket{le="0"}'] >= 1  # the miss
    assert m["sarpd_batch_size_count"] >= 4
    assert m["sarpd_backend_reads_per_match_count"] >= 1
    assert m["sarpd_ready"] == 1 and m["sarpd_recovery_seconds"] > 0
    assert m["sarpd_index_blocks"] >= 0 and m["sarpd_directory_bytes"] >= 0
    assert m["sarpd_connections"] >= 0 and m["sarpd_queue_depth"] == 0


def test_metrics_errors_by_op_and_code() -> None:
    """Wire-level errors (answered before a batch) are not in record_batch; an error
    returned by the index is, by op and code. Matched and queried blocks are the
    index's own counters, read (the metrics keep no copy)."""
    index = Activity(matched_blocks=3, queried_blocks=4)
    metrics = Metrics(FakeSources(index))
    match = Match(1, seq=SeqSpec(ns="", tokens=np.arange(64, dtype=np.uint32)))
    metrics.record_batch(
        [match, match, Ping(2)],
        [MatchResult(3, np.zeros(3, np.uint64)), SarpError("boom"), None],
    )
    metrics.record_rejected("insert", "busy")
    assert metrics.requests == {"match": 2, "ping": 1, "insert": 1}
    assert metrics.errors == {("match", "internal"): 1, ("insert", "busy"): 1}
    assert not hasattr(metrics, "hit_blocks") and not hasattr(metrics, "queried_blocks")
    assert metrics.snapshot() == {"errors_internal": 1, "errors_busy": 1, "hit_ratio": 0.75}
    index.matched_blocks, index.queried_blocks = 4, 8  # the index counted more: read live
    assert metrics.snapshot()["hit_ratio"] == 0.5
    assert family(metrics, "sarpd_match_hit_blocks").samples[0].value == 4
    assert family(metrics, "sarpd_match_queried_blocks").samples[0].value == 8


def test_without_an_index_the_match_counters_are_zero() -> None:
    metrics = Metrics()
    assert metrics.snapshot() == {"hit_ratio": 0.0}
    assert family(metrics, "sarpd_match_hit_ratio").samples[0].value == 0.0
    assert not [f for f in metrics.families() if f.name == "sarpd_segment_reads"]


def test_backend_reads_per_match_are_the_index_counter_per_batch() -> None:
    index = Activity(segment_reads=10)
    metrics = Metrics(FakeSources(index))
    match = Match(1, seq=SeqSpec(ns="", tokens=np.arange(16, dtype=np.uint32)))
    hit = MatchResult(1, np.zeros(1, np.uint64))
    metrics.record_batch([match], [hit])  # the first batch only sets the baseline
    assert metrics.reads.counts.sum() == 0
    index.segment_reads = 16  # 6 reads for the next batch's 2 matches
    metrics.record_batch([match, match], [hit, hit])
    assert metrics.reads.counts.sum() == 1 and metrics.reads.sum == 3.0
    index.segment_reads = 20
    metrics.record_batch([Ping(2)], [None])  # no match: no sample, a new baseline
    assert metrics.reads.counts.sum() == 1
    assert family(metrics, "sarpd_segment_reads").samples[0].value == 20


def test_gauges_and_reports_are_read_from_their_owners() -> None:
    reports = Reports(clock=lambda: 5.0)
    metrics = Metrics(FakeSources(reports=reports))
    reports.record(Report(0, "bridge-a", {"gaps": 3}))
    assert family(metrics, "sarpd_queue_depth").samples[0].value == 2.0
    got = {(s.labels["source"], s.labels["name"]): s.value
           for s in family(metrics, "sarpd_reported").samples}
    assert got == {("bridge-a", "gaps"): 3.0, ("bridge-a", "age_s"): 0.0}


def test_a_replica_exports_its_lag_apply_count_and_checkpoint_age() -> None:
    replica: dict[str, object] = {
        "shard": "s1", "replica": "r2", "applied_seq": 40, "lag_seqs": 3, "lag_s": 0.25,
        "entries_applied": 38, "forwarded_writes": 5, "checkpoint_seq": None,
        "checkpoint_age_s": None, "failed": ""}
    metrics = Metrics(FakeSources(replica=replica))
    metrics.record_apply([0.002, 0.002, 0.7])
    metrics.record_apply([])

    def sample(name: str) -> Any:
        (s,) = [s for f in metrics.families() for s in f.samples if s.name == name]
        assert s.labels == {"shard": "s1", "replica": "r2"}
        return s.value

    assert sample("sarpd_cluster_applied_seq") == 40
    assert sample("sarpd_cluster_lag_seqs") == 3 and sample("sarpd_cluster_lag_seconds") == 0.25
    assert sample("sarpd_cluster_applied_entries_total") == 38
    assert sample("sarpd_cluster_forwarded_writes_total") == 5
    assert sample("sarpd_cluster_apply_delay_seconds_count") == 3
    assert sample("sarpd_cluster_apply_delay_seconds_sum") == pytest.approx(0.704)
    buckets = {s.labels["le"]: s.value for f in metrics.families() for s in f.samples
               if s.name == "sarpd_cluster_apply_delay_seconds_bucket"}
    assert (buckets["0.001"], buckets["0.0025"], buckets["0.5"], buckets["1"]) == (0, 2, 2, 3)
    names = {f.name for f in metrics.families()}
    assert "sarpd_cluster_checkpoint_age_seconds" not in names  # none published yet
    replica.update(checkpoint_seq=30, checkpoint_age_s=12.5)
    assert sample("sarpd_cluster_checkpoint_seq") == 30
    assert sample("sarpd_cluster_checkpoint_age_seconds") == 12.5
    assert not any(n.startswith("sarpd_cluster") for n in
                   (f.name for f in Metrics(FakeSources()).families()))  # a single node


def test_the_snapshot_age_is_read_from_the_index_s_snapshot_time() -> None:
    metrics = Metrics()
    metrics.exported = True
    metrics.refresh_index(lambda: {"blocks": 1})
    assert "sarpd_snapshot_age_seconds" not in {f.name for f in metrics.families()}
    metrics = Metrics()
    metrics.exported = True
    metrics.refresh_index(lambda: {"blocks": 1, "snapshot_time": time.time() - 30})
    age = family(metrics, "sarpd_snapshot_age_seconds").samples[0].value
    assert 29 <= age < 60


def test_index_stats_refresh_at_most_once_per_interval() -> None:
    t = [100.0]
    metrics = Metrics(clock=lambda: t[0])
    calls: list[int] = []

    def stats() -> dict[str, int]:
        calls.append(1)
        return {"blocks": 7 * len(calls), "directory_bytes": 64}

    metrics.refresh_index(stats)
    assert not calls and not metrics.index_stats_due()  # not exported: never asked
    metrics.exported = True
    assert metrics.index_stats_due()
    metrics.refresh_index(stats)
    metrics.refresh_index(stats)  # within the interval: kept
    assert len(calls) == 1 and family(metrics, "sarpd_index_blocks").samples[0].value == 7
    t[0] += 1.0
    metrics.refresh_index(stats)
    assert len(calls) == 2 and family(metrics, "sarpd_index_blocks").samples[0].value == 14


def test_metrics_port_in_use_is_a_clear_startup_error(sarpd_factory: Launcher) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = sarpd_factory(extra_args=("--metrics-port", str(port)), start=False)
        proc.start(wait=False)
        assert proc.proc is not None and proc.proc.wait(60) == 1
    assert f"metrics: cannot listen on 127.0.0.1:{port}: Address already in use" in proc.log()
    assert "ready: serving" not in proc.log() and "recovering" not in proc.log()
    assert not proc.socket.exists()  # nothing left behind


def test_request_latency_is_a_histogram_by_op_added_per_batch() -> None:
    """Each request's seconds from decoded to answered, by op; match and insert are
    exported (at 0) before any request; an edge belongs to its own bucket (le)."""
    metrics = Metrics()
    names = [s.labels["op"] for s in family(metrics, "sarpd_request_duration_seconds").samples
             if s.name.endswith("_count")]
    assert names == ["insert", "match"]
    match = Match(1, seq=SeqSpec(ns="", tokens=np.arange(16, dtype=np.uint32)))
    metrics.record_latency([match, match, Ping(2), match], [9.9999, 9.99, 8.0, 10.0], 10.0)
    metrics.record_latency([], [], 11.0)
    samples = {(s.name.rsplit("_", 1)[-1], s.labels.get("le", ""), s.labels["op"]): s.value
               for s in family(metrics, "sarpd_request_duration_seconds").samples}
    assert samples[("count", "", "match")] == 3 and samples[("count", "", "ping")] == 1
    assert samples[("sum", "", "match")] == pytest.approx(0.0101)
    assert samples[("bucket", "5e-05", "match")] == 1  # 0 s
    assert samples[("bucket", "0.0001", "match")] == 2  # 0.0001 s: le, so in this one
    assert samples[("bucket", "0.01", "match")] == 3
    assert samples[("bucket", "1", "ping")] == 0 and samples[("bucket", "2.5", "ping")] == 1
    assert samples[("bucket", "+Inf", "insert")] == 0


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.sampled_from([0.0, 1.0, 2.5, 4.0, 64.0, float("nan")]),
                                 st.floats(-1e9, 1e9)), max_size=20),
       lone=st.booleans())
def test_a_histogram_counts_each_value_where_searchsorted_puts_it(
        values: list[float], lone: bool) -> None:
    """`_Hist.add` counts a lone value by bisect and several by numpy: either way each
    value lands in the first bucket whose edge is >= it (NaN: +Inf), and the sum
    follows."""
    edges = [1.0, 2.5, 4.0, 64.0]
    h = _Hist(edges)
    for chunk in ([[v] for v in values] if lone else [values]):
        h.add(chunk)
    want = np.zeros(len(edges) + 1, np.int64)
    np.add.at(want, np.searchsorted(np.array(edges), np.array(values, np.float64),
                                    side="left"), 1)
    assert h.counts.tolist() == want.tolist()
    total = float(np.array(values, np.float64).sum())
    assert h.sum == pytest.approx(total, rel=1e-9, abs=1e-3, nan_ok=True)
