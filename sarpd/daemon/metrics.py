"""Prometheus metrics of sarpd (prometheus_client, its own registry).

Counting stays off the per-request path: the worker thread calls `record_batch` once
per batch with the batch's requests and results, which adds to plain dicts and
numpy bucket arrays under one lock; a custom collector turns them into metric
families only when /metrics is scraped. Index gauges (blocks, directory bytes, ...)
come from a copy of the index's `stats()` that the worker refreshes at most once per
`INDEX_STATS_EVERY_S` while metrics are served, so the scrape thread never touches
the index.

Exported (all prefixed ``sarpd_``):

    requests_total{op}              requests answered, by op
    errors_total{op,code}           error responses, by op and wire code
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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sarpd.errors import SarpError
from sarpd.model import Match, MatchResult, Request

INDEX_STATS_EVERY_S = 1.0
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536)
READS_BUCKETS = (0, 0.25, 0.5, 1, 2, 4, 8, 16)


def op_name(req: Request) -> str:
    return type(req).__name__.lower()


class _Hist:
    """A histogram kept as numpy bucket counts (cumulative only when exported)."""

    __slots__ = ("counts", "edges", "sum")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self.counts = np.zeros(len(edges) + 1, dtype=np.int64)  # last: +Inf
        self.sum = 0.0

    def add(self, values: Sequence[float] | np.ndarray[Any, Any]) -> None:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size:
            np.add.at(self.counts, np.searchsorted(self.edges, arr, side="left"), 1)
            self.sum += float(arr.sum())

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cum = np.cumsum(self.counts).tolist()
        buckets = [(_fmt(e), c) for e, c in zip(self.edges.tolist(), cum, strict=False)]
        buckets.append(("+Inf", cum[-1]))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.sum)


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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.requests: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.batch = _Hist(BATCH_BUCKETS)
        self.depth = _Hist(DEPTH_BUCKETS)
        self.reads = _Hist(READS_BUCKETS)
        self.queried_blocks = 0
        self.hit_blocks = 0
        self.recovery = Recovery()
        self.index_stats: dict[str, Any] = {}
        self._index_stats_at = float("-inf")
        self._last_reads: int | None = None
        self.gauges: Callable[[], dict[str, float]] = dict
        # source -> counters reported by sarpd's clients (the `report` op), once served
        self.reported: Callable[[], dict[str, dict[str, float]]] = dict
        self.exported = False  # set by `serve`: only then are index stats copied

    # -- updates -------------------------------------------------------------------

    def record_batch(
        self, reqs: Sequence[Request], results: Sequence[object], block_tokens: int
    ) -> None:
        """Once per batch, in the worker thread."""
        ops: dict[str, int] = {}
        errs: dict[tuple[str, str], int] = {}
        depths: list[int] = []
        queried = 0
        for req, res in zip(reqs, results, strict=True):
            op = op_name(req)
            ops[op] = ops.get(op, 0) + 1
            if isinstance(res, SarpError):
                key = (op, res.code)
                errs[key] = errs.get(key, 0) + 1
            elif isinstance(res, MatchResult) and isinstance(req, Match):
                depths.append(res.blocks)
                queried += _blocks_of(req, block_tokens)
        with self._lock:
            _merge(self.requests, ops)
            _merge(self.errors, errs)
            self.batch.add([len(reqs)])
            self.depth.add(depths)
            self.queried_blocks += queried
            self.hit_blocks += sum(depths)

    def record_rejected(self, op: str, code: str) -> None:
        """A request answered outside a batch (busy, unavailable, forbidden)."""
        with self._lock:
            self.requests[op] = self.requests.get(op, 0) + 1
            self.errors[(op, code)] = self.errors.get((op, code), 0) + 1

    def record_index(
        self, stats_fn: Callable[[], dict[str, Any]], matches: int, reads: int | None
    ) -> None:
        """After a batch (worker thread): backend reads per match of this batch (`reads`:
        the index's segment-read counter now), and a fresh copy of the index stats at
        most once per INDEX_STATS_EVERY_S."""
        now = self._clock()
        stale = self.exported and now - self._index_stats_at >= INDEX_STATS_EVERY_S
        stats = stats_fn() if stale else None
        with self._lock:
            if stats is not None:
                self.index_stats = stats
                self._index_stats_at = now
            if matches and reads is not None and self._last_reads is not None:
                self.reads.add([(reads - self._last_reads) / matches])
            if reads is not None:
                self._last_reads = reads

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
            out["hit_ratio"] = self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0
            return out

    # -- export --------------------------------------------------------------------

    def families(self) -> Iterable[Metric]:
        with self._lock:
            yield from self._counters()
            yield self.batch.family("sarpd_batch_size", "Requests per batch.")
            yield self.depth.family("sarpd_match_depth_blocks", "Matched blocks per match.")
            yield self.reads.family(
                "sarpd_backend_reads_per_match", "Segment reads per match (one sample per batch)."
            )
            yield from self._recovery()
            yield from self._index()
        for name, value in self.gauges().items():
            yield GaugeMetricFamily(f"sarpd_{name}", f"sarpd {name.replace('_', ' ')}.", value)
        rep = GaugeMetricFamily(
            "sarpd_reported", "Counters sarpd's clients report (e.g. the vLLM bridge's events "
            "applied by type, dropped, gaps, replays, lag_s), by source and name.",
            labels=["source", "name"])
        for source, counters in self.reported().items():
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
        q = self.queried_blocks
        yield req
        yield err
        yield CounterMetricFamily(
            "sarpd_match_queried_blocks", "Whole blocks asked for by matches.", q
        )
        yield CounterMetricFamily("sarpd_match_hit_blocks", "Blocks matched.", self.hit_blocks)
        yield GaugeMetricFamily(
            "sarpd_match_hit_ratio", "Matched / queried blocks.", self.hit_blocks / q if q else 0.0
        )

    def _recovery(self) -> Iterable[Metric]:
        r = self.recovery
        yield GaugeMetricFamily("sarpd_ready", "1 once recovery is done.", float(r.ready))
        yield GaugeMetricFamily("sarpd_recovery_segments_done", "Segments re-routed.", r.done)
        yield GaugeMetricFamily("sarpd_recovery_segments_total", "Segments to re-route.", r.total)
        yield GaugeMetricFamily("sarpd_recovery_seconds", "Recovery time so far.", r.seconds)
        yield GaugeMetricFamily(
            "sarpd_recovery_eta_seconds", "Estimated recovery time left.", r.eta_s or 0.0
        )

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
        if isinstance(s.get("segment_reads"), int):
            yield CounterMetricFamily(
                "sarpd_segment_reads", "Segments read from the backend.", s["segment_reads"]
            )


def _merge(into: dict[Any, int], add: dict[Any, int]) -> None:
    for k, n in add.items():
        into[k] = into.get(k, 0) + n


def _by_code(errors: dict[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, code), n in errors.items():
        out[code] = out.get(code, 0) + n
    return out


def _blocks_of(req: Match, block_tokens: int) -> int:
    seq = req.seq
    if seq.tokens is not None:
        return len(seq.tokens) // block_tokens
    return 0 if seq.hashes is None else len(seq.hashes)


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.families())


def registry_for(metrics: Metrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics))
    return registry


def serve(metrics: Metrics, host: str, port: int) -> Any:
    """Serve /metrics on host:port in a daemon thread; the server (for `.shutdown()`)."""
    server, _thread = start_http_server(port, addr=host, registry=registry_for(metrics))
    metrics.exported = True
    return server
