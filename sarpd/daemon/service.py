"""Service: runs one server batch against the index. Synchronous: no asyncio here.

The server hands over every request it gathered in one batching window, each with
the key of the connection it came from. PROTOCOL.md's ordering rule says that the
requests of one connection take effect in order and see the earlier ones, while
requests of different connections in one batch are all still unanswered, so they may
be reordered. `schedule` uses that freedom to put the batch into few phases:

- read phases (match, hello, ping, stats): one `index.match_many` call each;
- write phases (insert, remove, clear): one `index.write_many` call each, i.e. one
  backend write and one fsync;
- barriers (snapshot, check, dump): each runs alone.

A request goes to the earliest phase of its kind that is not earlier than the phase
of its connection's previous request (a barrier always opens a phase of its own, and
nothing of that connection may join it or precede it). The common case, every
connection sending "match then insert", is ONE match_many and ONE write_many.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, Protocol

import sarpd
from sarpd.config import ServerConfig
from sarpd.core import HASH_NAME, Activity, PendingSnapshot, dump_or_error
from sarpd.daemon.reports import Reports
from sarpd.errors import Internal, SarpError, StorageError
from sarpd.model import (
    Check,
    CheckReport,
    Clear,
    Dump,
    Hello,
    Insert,
    Match,
    Ping,
    Remove,
    Report,
    Request,
    SnapshotResult,
    Stats,
)
from sarpd.model import Snapshot as SnapshotReq
from sarpd.protocol.requests import negotiate

log = logging.getLogger("sarpd.daemon.service")

PhaseKind = Literal["read", "write", "barrier"]
Keyed = tuple[Hashable, Request]


class IndexLike(Protocol):
    """What the service needs of `sarpd.core.index.SarpIndex` (a fake implements it in
    tests). Its activity counters (`activity`) are read by the metrics, never copied."""

    @property
    def activity(self) -> Activity: ...

    def match_many(self, reqs: Sequence[Match]) -> Sequence[object]: ...

    def write_many(self, ops: Sequence[Insert | Remove | Clear], applied_seq: int | None = None,
                   sync: bool | None = None) -> Sequence[object]: ...

    def sync_now(self) -> None: ...

    def snapshot(self) -> SnapshotResult: ...

    def prepare_snapshot(self) -> PendingSnapshot: ...

    def finish_snapshot(self, pending: PendingSnapshot, path: Path) -> SnapshotResult: ...

    @property
    def snapshot_current(self) -> bool: ...

    @property
    def changed_segments(self) -> int: ...

    def check(self, fix: bool = False) -> CheckReport: ...

    def stats(self) -> dict[str, int | float | str]: ...


_KINDS: dict[type, PhaseKind] = {
    **{t: "read" for t in (Match, Hello, Ping, Stats, Report)},
    **{t: "write" for t in (Insert, Remove, Clear)},
    **{t: "barrier" for t in (SnapshotReq, Check, Dump)},
}


def kind_of(req: Request) -> PhaseKind:
    kind = _KINDS.get(type(req))  # one lookup per request (subclasses: the loop below)
    if kind is not None:
        return kind
    for cls, kind in _KINDS.items():
        if isinstance(req, cls):
            return kind
    raise Internal(f"op: no phase for request type {type(req).__name__}")


@dataclass(slots=True)
class Phase:
    kind: PhaseKind
    members: list[int] = field(default_factory=list)  # indices into the batch


def schedule(batch: Sequence[Keyed]) -> list[Phase]:
    """Phases in execution order; each holds batch indices in batch order."""
    phases: list[Phase] = []
    last: dict[Hashable, int] = {}  # connection -> phase of its previous request
    for i, (conn, req) in enumerate(batch):
        kind = kind_of(req)
        lo = last.get(conn, 0)
        if conn in last and (kind == "barrier" or phases[lo].kind == "barrier"):
            lo += 1  # a barrier shares its phase with nothing
        chosen = -1
        if kind != "barrier":
            for p in range(lo, len(phases)):
                if phases[p].kind == kind:
                    chosen = p
                    break
        if chosen < 0:
            phases.append(Phase(kind))
            chosen = len(phases) - 1
        phases[chosen].members.append(i)
        last[conn] = chosen
    return phases


def _count_applied(out: dict[str, object]) -> None:
    """A replica's writes come from its shard's log, not from its own batches (cluster
    mode: sarpd.daemon.forward): its `inserts`, `removes` and `clears` add what it
    applied from the log (the cluster map's `applied_writes`). A write it took is
    among those, counted once, so every replica caught up with the log says the same."""
    cluster = out.get("cluster")
    applied = cluster.get("applied_writes") if isinstance(cluster, Mapping) else None
    if not isinstance(applied, Mapping):
        return
    for key in ("inserts", "removes", "clears"):
        mine = out.get(key)
        out[key] = (mine if isinstance(mine, int) else 0) + int(applied.get(key, 0))


def _internal(exc: BaseException, what: str) -> Internal:
    trace = uuid.uuid4().hex[:12]
    log.error("internal error in %s (trace %s)", what, trace, exc_info=exc)
    return Internal(f"internal error in {what} (trace {trace}); see the sarpd log")


def contain(what: str, n: int, fn: Callable[[], Sequence[object]]) -> list[object]:
    """The n answers of `fn` (one call answering n requests). THE one place where an
    unexpected exception becomes an ``internal`` answer (with a trace id in the log):
    a `SarpError` raised by `fn` answers all n requests, any other exception, a wrong
    number of results, or a non-SarpError exception among them answers `internal`."""
    try:
        results = fn()
    except SarpError as exc:
        return [exc] * n
    except Exception as exc:
        return [_internal(exc, what)] * n
    if len(results) != n:
        bug = RuntimeError(f"{what} returned {len(results)} results for {n} requests")
        return [_internal(bug, what)] * n
    return [
        r if not isinstance(r, Exception) or isinstance(r, SarpError) else _internal(r, what)
        for r in results
    ]


MATCH_SPLIT = 64  # matches a thread takes at least: smaller parts gained nothing (issue 25)


class Service:
    """Answers batches of (connection key, request). Not thread-safe: the server runs
    one batch at a time in its single worker thread.

    `extra_stats` (given by the server) adds its gauges and metrics to `stats`;
    `recovered_in_s` is how long the daemon's recovery took. The service owns its
    batch and request counters (`counters`, answered by `stats`) and the clients'
    reports (`reports`, which the metrics read through the server)."""

    def __init__(
        self,
        index: IndexLike,
        config: ServerConfig,
        backend_name: str,
        *,
        recovered_in_s: float | None = None,
        extra_stats: Callable[[], Mapping[str, object]] = dict,
        clock: Callable[[], float] = time.monotonic,
        group_commit: bool = False,
        match_pool: Executor | None = None,
    ) -> None:
        self.index = index
        # a read phase's matches are split over this pool and the calling thread
        # (`worker_threads`; the server owns it); None: all on the calling thread
        self.match_pool = match_pool
        self.config = config
        self.match_threads = config.match_threads  # once: os.cpu_count() costs ~10 us
        self.backend_name = backend_name
        self.recovered_in_s = recovered_in_s
        self._extra_stats = extra_stats
        self._clock = clock
        self._started = clock()
        self.reports = Reports(clock)  # what clients (e.g. the vLLM bridge) report
        # group commit (sarpd/daemon/syncer.py): with sync "always", writes go out
        # unsynced and the server syncs them in groups; `unsynced`: this batch wrote
        self.group_commit = group_commit
        self.unsynced = False
        self.counters: dict[str, int] = {
            "requests": 0,
            "matches": 0,
            "inserts": 0,
            "removes": 0,
            "clears": 0,
            "snapshots": 0,
            "checks": 0,
            "errors": 0,
            "batches": 0,
            "phases": 0,
            "match_calls": 0,
            "write_calls": 0,
        }

    # -- batch -----------------------------------------------------------------

    def run_batch(self, batch: Sequence[Keyed]) -> list[object]:
        """One result (or SarpError) per request, in batch order. Never raises."""
        out: list[object] = [None] * len(batch)
        self.unsynced = False
        self.counters["batches"] += 1
        self.counters["requests"] += len(batch)
        try:
            phases = schedule(batch)
        except SarpError as exc:
            return [exc] * len(batch)
        self.counters["phases"] += len(phases)
        reqs = [req for _, req in batch]
        for phase in phases:
            members = [reqs[i] for i in phase.members]
            what = f"{phase.kind} phase"
            results = contain(what, len(members), partial(self._run_phase, phase.kind, members))
            for i, res in zip(phase.members, results, strict=True):
                out[i] = res
        self.counters["errors"] += sum(1 for r in out if isinstance(r, SarpError))
        return out

    def _run_phase(self, kind: PhaseKind, reqs: list[Request]) -> Sequence[object]:
        if kind == "read":
            return self._run_reads(reqs)
        if kind == "write":
            return self._run_writes(reqs)
        return [self._run_barrier(req) for req in reqs]

    def _run_reads(self, reqs: list[Request]) -> list[object]:
        """Every request of a read phase answered apart: a failing `match_many` costs
        the matches, not the pings, hellos and stats beside them."""
        out: list[object] = [None] * len(reqs)
        matches = [(i, r) for i, r in enumerate(reqs) if isinstance(r, Match)]
        if matches:
            self.counters["matches"] += len(matches)
            for (i, _), res in zip(matches, self._match([r for _, r in matches]), strict=True):
                out[i] = res
        for i, req in enumerate(reqs):
            if isinstance(req, Hello):
                out[i] = self.hello(req)
            elif isinstance(req, Stats):
                out[i] = contain("stats", 1, lambda: [self.stats()])[0]
            elif isinstance(req, Report):
                out[i] = contain("report", 1, partial(self._record_report, req))[0]
            # Ping: None
        return out

    def _match(self, reqs: list[Match]) -> list[object]:
        """The matches of a read phase: split in parts of at least MATCH_SPLIT over the
        match pool and this thread (no write runs meanwhile: the index answers
        matches from several threads at once), each part contained alone."""
        pool = self.match_pool
        parts = 1 if pool is None else min(len(reqs) // MATCH_SPLIT, self.match_threads)
        if parts <= 1:
            self.counters["match_calls"] += 1
            return contain("match_many", len(reqs), partial(self.index.match_many, reqs))
        assert pool is not None
        step = -(-len(reqs) // parts)
        chunks = [reqs[i : i + step] for i in range(0, len(reqs), step)]
        self.counters["match_calls"] += len(chunks)
        later = [pool.submit(contain, "match_many", len(c), partial(self.index.match_many, c))
                 for c in chunks[1:]]
        out = contain("match_many", len(chunks[0]), partial(self.index.match_many, chunks[0]))
        for fut in later:
            out.extend(fut.result())  # contain never raises
        return out

    def _record_report(self, req: Report) -> list[object]:
        self.reports.record(req)
        return [None]

    def _run_writes(self, reqs: list[Request]) -> Sequence[object]:
        ops: list[Insert | Remove | Clear] = []
        for req in reqs:
            assert isinstance(req, Insert | Remove | Clear)
            ops.append(req)
            if isinstance(req, Insert):
                self.counters["inserts"] += 1
            elif isinstance(req, Remove):
                self.counters["removes"] += 1
            else:
                self.counters["clears"] += 1
        self.counters["write_calls"] += 1
        try:
            if self.group_commit:
                self.unsynced = True  # set first: a failed write may have reached the log
                return self.index.write_many(ops, sync=False)
            return self.index.write_many(ops)
        except StorageError as exc:
            log.error("write batch of %d ops failed: %s", len(ops), exc)
            raise

    def _run_barrier(self, req: Request) -> object:
        """A barrier runs alone in its phase, so `run_batch` contains its failure."""
        if isinstance(req, SnapshotReq):
            self.counters["snapshots"] += 1
            return self.index.snapshot()
        if isinstance(req, Dump):
            return dump_or_error(self.index, req.seq)
        self.counters["checks"] += 1
        assert isinstance(req, Check)
        return self.index.check(req.fix)

    # -- ops answered by the service itself ------------------------------------

    def hello(self, req: Hello) -> dict[str, object]:
        protocol = negotiate(req.protocol)  # what the connection's decoder now speaks
        return {
            "server": sarpd.SERVER_NAME,
            "version": sarpd.__version__,
            "protocol": protocol,
            "max_protocol": sarpd.PROTOCOL_VERSION,
            "holders": protocol >= 2,
            "block_tokens": self.config.index.block_tokens,
            "segment_blocks": self.config.index.segment_blocks,
            "hash": HASH_NAME,
            "backend": self.backend_name,
        }

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = dict(self.index.stats())
        out.update(self.counters)
        batches = self.counters["batches"]
        out["mean_batch_size"] = self.counters["requests"] / batches if batches else 0.0
        out["uptime_s"] = self._clock() - self._started
        out["recovered_in_s"] = self.recovered_in_s
        out["backend"] = self.backend_name
        out["sync"] = self.config.sync
        reports = self.reports.snapshot()
        if reports:
            out["reports"] = reports
        out.update(self._extra_stats())
        _count_applied(out)
        return out

    # -- daemon housekeeping (run in the worker thread, between batches) -------

    def prepare_periodic_snapshot(self) -> PendingSnapshot | None:
        """A snapshot's content (`SarpIndex.prepare_snapshot`: the daemon writes it off
        the worker, then calls `finish_snapshot`), unless the newest one already holds
        every change (an index that says so with `snapshot_current`): None."""
        if self.index.snapshot_current:
            return None
        self.counters["snapshots"] += 1
        return self.index.prepare_snapshot()

    def finish_snapshot(self, pending: PendingSnapshot, path: Path) -> SnapshotResult:
        return self.index.finish_snapshot(pending, path)
