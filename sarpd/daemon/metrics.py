"""Prometheus metrics of sarpd (prometheus_client, its own registry).

Counting stays off the per-request path: the server calls `record_batch` once per
batch with the batch's requests and results (and `record_latency` once its answers are
written), which adds to plain dicts and numpy bucket arrays under one lock; a custom
collector turns them into metric families only when /metrics is scraped
(sarpd.daemon.http serves it on sarpd's own loop).

The histograms are `_Hist`, not prometheus_client's `Histogram`: that one has no bulk
observe, so a batch would cost one `observe` per request (a lock and a Python walk of
the buckets each: ~2.1 us per value here, ~540 us per batch of 256), where `_Hist`
adds a whole batch with one numpy `searchsorted` under one lock (~19 us for 256).

Metrics own only what nobody else counts: answers by op and code (including those the
server gives outside a batch), and the histograms. Everything else is READ from its
owner through `Sources`, given at construction (the server is one): the server's
gauges, the clients' reports (`sarpd.daemon.reports`), and the index's activity
counters (matched / queried blocks, segment reads), which plain int reads make safe
from the event loop (where /metrics is scraped) while the worker thread runs a batch.
Index gauges that cost a walk of the index or the backend (blocks, directory bytes,
...) come from the index's `stats()`, which only the worker thread may call:
`refresh_index` keeps its newest result (the server calls it after a batch), at most
once per `INDEX_STATS_EVERY_S` while metrics are served; a scrape never calls the index.

Exported (all prefixed ``sarpd_``):

    requests_total{op}              requests answered, by op
    errors_total{op,code}           error responses, by op and wire code
    request_duration_seconds{op}    histogram: from a request decoded to its answer
                                    written, for requests answered in a batch (not
                                    those refused at once: busy, unavailable, ...)
    batch_size                      histogram: requests per batch
    match_depth_blocks              histogram: matched blocks per match
    match_queried_blocks_total      whole blocks asked for by matches
    match_hit_blocks_total          ... of which matched
    match_hit_ratio                 hit / queried blocks since start
    backend_reads_per_match         histogram: segment reads per match, per batch
    queue_depth, connections        requests queued for the batcher; open connections
    ready                           1 once recovered
    recovery_segments_done / _total, recovery_seconds, recovery_eta_seconds
    index_blocks, index_segments, index_routing_points, directory_bytes, segment_reads_total
    snapshot_age_seconds            since the newest directory snapshot was written

Cluster mode only (issue 15), labelled {shard, replica}, read from the replica's
`stats` (sarpd.daemon.forward.Forwarder.stats):

    cluster_applied_seq             the newest log sequence this replica applied
    cluster_lag_seqs                log entries of the shard not applied yet
    cluster_lag_seconds             since the log stored the oldest entry not applied
    cluster_applied_entries_total   entries applied since start: rate() is the apply rate
    cluster_forwarded_writes_total  writes this replica took and published
    cluster_checkpoint_seq / cluster_checkpoint_age_seconds
                                    the shard's newest published checkpoint (absent: none)
    cluster_apply_delay_seconds     histogram: per entry, log store to this replica's apply
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sarpd.core import Activity
from sarpd.errors import SarpError
from sarpd.model import Match, MatchResult, Request

INDEX_STATS_EVERY_S = 1.0
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536)
READS_BUCKETS = (0, 0.25, 0.5, 1, 2, 4, 8, 16)
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                   0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LATENCY_OPS = ("match", "insert")  # exported from the start, at 0 (other ops once seen)
DELAY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)
# cluster mode: (key of the replica's stats, metric, counter?, help)
CLUSTER_FIGURES = (
    ("applied_seq", "sarpd_cluster_applied_seq", False,
     "The newest log sequence this replica applied."),
    ("lag_seqs", "sarpd_cluster_lag_seqs", False,
     "Entries of the shard's log this replica has not applied."),
    ("lag_s", "sarpd_cluster_lag_seconds", False,
     "Seconds since the log stored the oldest entry this replica has not applied (0: "
     "caught up)."),
    ("entries_applied", "sarpd_cluster_applied_entries", True,
     "Log entries applied since start (its rate is the apply rate)."),
    ("forwarded_writes", "sarpd_cluster_forwarded_writes", True,
     "Writes this replica took and published to the log."),
    ("checkpoint_seq", "sarpd_cluster_checkpoint_seq", False,
     "Applied sequence of the shard's newest published checkpoint."),
    ("checkpoint_age_s", "sarpd_cluster_checkpoint_age_seconds", False,
     "Seconds since the shard's newest checkpoint was published."),
)


class Sources(Protocol):
    """What the metrics read from the state's owners (safe from any thread)."""

    def gauges(self) -> Mapping[str, float]:
        """Server-side gauges (queue depth, connections, ...)."""
        ...

    def reported(self) -> Mapping[str, Mapping[str, float]]:
        """source -> the counters sarpd's clients report (the `report` op)."""
        ...

    def activity(self) -> Activity | None:
        """The index's activity counters (`sarpd.core.Activity`, read, never copied),
        once the index is serving."""
        ...

    def cluster(self) -> Mapping[str, object] | None:
        """The replica's own figures (cluster mode), else None."""
        ...


class NoSources:
    """`Sources` of nothing (a `Metrics` on its own, e.g. in tests)."""

    def gauges(self) -> Mapping[str, float]:
        return {}

    def reported(self) -> Mapping[str, Mapping[str, float]]:
        return {}

    def activity(self) -> Activity | None:
        return None

    def cluster(self) -> Mapping[str, object] | None:
        return None


def op_name(req: Request) -> str:
    return type(req).__name__.lower()


class _Hist:
    """A histogram kept as numpy bucket counts (cumulative only when exported)."""

    __slots__ = ("_edges", "counts", "edges", "sum")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self._edges = self.edges.tolist()  # a lone value's bucket: bisect, not numpy
        self.counts = np.zeros(len(edges) + 1, dtype=np.int64)  # last: +Inf
        self.sum = 0.0

    def add(self, values: Sequence[float] | np.ndarray[Any, Any]) -> None:
        """Count each value in the first bucket whose edge is >= it (numpy's
        searchsorted, side "left"; bisect_left for a lone value: the same bucket)."""
        if len(values) == 1:  # once per batch (its size, a ratio): no numpy call
            v = float(values[0])  # NaN sorts last in numpy: the +Inf bucket
            self.counts[bisect.bisect_left(self._edges, v) if v == v else -1] += 1
            self.sum += v
            return
        arr = np.asarray(values, dtype=np.float64)
        if arr.size:
            at = np.searchsorted(self.edges, arr, side="left")
            self.counts += np.bincount(at, minlength=self.counts.size)
            self.sum += float(arr.sum())

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last."""
        cum = np.cumsum(self.counts).tolist()
        buckets = [(_fmt(e), c) for e, c in zip(self.edges.tolist(), cum, strict=False)]
        buckets.append(("+Inf", cum[-1]))
        return buckets

    def family(self, name: str, doc: str,
               labels: Mapping[str, str] | None = None) -> HistogramMetricFamily:
        if not labels:
            return HistogramMetricFamily(name, doc, buckets=self.buckets(), sum_value=self.sum)
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        fam.add_metric(list(labels.values()), self.buckets(), self.sum)
        return fam


def _fmt(edge: float) -> str:
    return str(int(edge)) if float(edge).is_integer() else str(edge)


@dataclass(slots=True)
class Recovery:
    done: int = 0
    total: int = 0
    seconds: float = 0.0
    eta_s: float | None = None
    ready: bool = False


class Metrics:
    """Counters fed by the server; thread-safe (one lock per update)."""

    def __init__(
        self, sources: Sources | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._lock = threading.Lock()
        self._sources: Sources = sources if sources is not None else NoSources()
        self._clock = clock
        self.requests: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.batch = _Hist(BATCH_BUCKETS)
        self.latency = {op: _Hist(LATENCY_BUCKETS) for op in LATENCY_OPS}  # by op
        self.depth = _Hist(DEPTH_BUCKETS)
        self.reads = _Hist(READS_BUCKETS)
        self.apply_delay = _Hist(DELAY_BUCKETS)
        self.recovery = Recovery()
        self.index_stats: dict[str, Any] = {}
        self._index_stats_at = float("-inf")
        self._last_reads: int | None = None  # segment reads after the previous batch
        self.exported = False  # set by `serve`: only then are index stats refreshed

    # -- updates -------------------------------------------------------------------

    def record_batch(self, reqs: Sequence[Request], results: Sequence[object]) -> None:
        """Once per batch, after it ran (between batches: the index's segment-read
        counter then holds this batch's reads)."""
        ops: dict[str, int] = {}
        errs: dict[tuple[str, str], int] = {}
        depths: list[int] = []
        matches = 0
        for req, res in zip(reqs, results, strict=True):
            op = op_name(req)
            ops[op] = ops.get(op, 0) + 1
            if isinstance(req, Match):
                matches += 1
            if isinstance(res, SarpError):
                key = (op, res.code)
                errs[key] = errs.get(key, 0) + 1
            elif isinstance(res, MatchResult) and isinstance(req, Match):
                depths.append(res.blocks)
        activity = self._sources.activity()
        reads = None if activity is None else activity.segment_reads
        with self._lock:
            _merge(self.requests, ops)
            _merge(self.errors, errs)
            self.batch.add([len(reqs)])
            self.depth.add(depths)
            if matches and reads is not None and self._last_reads is not None:
                self.reads.add([(reads - self._last_reads) / matches])
            if reads is not None:
                self._last_reads = reads

    def record_latency(
        self, reqs: Sequence[Request], received: Sequence[float], written: float
    ) -> None:
        """Once per batch, right after its answers were written (at `written`): each
        request's seconds since it was decoded (`received`, same clock), by op."""
        by_op: dict[str, list[float]] = {}
        for req, at in zip(reqs, received, strict=True):
            by_op.setdefault(op_name(req), []).append(written - at)
        with self._lock:
            for op, seconds in by_op.items():
                hist = self.latency.get(op)
                if hist is None:
                    hist = self.latency[op] = _Hist(LATENCY_BUCKETS)
                hist.add(seconds)

    def record_apply(self, delays: Sequence[float]) -> None:
        """Cluster mode: the apply delays of one run of log entries (seconds each)."""
        with self._lock:
            self.apply_delay.add(delays)

    def record_rejected(self, op: str, code: str) -> None:
        """A request answered outside a batch (busy, unavailable, forbidden)."""
        with self._lock:
            self.requests[op] = self.requests.get(op, 0) + 1
            self.errors[(op, code)] = self.errors.get((op, code), 0) + 1

    def index_stats_due(self) -> bool:
        """Whether `refresh_index` would call the index now."""
        return self.exported and self._clock() - self._index_stats_at >= INDEX_STATS_EVERY_S

    def refresh_index(self, stats_fn: Callable[[], Mapping[str, Any]]) -> None:
        """In the worker thread (the only one that may call the index): keep the newest
        index stats for the gauges, at most once per INDEX_STATS_EVERY_S."""
        if not self.index_stats_due():
            return
        now = self._clock()
        stats = dict(stats_fn())
        with self._lock:
            self.index_stats = stats
            self._index_stats_at = now

    def set_recovery(self, done: int, total: int, seconds: float, eta_s: float | None) -> None:
        with self._lock:
            self.recovery = Recovery(done, total, seconds, eta_s, False)

    def set_ready(self, seconds: float) -> None:
        with self._lock:
            r = self.recovery
            self.recovery = Recovery(r.total, r.total, seconds, 0.0, True)

    def snapshot(self) -> dict[str, object]:
        """Counters for the `stats` op (flat keys)."""
        with self._lock:
            out: dict[str, object] = {
                f"errors_{code}": n
                for code, n in _by_code(self.errors).items()
            }
        hit, queried = self._match_blocks()
        out["hit_ratio"] = hit / queried if queried else 0.0
        return out

    def _match_blocks(self) -> tuple[int, int]:
        """(matched, queried) blocks of every match since start: the index's counters."""
        activity = self._sources.activity()
        if activity is None:
            return 0, 0
        return activity.matched_blocks, activity.queried_blocks

    # -- export --------------------------------------------------------------------

    def families(self) -> Iterable[Metric]:
        with self._lock:
            yield from self._counters()
            yield self._latency()
            yield self.batch.family("sarpd_batch_size", "Requests per batch.")
            yield self.depth.family("sarpd_match_depth_blocks", "Matched blocks per match.")
            yield self.reads.family(
                "sarpd_backend_reads_per_match", "Segment reads per match (one sample per batch)."
            )
            yield from self._recovery()
            yield from self._index()
        cluster = self._sources.cluster()
        if cluster is not None:
            yield from self._cluster(cluster)
        for name, value in self._sources.gauges().items():
            yield GaugeMetricFamily(f"sarpd_{name}", f"sarpd {name.replace('_', ' ')}.", value)
        rep = GaugeMetricFamily(
            "sarpd_reported", "Counters sarpd's clients report (e.g. the vLLM bridge's events "
            "applied by type, dropped, gaps, replays, lag_s), by source and name.",
            labels=["source", "name"])
        for source, counters in self._sources.reported().items():
            for name, value in counters.items():
                rep.add_metric([source, name], value)
        yield rep

    def _counters(self) -> Iterable[Metric]:
        req = CounterMetricFamily("sarpd_requests", "Requests answered, by op.", labels=["op"])
        for op, n in sorted(self.requests.items()):
            req.add_metric([op], n)
        err = CounterMetricFamily(
            "sarpd_errors", "Error responses, by op and code.", labels=["op", "code"]
        )
        for (op, code), n in sorted(self.errors.items()):
            err.add_metric([op, code], n)
        hit, q = self._match_blocks()
        yield req
        yield err
        yield CounterMetricFamily(
            "sarpd_match_queried_blocks", "Whole blocks asked for by matches.", q
        )
        yield CounterMetricFamily("sarpd_match_hit_blocks", "Blocks matched.", hit)
        yield GaugeMetricFamily(
            "sarpd_match_hit_ratio", "Matched / queried blocks.", hit / q if q else 0.0
        )

    def _latency(self) -> Metric:
        fam = HistogramMetricFamily(
            "sarpd_request_duration_seconds", "Seconds from a request decoded to its "
            "answer written, by op (requests answered in a batch).", labels=["op"])
        for op, hist in sorted(self.latency.items()):
            fam.add_metric([op], hist.buckets(), hist.sum)
        return fam

    def _recovery(self) -> Iterable[Metric]:
        r = self.recovery
        yield GaugeMetricFamily("sarpd_ready", "1 once recovery is done.", float(r.ready))
        yield GaugeMetricFamily("sarpd_recovery_segments_done", "Segments re-routed.", r.done)
        yield GaugeMetricFamily("sarpd_recovery_segments_total", "Segments to re-route.", r.total)
        yield GaugeMetricFamily("sarpd_recovery_seconds", "Recovery time so far.", r.seconds)
        yield GaugeMetricFamily(
            "sarpd_recovery_eta_seconds", "Estimated recovery time left.", r.eta_s or 0.0
        )

    def _cluster(self, stats: Mapping[str, object]) -> Iterable[Metric]:
        """The replica's figures, labelled by shard and replica."""
        labels = {"shard": str(stats.get("shard", "")), "replica": str(stats.get("replica", ""))}
        for key, name, counter, doc in CLUSTER_FIGURES:
            value = stats.get(key)
            if not isinstance(value, int | float):  # e.g. no checkpoint yet
                continue
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            fam = kind(name, doc, labels=list(labels))
            fam.add_metric(list(labels.values()), float(value))
            yield fam
        with self._lock:
            yield self.apply_delay.family(
                "sarpd_cluster_apply_delay_seconds",
                "Per log entry: from the log storing it to this replica applying it.", labels)

    def _index(self) -> Iterable[Metric]:
        s = self.index_stats
        for key, name, doc in (
            ("blocks", "sarpd_index_blocks", "Blocks indexed."),
            ("segments", "sarpd_index_segments", "Segments stored."),
            ("routing_points", "sarpd_index_routing_points", "Routing directory entries."),
            ("directory_bytes", "sarpd_directory_bytes", "Routing directory memory."),
        ):
            if isinstance(s.get(key), int | float):
                yield GaugeMetricFamily(name, doc, s[key])
        if isinstance(s.get("snapshot_time"), int | float):
            yield GaugeMetricFamily(
                "sarpd_snapshot_age_seconds", "Since the newest directory snapshot was "
                "written (what a restart loads).", max(0.0, time.time() - s["snapshot_time"]))
        activity = self._sources.activity()
        if activity is not None:
            yield CounterMetricFamily(
                "sarpd_segment_reads", "Segments read from the backend.", activity.segment_reads
            )


def _merge(into: dict[Any, int], add: dict[Any, int]) -> None:
    for k, n in add.items():
        into[k] = into.get(k, 0) + n


def _by_code(errors: dict[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, code), n in errors.items():
        out[code] = out.get(code, 0) + n
    return out


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.families())


def registry_for(metrics: Metrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics))
    return registry
