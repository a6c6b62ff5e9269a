"""The fleet benchmark's replay and scoring (tools/bench/fleet.py is its CLI).

Pacing. An entry of the timeline (tools/bench/fleet_model.py) at trace time t is due
`(t - t_first) / speedup` after the replay starts. One driver issues the entries in
order: it sleeps until an entry is due, or issues it at once when it is late (the
index is behind). A batch is handed to the index (`apply`: sarp pipelines it and does
not wait); a query waits for its answer, which comes after every batch before it.
Speedup 0: no pacing (every entry at once, as fast as the index goes). The replay
ends when every batch is acknowledged (`drain`).

Counts (Dynamo's mooncake_bench): block-ops = the query's hashes + the hashes of
every BlockStored and BlockRemoved. Offered: the timeline's block-ops over its span
at that speedup (`window_s`); achieved (`block_ops_per_s`): the same block-ops over
the replay's wall time, first entry to last acknowledgement (`seconds`). When the
index keeps up, achieved is pinned to offered (it measures the pacing, not the
index); when it cannot, achieved < offered and is what the index sustains.
`query_us_p50/p99`: a query's time from send to answer (the caller's view: socket
round trip and, for sarp, the daemon's batch window included).

Scoring against the model (each query carries the engines' true runs):
- agreement: the share of answered queries whose first-ranked holder (longest run,
  ties by smaller worker id) truly holds as many blocks as the best worker; an empty
  answer agrees only when no worker holds block 0.
- holder_blocks_error: the sum over queries and workers of |the index's run - the
  model's run|, the model's answer cut to the same K holders (ties by worker id).

Crash run (sarp only, sync=always): the same replay at the first speedup, sarpd
killed -9 when half the entries were issued and restarted at once on its data
(tools/bench/fleet_sarp.py, "Crash"); queries made while it is down get no answer
(`queries_unanswered`); `agreement_after_recovery` scores the queries answered after
the kill.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from tools.bench.fleet_indexes import (
    DYNAMO_MISSING,
    Answer,
    Crashable,
    DynamoRadix,
    FleetConfig,
    FleetIndex,
    RedisLlmd,
    dynamo_available,
)
from tools.bench.fleet_model import Query, Timeline, ranked
from tools.bench.fleet_sarp import SarpDirect, SarpInProcess
from tools.bench.redis_server import RedisServerError, redis_binary

INDEXES = ("sarp", "sarp-ns-per-worker", "dynamo-radix", "redis-llmd")
TRANSPORTS = ("direct", "in-process")
ProgressFn = Callable[[int], None]
PROGRESS_EVERY = 256  # entries


@dataclass(frozen=True, slots=True)
class RunResult:
    """One index at one speedup."""

    index: str
    speedup: float
    offered_block_ops_per_s: float | None  # None: unpaced (speedup 0)
    block_ops_per_s: float
    query_blocks_per_s: float
    event_blocks_per_s: float
    # blocks per second of the index's own calls (`query` / `apply` time only: no pacing,
    # no driver loop, inputs built before the clock by `prepare`); issue 24
    query_call_blocks_per_s: float
    event_call_blocks_per_s: float
    query_us_p50: float
    query_us_p99: float
    agreement: float
    holder_blocks_error: int
    seconds: float
    window_s: float | None
    queries_answered: int
    recovery_s: float | None = None
    agreement_after_recovery: float | None = None
    recovery: dict[str, Any] | None = field(default=None)

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NotRun:
    """An index skipped (`skipped`: not installed) or failed (`error`)."""

    index: str
    speedup: float | None
    skipped: str = ""
    error: str = ""

    def public(self) -> dict[str, Any]:
        d = {"index": self.index, "speedup": self.speedup}
        d.update({"skipped": self.skipped} if self.skipped else {"error": self.error})
        return d


Result = RunResult | NotRun


@dataclass(slots=True)
class Replay:
    answers: list[Answer | None]  # per query, in timeline order
    query_s: list[float]  # answered queries only
    seconds: float
    apply_s: float = 0.0  # time inside `apply` calls
    crashed_at: int | None = None  # queries made before the kill


def make_index(name: str, cfg: FleetConfig, transport: str) -> FleetIndex:
    if name in ("sarp", "sarp-ns-per-worker"):
        per_worker = name != "sarp"
        if transport == "in-process":
            return SarpInProcess(cfg, per_worker)
        return SarpDirect(cfg, per_worker, bridge=transport == "bridge")
    if name == "dynamo-radix":
        return DynamoRadix(cfg)
    if name == "redis-llmd":
        return RedisLlmd(cfg)
    raise ValueError(f"unknown index {name!r} (known: {', '.join(INDEXES)})")


def missing(name: str) -> str:
    """Why an index cannot run here ('' when it can)."""
    if name == "dynamo-radix" and not dynamo_available():
        return DYNAMO_MISSING
    if name == "redis-llmd":
        try:
            redis_binary()
        except RedisServerError as exc:
            return f"{exc}: redis-llmd skipped"
    return ""


def replay(index: FleetIndex, timeline: Timeline, speedup: float,
           progress: ProgressFn | None = None, crash_at: int | None = None) -> Replay:
    """Issue every entry at its deadline (module doc); with `crash_at`, crash the index
    (Crashable) before that entry."""
    entries = timeline.entries
    scale = 1.0 / (1000.0 * speedup) if speedup > 0 else 0.0
    first = entries[0].t_ms if entries else 0.0
    out = Replay([], [], 0.0)
    answers, lat = out.answers, out.query_s
    clock = time.perf_counter
    index.prepare(entries)
    t0 = clock()
    for i, e in enumerate(entries):
        if scale:
            wait = t0 + (e.t_ms - first) * scale - clock()
            if wait > 0:
                time.sleep(wait)
        if i == crash_at:
            cast(Crashable, index).crash()
            out.crashed_at = len(answers)
        if isinstance(e, Query):
            s = clock()
            a = index.query(e)
            if a is not None:
                lat.append(clock() - s)
            answers.append(a)
        else:
            s = clock()
            index.apply(e)
            out.apply_s += clock() - s
        if progress is not None and i % PROGRESS_EVERY == PROGRESS_EVERY - 1:
            progress(PROGRESS_EVERY)
    index.drain()
    out.seconds = clock() - t0
    if progress is not None:
        progress(len(entries) % PROGRESS_EVERY)
    return out


def score(queries: Sequence[Query], answers: Sequence[Answer | None], holders: int,
          start: int = 0) -> tuple[float, int, int]:
    """(agreement, holder_blocks_error, answered) over the answered queries from
    `start` on (module doc)."""
    agree = error = answered = 0
    for q, a in zip(queries[start:], answers[start:], strict=True):
        if a is None:
            continue
        answered += 1
        truth = q.truth
        best = int(truth.max()) if len(truth) else 0
        first = ranked(a, 1)
        agree += (int(truth[first[0][0]]) == best) if first else best == 0
        model = dict(ranked({w: int(r) for w, r in enumerate(truth.tolist())}, holders))
        error += sum(abs(a.get(w, 0) - model.get(w, 0)) for w in a.keys() | model.keys())
    return (agree / answered if answered else 1.0), error, answered


def measure(name: str, timeline: Timeline, speedup: float, rep: Replay,
            holders: int) -> RunResult:
    t = timeline.totals
    queries = list(timeline.queries())
    agreement, error, answered = score(queries, rep.answers, holders)
    window = timeline.span_ms / 1000.0 / speedup if speedup > 0 else None
    us = np.array(rep.query_s) * 1e6 if rep.query_s else np.zeros(1)
    s = rep.seconds or 1e-9
    return RunResult(
        index=name, speedup=speedup,
        offered_block_ops_per_s=t.block_ops / window if window else None,
        block_ops_per_s=t.block_ops / s, query_blocks_per_s=t.query_blocks / s,
        event_blocks_per_s=t.event_blocks / s,
        query_call_blocks_per_s=t.query_blocks / (sum(rep.query_s) or 1e-9),
        event_call_blocks_per_s=t.event_blocks / (rep.apply_s or 1e-9),
        query_us_p50=float(np.percentile(us, 50)), query_us_p99=float(np.percentile(us, 99)),
        agreement=agreement, holder_blocks_error=error, seconds=rep.seconds, window_s=window,
        queries_answered=answered)


def run_one(name: str, timeline: Timeline, speedup: float, cfg: FleetConfig, transport: str,
            root: Path, progress: ProgressFn | None = None) -> RunResult:
    """Open the index empty under `root`, replay, close, measure."""
    index = make_index(name, cfg, transport)
    root.mkdir(parents=True, exist_ok=True)
    try:
        index.open(root)
        try:
            rep = replay(index, timeline, speedup, progress)
        finally:
            index.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return measure(name, timeline, speedup, rep, cfg.holders)


def run_crash(timeline: Timeline, speedup: float, cfg: FleetConfig, transport: str, root: Path,
              progress: ProgressFn | None = None) -> dict[str, Any]:
    """sarp's kill -9 run (module doc): recovery_s, agreement_after_recovery, detail."""
    cfg = replace(cfg, sync="always")
    index = make_index("sarp", cfg, transport)
    root.mkdir(parents=True, exist_ok=True)
    try:
        index.open(root)
        try:
            rep = replay(index, timeline, speedup, progress, crash_at=len(timeline.entries) // 2)
            rec = cast(Crashable, index).recovery()
        finally:
            index.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    queries = list(timeline.queries())
    after = rep.crashed_at or 0
    agreement, error, answered = score(queries, rep.answers, cfg.holders, after)
    return {
        "speedup": speedup, "sync": "always", "transport": transport,
        "recovery_s": rec.ready_s if rec else None,
        "index_recovery_s": rec.index_s if rec else None,
        "requests_resent": rec.resent if rec else 0,
        "killed_after_queries": after,
        "queries_unanswered": sum(a is None for a in rep.answers),
        "agreement_after_recovery": agreement, "holder_blocks_error_after": error,
        "queries_after_recovery": answered, "seconds": rep.seconds,
    }
