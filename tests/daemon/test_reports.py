"""The `report` op's store (sarpd.daemon.reports): the newest counters of each client
(e.g. the vLLM bridge), bounded, in sarpd's stats. (Validation of a report is tested in
tests/protocol/test_requests.py, its export in tests/daemon/test_metrics.py.)"""

from __future__ import annotations

import pytest

from sarpd.client import SyncClient
from sarpd.daemon.reports import MAX_SOURCES, Reports
from sarpd.errors import BadRequest, TooLarge
from sarpd.model import Report
from sarpd.protocol.requests import parse_report
from tests.daemon_helpers import SarpdProc


def test_reports_are_bounded_and_keep_the_newest() -> None:
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
    assert reports.snapshot()["bridge-a"] == {"gaps": 3.0, "age_s": 0.0}
    assert len(reports.snapshot()) == MAX_SOURCES


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
