"""The bridge's peers (sarpd.bridge.peers): when an outage is said
(first failure, then at most every repeat_s, its recovery once) and what it counts."""

from __future__ import annotations

import logging

import pytest

from sarpd.bridge.peers import Outage, SarpdWatch
from sarpd.bridge.stats import BridgeStats


def test_outage_warns_first_then_every_repeat_then_recovers() -> None:
    o = Outage(repeat_s=30.0)
    said = [t for t in (0.0, 0.1, 5.0, 29.9, 30.0, 45.0, 60.5) if o.fail(t)]
    assert said == [0.0, 30.0, 60.5]
    assert (o.count, o.failures, o.down_s(70.0)) == (1, 7, 70.0)
    assert o.recover(71.0) == (71.0, True) and o.recover(72.0) is None
    assert o.fail(100.0) and o.count == 2  # a new outage: said at once, counted


def test_outage_grace_delays_the_first_warning() -> None:
    o = Outage(repeat_s=30.0, grace_s=3.0)
    o.begin(10.0)
    assert [t for t in (10.0, 12.9, 13.0, 14.0) if o.due(t)] == [13.0]
    assert o.count == 1
    short = Outage(repeat_s=30.0, grace_s=3.0)
    short.begin(0.0)
    assert not short.due(1.0) and short.recover(2.0) == (2.0, False) and short.count == 0


def test_sarpd_watch_logs_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    stats = BridgeStats()
    watch = SarpdWatch("/run/x.sock", stats, repeat_s=30.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "sarpd.bridge")
    for t in (0.0, 0.1, 0.3, 31.0):
        now[0] = t
        watch.failed("sarpd socket /run/x.sock does not exist", 5.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("sarpd unreachable: sarpd socket /run/x.sock does not exist")
    assert warnings[1].startswith("sarpd still unreachable after 31 s (4 attempts)")
    assert (stats.sarpd_unreachable, stats.sarpd_connect_failures, stats.sarpd_down_s) == (
        1, 4, 31.0)  # fmt: skip
    assert "SARPD UNREACHABLE for 31 s" in stats.line()
    now[0] = 32.5
    watch.connected()
    last = caplog.records[-1]
    assert last.levelno == logging.WARNING  # said as loud as the outage was
    assert last.getMessage() == "sarpd at /run/x.sock connected, after 32.5 s unreachable"
    assert stats.sarpd_down_s == 0.0 and "UNREACHABLE" not in stats.line()
    assert stats.flat()["sarpd_unreachable"] == 1
