"""The bridge's counters (sarpd.bridge.stats): the flat form of sarpd's `report` op,
the status line, and the Prometheus export."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sarpd.bridge.stats import BridgeStats, serve_metrics
from tests.daemon_helpers import free_port


def sample_stats() -> BridgeStats:
    st = BridgeStats(batches=4, blocks_new=30, unknown_parent=2, last_seq=41, lag_s=0.25)
    st.events["stored"] = 7
    st.events["removed"] = 1
    st.ignore("remote")
    st.ignore("remote")
    st.ignore("partial")
    st.drop("unreplayed", 3)
    return st


def test_flat_names_every_counter_once() -> None:
    st = sample_stats()
    flat = st.flat()
    assert flat["events_stored"] == 7 and flat["events_removed"] == 1
    assert flat["events_cleared"] == 0 and flat["events_ignored"] == 3
    assert flat["ignored_remote"] == 2 and flat["ignored_partial"] == 1
    assert flat["dropped"] == 3 and flat["dropped_unreplayed"] == 3
    assert flat["batches"] == 4 and flat["last_seq"] == 41 and flat["lag_s"] == 0.25
    assert not {"events", "ignored_by", "dropped_by"} & set(flat)
    assert all(isinstance(v, int | float) for v in flat.values())
    by_reason = len(st.ignored_by) + len(st.dropped_by)
    assert len(flat) == len(st.as_dict()) - 3 + len(st.events) + by_reason
    assert BridgeStats().events is not BridgeStats().events  # no shared default
    assert BridgeStats().ignored_by is not BridgeStats().ignored_by


def test_status_line() -> None:
    line = sample_stats().line()
    assert line.startswith("seq 41: events stored 7 removed 1 cleared 0 ignored 3; ")
    assert "blocks +30 -0; unknown_parent 2, dropped 3," in line
    assert line.endswith("lag 0.250 s, hash disagreements 0 of 0; ignored partial 1, "
                         "remote 2; dropped unreplayed 3")
    # no reasons, no tail
    assert BridgeStats().line().endswith("lag 0.000 s, hash disagreements 0 of 0")


def test_metrics_export_reads_the_live_counters() -> None:
    st = sample_stats()
    port = free_port()
    serve_metrics(st, port, worker=9)
    st.batches += 1  # read at each scrape, not copied at registration

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
        if s.name.startswith("sarp_bridge_")
    }
    w = (("worker", "9"),)
    assert samples[("sarp_bridge_events_total", (("type", "stored"), *w))] == 7
    assert samples[("sarp_bridge_batches_total", w)] == 5
    assert samples[("sarp_bridge_unknown_parent_total", w)] == 2
    assert samples[("sarp_bridge_last_seq", w)] == 41
    assert samples[("sarp_bridge_lag_s", w)] == 0.25
    assert samples[("sarp_bridge_ignored_total", (("reason", "remote"), *w))] == 2
    assert samples[("sarp_bridge_dropped_reason_total", (("reason", "unreplayed"), *w))] == 3
    assert samples[("sarp_bridge_replay_malformed_total", w)] == 0
    # the peers' counters and gauges (sarpd.bridge.peers), also while sarpd is down
    assert samples[("sarp_bridge_sarpd_unreachable_total", w)] == 0
    assert samples[("sarp_bridge_publisher_unreachable_total", w)] == 0
    assert samples[("sarp_bridge_sarpd_down_s", w)] == 0
    assert samples[("sarp_bridge_publisher_silent_s", w)] == 0
