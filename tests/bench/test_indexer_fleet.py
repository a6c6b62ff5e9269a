"""tools/bench/indexer_fleet.py: the fleet phase's plan (every batch of the fleet's
timeline, encoded as vLLM publishes it, due at its trace time over the speedup, every
5th of an engine and each engine's last ending with a marker) and a run of the phase
on a real sarpd, with either way of asking for the markers: every marker seen, the
engines unregistered after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sarpd.events.schema import BlockStored, decode_batch
from tools.bench import fleet_model as fm
from tools.bench.indexer_fleet import GPU_BLOCKS, MARKER_EVERY, FleetOptions, fleet_lag, plan
from tools.bench.indexer_parts import WATCHES, Http, Workload, sarp_indexer

TRACE = Path(FleetOptions().trace)
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="the fleet's trace is not here")


def test_the_plan_paces_every_batch_and_marks_every_fifth_of_each_engine() -> None:
    opts = FleetOptions(speedup=8.0, requests=40, engines=3)
    planned, run = plan(opts, Workload(1, 0))
    tl = fm.build_timeline(fm.load_requests(opts.trace, workers=3, limit=40), 3, GPU_BLOCKS)
    batches = [e for e in tl.entries if isinstance(e, fm.Batch)]
    assert run.batches == len(batches) and len(planned) == len(batches) + 3
    assert run.blocks == tl.totals.event_blocks
    assert sum(run.stored_tenths) + sum(run.removed_tenths) == run.blocks
    for p, b in zip(planned, batches, strict=False):
        assert p.engine == b.worker
        assert p.due_s == pytest.approx((b.t_ms - batches[0].t_ms) / 1000 / 8.0)
        events = decode_batch(p.payload).events
        assert sum(len(e.block_hashes) for e in events) == b.blocks + (p.marker is not None)
    per_engine = [sum(b.worker == w for b in batches) for w in range(3)]
    assert sum(p.marker is not None for p in planned) == sum(
        n // MARKER_EVERY for n in per_engine) + 3
    assert all(p.marker is not None for p in planned[-3:])
    assert [p.due_s for p in planned] == sorted(p.due_s for p in planned)
    last = decode_batch(planned[-1].payload).events
    assert isinstance(last[0], BlockStored) and last[0].parent is None


@pytest.mark.parametrize("method", sorted(WATCHES))
def test_the_phase_on_sarpd_sees_every_marker_and_unregisters_its_engines(
        tmp_path: Path, method: str) -> None:
    ix = sarp_indexer(tmp_path)
    ix.spawn()
    try:
        ix.wait_up()
        markers, run, _ = fleet_lag([ix], Workload(1, 0), 1,
                                    FleetOptions(speedup=2000.0, requests=30, engines=2),
                                    WATCHES[method])
        assert markers and all("sarp" in m.seen for m in markers)
        assert run.batches > 0
        http_ = Http(ix.port)
        assert http_.request("GET", "/workers") == (200, [])
        http_.close()
    finally:
        ix.kill9()
