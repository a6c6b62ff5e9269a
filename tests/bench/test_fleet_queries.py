"""tools/bench/fleet_queries.py: the fleet's timeline replayed into sarp alone, then its
queries again on the final state; the figures cover every event and query."""

from __future__ import annotations

from tests.bench.fleet_workload import WORKERS, small_timeline
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Query
from tools.bench.fleet_queries import replay


def test_replay_times_every_event_and_query() -> None:
    tl = small_timeline(n=40)
    got = replay(tl, FleetConfig(WORKERS, WORKERS), passes=2)
    assert got["queries"] == sum(isinstance(e, Query) for e in tl.entries) > 0
    assert got["event_blocks_per_cpu_s"] > 0 and got["query_blocks_per_cpu_s"] > 0
    assert got["final_us_per_query"] > 0
    assert replay(tl, FleetConfig(WORKERS, WORKERS), passes=0)["final_us_per_query"] == 0
