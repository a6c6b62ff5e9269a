"""The `report` op: clients' own counters (e.g. the vLLM bridge's) in sarpd's stats and
Prometheus metrics; every malformed report is a clean error naming the field."""

from __future__ import annotations

import pytest

from sarpd.client import SyncClient
from sarpd.daemon.metrics import Metrics
from sarpd.daemon.reports import MAX_SOURCES, Reports
from sarpd.errors import BadRequest, TooLarge
from sarpd.model import Report
from sarpd.protocol.requests import MAX_REPORT_COUNTERS as MAX_COUNTERS
from sarpd.protocol.requests import parse_report
from tests.daemon_helpers import SarpdProc


@pytest.mark.parametrize(("fields", "error", "says"), [
    ({"counters": {}}, BadRequest, "source: expected a non-empty str"),
    ({"source": "", "counters": {}}, BadRequest, "source"),
    ({"source": "x" * 129, "counters": {}}, TooLarge, "129 bytes exceeds 128"),
    ({"source": "b"}, BadRequest, "counters: expected a map"),
    ({"source": "b", "counters": {"Bad-Name": 1}}, BadRequest, "is not [a-z]"),
    ({"source": "b", "counters": {"gaps": "3"}}, BadRequest, "counters.gaps: expected a finite"),
    ({"source": "b", "counters": {"lag_s": float("nan")}}, BadRequest, "counters.lag_s"),
    ({"source": "b", "counters": {f"c{i}": i for i in range(MAX_COUNTERS + 1)}}, TooLarge,
     f"{MAX_COUNTERS + 1} entries exceeds {MAX_COUNTERS}"),
])
def test_malformed_reports_name_the_field(fields: dict[str, object], error: type[Exception],
                                          says: str) -> None:
    with pytest.raises(error) as exc:
        parse_report(1, fields)
    assert says in str(exc.value)


def test_reports_are_bounded_and_exported() -> None:
    t = [100.0]
    reports = Reports(clock=lambda: t[0])
    reports.record(parse_report(1, {"source": "bridge-a", "counters": {"gaps": 2, "lag_s": 0.5}}))
    t[0] = 103.0
    assert reports.snapshot() == {"bridge-a": {"gaps": 2.0, "lag_s": 0.5, "age_s": 3.0}}
    for i in range(MAX_SOURCES - 1):
        reports.record(Report(0, f"s{i}", {}))
    with pytest.raises(TooLarge, match=f"the limit is {MAX_SOURCES}"):
        reports.record(Report(0, "one-too-many", {}))
    reports.record(Report(0, "bridge-a", {"gaps": 3}))  # a known source still updates
    metrics = Metrics()
    metrics.reported = reports.snapshot
    fam = [f for f in metrics.families() if f.name == "sarpd_reported"]
    assert len(fam) == 1
    got = {(s.labels["source"], s.labels["name"]): s.value for s in fam[0].samples}
    assert got[("bridge-a", "gaps")] == 3.0


def test_daemon_keeps_the_newest_report_of_each_source(sarpd_proc: SarpdProc) -> None:
    with SyncClient(sarpd_proc.socket) as c:
        c.report("bridge-vllm-w1", {"events_stored": 10, "gaps": 0})
        c.report("bridge-vllm-w1", {"events_stored": 12, "gaps": 1})
        c.report("bridge-vllm-w2", {"events_stored": 5})
        with pytest.raises(BadRequest, match="counters"):
            c.report("bridge-vllm-w3", {"no such": 1})
        reps = c.stats()["reports"]
    assert reps["bridge-vllm-w1"]["events_stored"] == 12 and reps["bridge-vllm-w1"]["gaps"] == 1
    assert reps["bridge-vllm-w2"]["events_stored"] == 5 and "bridge-vllm-w3" not in reps
