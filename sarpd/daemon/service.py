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
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import sarpd
from sarpd.config import ServerConfig
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

log = logging.getLogger("sarpd.daemon.service")

PhaseKind = Literal["read", "write", "barrier"]
Keyed = tuple[Hashable, Request]


class IndexLike(Protocol):
    """What the service needs of `sarpd.core.index.SarpIndex` (a fake implements it in tests)."""

    def match_many(self, reqs: Sequence[Match]) -> list[Any]: ...

    def write_many(self, ops: Sequence[Insert | Remove | Clear]) -> list[Any]: ...

    def snapshot(self) -> SnapshotResult: ...

    def check(self, fix: bool = False) -> CheckReport: ...

    def stats(self) -> dict[str, int | float | str]: ...


def kind_of(req: Request) -> PhaseKind:
    if isinstance(req, Match | Hello | Ping | Stats | Report):
        return "read"
    if isinstance(req, Insert | Remove | Clear):
        return "write"
    if isinstance(req, SnapshotReq | Check | Dump):
        return "barrier"
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


def _internal(exc: BaseException, what: str) -> Internal:
    trace = uuid.uuid4().hex[:12]
    log.error("internal error in %s (trace %s)", what, trace, exc_info=exc)
    return Internal(f"internal error in {what} (trace {trace}); see the sarpd log")


class Service:
    """Answers batches of (connection key, request). Not thread-safe: the server runs
    one batch at a time in its single worker thread."""

    def __init__(
        self,
        index: IndexLike,
        config: ServerConfig,
        backend_name: str,
        *,
        clock: Any = time.monotonic,
    ) -> None:
        self.index = index
        self.config = config
        self.backend_name = backend_name
        self._clock = clock
        self._started = clock()
        self.recovered_in_s: float | None = None
        self.reports = Reports(clock)  # what clients (e.g. the vLLM bridge) report
        # merged into `stats`: the server's gauges and metrics counters
        self.extra_stats: Callable[[], Mapping[str, object]] | None = None
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
        """One result (or SarpError) per request, in batch order."""
        out: list[object] = [None] * len(batch)
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
            try:
                results = self._run_phase(phase.kind, members)
            except SarpError as exc:
                results = [exc] * len(members)
            except Exception as exc:
                results = [_internal(exc, f"{phase.kind} phase")] * len(members)
            for i, res in zip(phase.members, results, strict=True):
                out[i] = res
        self.counters["errors"] += sum(isinstance(r, SarpError) for r in out)
        return out

    def _run_phase(self, kind: PhaseKind, reqs: list[Request]) -> list[object]:
        if kind == "read":
            return self._run_reads(reqs)
        if kind == "write":
            return self._run_writes(reqs)
        return [self._run_barrier(req) for req in reqs]

    def _run_reads(self, reqs: list[Request]) -> list[object]:
        out: list[object] = [None] * len(reqs)
        matches = [(i, r) for i, r in enumerate(reqs) if isinstance(r, Match)]
        if matches:
            self.counters["matches"] += len(matches)
            self.counters["match_calls"] += 1
            try:
                raw = self.index.match_many([r for _, r in matches])
                results = self._checked(raw, len(matches), "match_many")
            except SarpError as exc:
                results = [exc] * len(matches)
            except Exception as exc:
                results = [_internal(exc, "match_many")] * len(matches)
            for (i, _), res in zip(matches, results, strict=True):
                out[i] = res
        for i, req in enumerate(reqs):
            if isinstance(req, Hello):
                out[i] = self.hello()
            elif isinstance(req, Stats):
                out[i] = self._guard(self.stats, "stats")
            elif isinstance(req, Report):
                out[i] = self._guard(lambda r=req: self.reports.record(r), "report")
            # Ping: None
        return out

    def _run_writes(self, reqs: list[Request]) -> list[object]:
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
            results = self.index.write_many(ops)
        except StorageError as exc:
            log.error("write batch of %d ops failed: %s", len(ops), exc)
            return [exc] * len(ops)
        return self._checked(results, len(ops), "write_many")

    def _run_barrier(self, req: Request) -> object:
        if isinstance(req, SnapshotReq):
            self.counters["snapshots"] += 1
            return self._guard(self.index.snapshot, "snapshot")
        if isinstance(req, Dump):
            from sarpd.core.inspection import dump_or_error

            seq = req.seq
            return self._guard(lambda: dump_or_error(self.index, seq), "dump")
        self.counters["checks"] += 1
        assert isinstance(req, Check)
        fix = req.fix
        return self._guard(lambda: self.index.check(fix), "check")

    @staticmethod
    def _checked(results: list[Any], n: int, what: str) -> list[object]:
        if len(results) != n:
            err = _internal(
                RuntimeError(f"{what} returned {len(results)} results for {n} requests"), what
            )
            return [err] * n
        return [
            r if not isinstance(r, Exception) or isinstance(r, SarpError) else _internal(r, what)
            for r in results
        ]

    @staticmethod
    def _guard(fn: Any, what: str) -> object:
        try:
            return fn()
        except SarpError as exc:
            return exc
        except Exception as exc:
            return _internal(exc, what)

    # -- ops answered by the service itself ------------------------------------

    def hash_name(self) -> str:
        name = getattr(self.index, "hash_name", None)
        if isinstance(name, str):
            return name
        try:
            from sarpd.core import ids
        except ImportError:
            return "unknown"
        return str(getattr(ids, "HASH_NAME", "unknown"))

    def hello(self) -> dict[str, object]:
        return {
            "server": sarpd.SERVER_NAME,
            "version": sarpd.__version__,
            "protocol": sarpd.PROTOCOL_VERSION,
            "block_tokens": self.config.index.block_tokens,
            "segment_blocks": self.config.index.segment_blocks,
            "hash": self.hash_name(),
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
        if self.extra_stats is not None:
            out.update(self.extra_stats())
        return out

    # -- daemon housekeeping (run in the worker thread, between batches) -------

    def periodic_snapshot(self) -> SnapshotResult:
        self.counters["snapshots"] += 1
        return self.index.snapshot()

