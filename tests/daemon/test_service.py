"""Service (sarpd.daemon.service): phase scheduling, per-request results and the one
place where unexpected exceptions become `internal` answers, against a small fake index."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from sarpd.config import ServerConfig
from sarpd.core.store import Activity
from sarpd.daemon.service import MATCH_SPLIT, Service, contain, kind_of, schedule
from sarpd.errors import BadRequest, Busy, Internal, SarpError, StorageError
from sarpd.model import (
    Check,
    CheckReport,
    Clear,
    Dump,
    Hello,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Ping,
    Remove,
    RemoveResult,
    Report,
    Request,
    SeqSpec,
    Snapshot,
    SnapshotResult,
    Stats,
)


def seq(*tokens: int) -> SeqSpec:
    return SeqSpec(ns="", tokens=np.array(tokens, dtype=np.uint32))


class FakeIndex:
    """Keeps inserted first tokens in a set; logs every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.present: set[int] = set()
        self.fail_commit = False
        self.explode = False
        self.activity = Activity()  # the index's activity counters (read by the metrics)

    def match_many(self, reqs: Sequence[Match]) -> list[MatchResult | SarpError]:
        self.calls.append(("match", [r.id for r in reqs]))
        if self.explode:
            raise ZeroDivisionError("boom")
        out: list[MatchResult | SarpError] = []
        for r in reqs:
            assert r.seq.tokens is not None
            hit = int(r.seq.tokens[0]) in self.present
            out.append(MatchResult(blocks=int(hit), meta=np.zeros(int(hit), np.uint64)))
            self.activity.queried_blocks += 1
            self.activity.matched_blocks += int(hit)
            self.activity.segment_reads += 1
        return out

    def write_many(
        self, ops: Sequence[Insert | Remove | Clear]
    ) -> list[InsertResult | RemoveResult | SarpError]:
        self.calls.append(("write", [o.id for o in ops]))
        if self.fail_commit:
            raise StorageError("commit: disk full")
        out: list[InsertResult | RemoveResult | SarpError] = []
        for op in ops:
            if isinstance(op, Insert):
                assert op.seq.tokens is not None
                if int(op.seq.tokens[0]) == 999:
                    out.append(BadRequest("meta: 2 values for 1 block"))
                    continue
                new = int(op.seq.tokens[0]) not in self.present
                self.present.add(int(op.seq.tokens[0]))
                out.append(InsertResult(blocks=1, new_blocks=int(new), matched_blocks=1 - new))
            elif isinstance(op, Remove):
                assert op.seq is not None and op.seq.tokens is not None
                t = int(op.seq.tokens[0])
                out.append(RemoveResult(removed=int(t in self.present)))
                self.present.discard(t)
            else:
                out.append(RemoveResult(removed=len(self.present)))
                self.present.clear()
        return out

    def snapshot(self) -> SnapshotResult:
        self.calls.append(("snapshot", []))
        return SnapshotResult(segment_id=7, seconds=0.01)

    snapshot_current = False  # the fake never tracks its changes: always worth one
    changed_segments = 0

    def check(self, fix: bool = False) -> CheckReport:
        self.calls.append(("check", [int(fix)]))
        return CheckReport(segments=3)

    def stats(self) -> dict[str, int | float | str]:
        return {"blocks": len(self.present), "segments": 1, "directory_bytes": 64}


def make() -> tuple[Service, FakeIndex]:
    idx = FakeIndex()
    return Service(idx, ServerConfig(), "memory"), idx


def kinds(batch: list[tuple[str, Request]]) -> list[tuple[str, list[int]]]:
    return [(p.kind, [batch[i][1].id for i in p.members]) for p in schedule(batch)]


def test_match_then_insert_per_connection_is_two_phases() -> None:
    batch: list[tuple[str, Request]] = []
    for c in "abcd":
        base = ord(c) * 10
        batch.append((c, Match(base + 1, seq(base))))
        batch.append((c, Insert(base + 2, seq(base), meta=0)))
    phases = kinds(batch)
    assert [k for k, _ in phases] == ["read", "write"]
    assert phases[0][1] == [971, 981, 991, 1001]


def test_a_connection_never_goes_back_in_phases() -> None:
    batch: list[tuple[str, Request]] = [
        ("a", Insert(1, seq(1), meta=0)),
        ("a", Match(2, seq(1))),
        ("b", Match(3, seq(1))),  # other connection: may run before a's insert
        ("a", Insert(4, seq(2), meta=0)),
        ("b", Insert(5, seq(3), meta=0)),
    ]
    assert kinds(batch) == [("write", [1]), ("read", [2, 3]), ("write", [4, 5])]


def test_barriers_run_alone_and_keep_connection_order() -> None:
    batch: list[tuple[str, Request]] = [
        ("a", Insert(1, seq(1), meta=0)),
        ("a", Snapshot(2)),
        ("a", Match(3, seq(1))),
        ("b", Match(4, seq(1))),
        ("b", Snapshot(5)),
    ]
    phases = kinds(batch)
    assert phases == [("write", [1]), ("barrier", [2]), ("read", [3, 4]), ("barrier", [5])]
    # b's match precedes b's snapshot; a's match follows a's snapshot
    pos = {i: n for n, (_, ids) in enumerate(phases) for i in ids}
    assert pos[4] < pos[5] and pos[2] < pos[3]


def test_run_batch_sees_earlier_writes_of_the_same_connection() -> None:
    svc, idx = make()
    batch: list[tuple[str, Request]] = [
        ("a", Match(1, seq(5))),
        ("a", Insert(2, seq(5), meta=0)),
        ("a", Match(3, seq(5))),
        ("b", Ping(4)),
        ("b", Hello(5)),
    ]
    out = svc.run_batch(batch)
    assert isinstance(out[0], MatchResult) and out[0].blocks == 0
    assert out[1] == InsertResult(blocks=1, new_blocks=1, matched_blocks=0)
    assert isinstance(out[2], MatchResult) and out[2].blocks == 1
    assert out[3] is None
    hello = out[4]
    assert isinstance(hello, dict)
    assert hello["protocol"] == 1 and hello["backend"] == "memory"
    assert hello["block_tokens"] == 16 and hello["segment_blocks"] == 64
    assert hello["hash"] == "xxh3-128-chain-v1"
    assert [c for c, _ in idx.calls] == ["match", "write", "match"]


def test_one_match_call_and_one_write_call_for_a_typical_batch() -> None:
    svc, idx = make()
    batch: list[tuple[int, Request]] = []
    for conn in range(20):
        batch.append((conn, Match(conn * 2 + 1, seq(conn))))
        batch.append((conn, Insert(conn * 2 + 2, seq(conn), meta=1)))
    out = svc.run_batch(batch)
    assert [c for c, _ in idx.calls] == ["match", "write"]
    assert all(isinstance(r, MatchResult) for r in out[0::2])
    assert all(isinstance(r, InsertResult) for r in out[1::2])


def test_per_op_errors_stay_in_place() -> None:
    svc, _ = make()
    out = svc.run_batch([("a", Insert(1, seq(999), meta=0)), ("a", Insert(2, seq(1), meta=0))])
    assert isinstance(out[0], BadRequest)
    assert isinstance(out[1], InsertResult)


def test_failed_commit_answers_every_write_of_the_call() -> None:
    svc, idx = make()
    idx.fail_commit = True
    out = svc.run_batch(
        [("a", Insert(1, seq(1), meta=0)), ("b", Remove(2, seq(1))), ("c", Ping(3))]
    )
    assert isinstance(out[0], StorageError) and isinstance(out[1], StorageError)
    assert out[0].code == "unavailable"
    assert out[2] is None


def test_unexpected_exception_becomes_internal_with_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc, idx = make()
    idx.explode = True
    out = svc.run_batch([("a", Match(1, seq(1))), ("b", Match(2, seq(2))), ("c", Ping(3))])
    assert isinstance(out[0], Internal) and out[0].code == "internal"
    assert "trace" in out[0].message
    trace = out[0].message.split("trace ")[1].split(")")[0]
    assert trace in caplog.text
    assert out[2] is None


def test_stats_merges_index_and_service_counters() -> None:
    svc = Service(FakeIndex(), ServerConfig(), "memory", recovered_in_s=0.25)
    svc.run_batch([("a", Insert(1, seq(1), meta=0)), ("a", Match(2, seq(1)))])
    (stats,) = svc.run_batch([("a", Stats(3))])
    assert isinstance(stats, dict)
    assert stats["blocks"] == 1 and stats["directory_bytes"] == 64
    assert stats["requests"] == 3 and stats["matches"] == 1 and stats["inserts"] == 1
    assert stats["batches"] == 2 and stats["mean_batch_size"] == 1.5
    assert stats["recovered_in_s"] == 0.25
    assert isinstance(stats["uptime_s"], float)


def test_snapshot_and_clear() -> None:
    svc, idx = make()
    out = svc.run_batch(
        [("a", Insert(1, seq(1), meta=0)), ("a", Snapshot(2)), ("a", Clear(3, ns=""))]
    )
    assert out[1] == SnapshotResult(segment_id=7, seconds=0.01)
    assert out[2] == RemoveResult(removed=1)
    assert [c for c, _ in idx.calls] == ["write", "snapshot", "write"]


def test_check_is_a_barrier_and_passes_fix() -> None:
    svc, idx = make()
    batch: list[tuple[str, Request]] = [
        ("a", Match(1, seq(1))),
        ("b", Check(2, fix=True)),
        ("b", Ping(3)),
    ]
    assert kinds(batch) == [("read", [1]), ("barrier", [2]), ("read", [3])]
    out = svc.run_batch(batch)
    assert out[1] == CheckReport(segments=3)
    assert ("check", [1]) in idx.calls


# -- the one place that turns unexpected exceptions into `internal` answers ------------


def test_contain_answers_every_request_of_a_failed_call() -> None:
    def boom() -> list[object]:
        raise KeyError("bug")

    assert contain("x", 2, lambda: [1, 2]) == [1, 2]
    busy = Busy("later")

    def refuse() -> list[object]:
        raise busy

    assert contain("x", 3, refuse) == [busy] * 3
    (a, b) = contain("x", 2, boom)
    assert isinstance(a, Internal) and a is b and "internal error in x (trace " in a.message
    short = contain("match_many", 3, lambda: [1])
    assert all(isinstance(r, Internal) for r in short) and len(short) == 3
    mixed = contain("x", 3, lambda: [busy, ValueError("bug"), 7])
    assert mixed[0] is busy and isinstance(mixed[1], Internal) and mixed[2] == 7


def test_a_failing_barrier_or_stats_costs_only_its_own_answer() -> None:
    class Exploding(FakeIndex):
        def snapshot(self) -> SnapshotResult:
            raise OSError("disk gone")

        def stats(self) -> dict[str, int | float | str]:
            raise ZeroDivisionError("bug")

    svc = Service(Exploding(), ServerConfig(), "memory")
    out = svc.run_batch([
        ("a", Snapshot(1)), ("a", Ping(2)), ("b", Stats(3)), ("b", Hello(4)),
        ("c", Insert(5, seq(1), meta=0)),
    ])
    assert isinstance(out[0], Internal) and "barrier phase" in out[0].message
    assert out[1] is None and isinstance(out[2], Internal) and isinstance(out[3], dict)
    assert isinstance(out[4], InsertResult)
    assert svc.counters["errors"] == 2


def test_a_write_phase_bug_is_internal_for_the_whole_call() -> None:
    svc, idx = make()

    def broken(ops: Sequence[Insert | Remove | Clear]) -> list[object]:
        return [InsertResult(1, 1, 0)]  # one result for two writes

    idx.write_many = broken  # type: ignore[method-assign, assignment]
    out = svc.run_batch([("a", Insert(1, seq(1), meta=0)), ("b", Insert(2, seq(2), meta=0))])
    assert all(isinstance(r, Internal) for r in out)


def test_stats_includes_what_the_server_adds_and_the_reports() -> None:
    svc = Service(FakeIndex(), ServerConfig(), "memory",
                  extra_stats=lambda: {"queue_depth": 3, "hit_ratio": 0.5})
    (res,) = svc.run_batch([("a", Report(1, "bridge", {"gaps": 1.0}))])
    assert res is None
    (stats,) = svc.run_batch([("a", Stats(2))])
    assert isinstance(stats, dict)
    assert stats["queue_depth"] == 3 and stats["hit_ratio"] == 0.5
    assert stats["reports"]["bridge"]["gaps"] == 1.0
    assert stats["backend"] == "memory" and stats["sync"] == "always"


def test_every_request_type_has_its_phase_kind() -> None:
    """Looked up by type; a subclass takes its base's kind; anything else is a bug."""
    s = seq(1)
    kinds = {
        "read": [Match(1, s), Hello(1), Ping(1), Stats(1), Report(1, "x", {})],
        "write": [Insert(1, s, meta=0), Remove(1, seq=s), Clear(1, ns="")],
        "barrier": [Snapshot(1), Check(1), Dump(1, s)],
    }
    for kind, reqs in kinds.items():
        assert [kind_of(r) for r in reqs] == [kind] * len(reqs)

    class Later(Insert):
        __slots__ = ()

    assert kind_of(Later(1, s, meta=0)) == "write"
    with pytest.raises(Internal, match="no phase for request type Request"):
        kind_of(Request(1))


def test_a_read_phases_matches_are_split_over_the_match_pool_in_order() -> None:
    """worker_threads = 3: 3 * MATCH_SPLIT matches in 3 parts (this thread and two of the pool),
    answered in request order; a part whose match_many raises answers only its own."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    class Threaded(FakeIndex):
        def __init__(self) -> None:
            super().__init__()
            self.threads: list[str] = []

        def match_many(self, reqs: Sequence[Match]) -> list[MatchResult | SarpError]:
            self.threads.append(threading.current_thread().name)
            if any(int(r.seq.tokens[0]) == MATCH_SPLIT + 5 for r in reqs
                   if r.seq.tokens is not None):
                raise StorageError("read failed")
            return super().match_many(reqs)

    idx = Threaded()
    idx.present.update(range(0, 3 * MATCH_SPLIT, 2))
    with ThreadPoolExecutor(2, thread_name_prefix="pool") as pool:
        svc = Service(idx, ServerConfig(worker_threads=3), "memory", match_pool=pool)
        out = svc.run_batch([(0, Match(i, seq(i))) for i in range(3 * MATCH_SPLIT)])
    assert len(idx.threads) == 3 and sum(t.startswith("pool") for t in idx.threads) == 2
    for i, res in enumerate(out):
        if MATCH_SPLIT <= i < 2 * MATCH_SPLIT:  # the part holding token MATCH_SPLIT + 5
            assert isinstance(res, StorageError)
        else:
            assert isinstance(res, MatchResult) and res.blocks == int(i % 2 == 0), (i, res)
    assert svc.counters["match_calls"] == 3
    few = Service(idx, ServerConfig(worker_threads=3), "memory", match_pool=pool)
    idx.threads.clear()
    few.run_batch([(0, Match(i, seq(2 * i))) for i in range(2 * MATCH_SPLIT - 1)])  # one call
    assert idx.threads == [threading.current_thread().name]
