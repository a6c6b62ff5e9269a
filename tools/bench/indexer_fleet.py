"""The indexer-API bench's fleet phase: the fleet bench's engines publishing at its
pace, into both indexers through their own listeners, and the lag of their events.

The engines are the fleet bench's (tools/bench/fleet_model.py): the first
`--fleet-requests` rows of the Mooncake trace served by `--fleet-engines` engines with
vLLM's prefix cache (16,384 GPU blocks each), blocks of 16 tokens, their tokens a
function of each block's content (tools/bench/fleet_bridge.py, as the fleet bench's
`--bridge` transport publishes them). Each engine is a publisher of vLLM's current
schema with its replay endpoint, registered on every indexer (instances numbered after
the bench's own engines, the bench's model), and publishes its batches at their trace
times divided by `--fleet-speedup` (16: the fleet bench's default). Every
`MARKER_EVERY`-th batch of an engine ends with a store of a marker block; a prober
per index and engine asks /query for each marker until its engine shows
(tools/bench/indexer_parts.watch; `--watch serial`: one per index):
`event_lag_ms_*` from publish() to that answer, and whether the lag grows over the
run (`backlog_grows`). The payloads are encoded before the clock
starts, so the pace is the trace's. Afterwards the engines are unregistered from both
indexers (their blocks cleared), so the phases after this one see the bench's own
engines only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.bench import fleet_model as fm
from tools.bench import vllm_schema as vs
from tools.bench.fleet_bridge import events_of
from tools.bench.indexer_parts import (
    BLOCK,
    MODEL,
    Http,
    Indexer,
    Marker,
    Watch,
    Workload,
    instance_id,
    register,
)
from tools.bench.vllm_publisher import Publisher

TRACE = "/work/shared/traces/mooncake_fast25_conversation_trace.jsonl"
GPU_BLOCKS = 16_384
MARKER_EVERY = 5


@dataclass(frozen=True, slots=True)
class FleetOptions:
    speedup: float = 16.0
    requests: int = 1000
    engines: int = 16
    trace: str = TRACE


@dataclass(frozen=True, slots=True)
class Planned:
    """One engine batch, encoded, due `due_s` after the start; `marker`: its tokens."""

    engine: int  # the fleet engine (0-based)
    due_s: float
    payload: bytes
    marker: list[int] | None


@dataclass
class FleetRun:
    batches: int = 0
    blocks: int = 0  # hashes in the batches' stores and removals
    span_s: float = 0.0  # the paced timeline's length
    behind_s: float = 0.0  # how late the publishing loop was at worst
    # blocks stored / removed in each tenth of the timeline: the load the lag's tenths
    # saw (removals start once the engines' caches are full)
    stored_tenths: list[int] = field(default_factory=lambda: [0] * 10)
    removed_tenths: list[int] = field(default_factory=lambda: [0] * 10)


def plan(opts: FleetOptions, wl: Workload) -> tuple[list[Planned], FleetRun]:
    """Every batch of the fleet's timeline, encoded, with its due time."""
    reqs = fm.load_requests(opts.trace, workers=opts.engines, limit=opts.requests)
    timeline = fm.build_timeline(reqs, opts.engines, GPU_BLOCKS)
    batches = [e for e in timeline.entries if isinstance(e, fm.Batch)]
    first = batches[0].t_ms if batches else 0.0
    sent = [0] * opts.engines
    out = []
    for b in batches:
        events = events_of(b, BLOCK)
        sent[b.worker] += 1
        tokens = None
        if sent[b.worker] % MARKER_EVERY == 0:
            event, tokens = wl.marker()
            events.append(event)
        due = (b.t_ms - first) / 1000.0 / opts.speedup
        out.append(Planned(b.worker, due, vs.encode_events(events), tokens))
    for w in range(opts.engines):  # every engine's last batch is a marker
        event, tokens = wl.marker()
        out.append(Planned(w, out[-1].due_s if out else 0.0, vs.encode_events([event]), tokens))
    run = FleetRun(len(batches), timeline.totals.event_blocks, out[-1].due_s if out else 0.0)
    last = batches[-1].t_ms if batches else 0.0
    for b in batches:
        tenth = min(9, int(10 * (b.t_ms - first) / (last - first))) if last > first else 0
        for ev in b.events:
            counts = run.stored_tenths if isinstance(ev, fm.Stored) else run.removed_tenths
            counts[tenth] += len(ev.hashes)
    return out, run


async def publish(planned: Sequence[Planned], pubs: Sequence[Publisher], first: int,
                  run: FleetRun, markers: list[Marker]) -> None:
    """Each batch at its due time (markers appended as they go out)."""
    t0 = time.perf_counter()
    for p in planned:
        delay = t0 + p.due_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        run.behind_s = max(run.behind_s, -delay)
        pubs[p.engine].publish(p.payload)
        if p.marker is not None:
            markers.append(Marker(first + p.engine, p.marker, time.perf_counter()))


async def observe(ixs: Sequence[Indexer], planned: Sequence[Planned],
                  pubs: Sequence[Publisher], first: int, run: FleetRun,
                  watch: Watch) -> list[Marker]:
    markers: list[Marker] = []
    done = asyncio.Event()
    watchers = [asyncio.ensure_future(watch(ix, markers, done)) for ix in ixs]
    try:
        await publish(planned, pubs, first, run, markers)
    finally:
        done.set()
        await asyncio.gather(*watchers)
    return markers


def unregister(ixs: Sequence[Indexer], first: int, engines: int) -> None:
    for ix in ixs:
        http_ = Http(ix.port, timeout=120.0)
        try:
            for e in range(first, first + engines):
                status, body = http_.request("POST", "/unregister", {
                    "instance_id": instance_id(e), "model_name": MODEL})
                if status != 200:
                    raise RuntimeError(f"{ix.name}: /unregister answered {status}: {body}")
        finally:
            http_.close()


def fleet_lag(ixs: Sequence[Indexer], wl: Workload, first: int, opts: FleetOptions,
              watch: Watch) -> tuple[list[Marker], FleetRun, float]:
    """Run the phase (module doc): the markers, the run, and its end (perf_counter)."""
    planned, run = plan(opts, wl)
    pubs = [Publisher() for _ in range(opts.engines)]
    try:
        register(ixs, pubs, first)
        markers = asyncio.run(observe(ixs, planned, pubs, first, run, watch))
        end = time.perf_counter()
        unregister(ixs, first, opts.engines)
    finally:
        for p in pubs:
            p.close()
    return markers, run, end


def describe(run: FleetRun, opts: FleetOptions) -> dict[str, Any]:
    return {"fleet_speedup": opts.speedup, "fleet_requests": opts.requests,
            "fleet_engines": opts.engines, "fleet_batches": run.batches,
            "fleet_event_blocks": run.blocks, "fleet_span_s": run.span_s,
            "fleet_blocks_per_s": run.blocks / run.span_s if run.span_s else None,
            "fleet_publish_behind_s": run.behind_s,
            "fleet_stored_blocks_tenths": run.stored_tenths,
            "fleet_removed_blocks_tenths": run.removed_tenths}
