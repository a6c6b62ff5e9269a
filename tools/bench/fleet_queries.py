"""The fleet's queries on sarp alone, in thread CPU time (issue 25: an A/B of two builds).

    python -m tools.bench.fleet_queries --passes 8
    python -m tools.bench.fleet_queries --requests 1000 --json -

Replays the fleet benchmark's timeline (tools/bench/fleet_model.py: the Mooncake
conversation trace, 16 engines, vLLM's block size) into sarp in this process, as
`python -m tools.bench.fleet --in-process` drives it (tools/bench/fleet_sarp.py
SarpInProcess: one `write_many` per event batch, one `match_many` per query), and
times each call in thread CPU time (`time.thread_time`: what another process on a
shared machine takes is not counted, unlike wall time). Then every query of the
timeline runs again `--passes` times on the final state; the best pass is reported
(`final_us_per_query`). No other index runs: for a ratio against Dynamo use
`tools.bench.fleet`; this tool compares two builds of sarp, each run in its own tree,
alternated (the machine's speed moves by +-25 % within minutes).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from sarpd.ctl.common import write_json
from sarpd.model import Match, SeqSpec
from tools.bench.fleet import DEFAULT_TRACE
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Query, Timeline, build_timeline, load_requests
from tools.bench.fleet_sarp import NS, SarpInProcess
from tools.bench.sarp_index import as_hashes


def measure(trace: Path, requests: int, workers: int, passes: int) -> dict[str, float]:
    """`replay` of the fleet's timeline of `trace` (its first `requests` rows)."""
    reqs = load_requests(trace, workers=workers, trace_block_tokens=512, block_tokens=16,
                         limit=requests, seed=0)
    return replay(build_timeline(reqs, workers, 16384, 20.0),
                  FleetConfig(workers=workers, holders=min(workers, 1024)), passes)


def replay(timeline: Timeline, cfg: FleetConfig, passes: int) -> dict[str, float]:
    """The replay's event and query rates, and the best pass over the final state."""
    t_ev = t_q = 0.0
    ev_blocks = q_blocks = 0
    with tempfile.TemporaryDirectory() as tmp:
        sarp = SarpInProcess(cfg)
        sarp.open(Path(tmp))
        try:
            for entry in timeline.entries:
                t0 = time.thread_time()
                if isinstance(entry, Query):
                    sarp.query(entry)
                    t_q += time.thread_time() - t0
                    q_blocks += len(entry.hashes)
                else:
                    sarp.apply(entry)
                    t_ev += time.thread_time() - t0
                    ev_blocks += sum(len(ev.hashes) for ev in entry.events)
            batches = [[Match(0, SeqSpec(NS, hashes=as_hashes(e.hashes)), holders=cfg.holders)]
                       for e in timeline.entries if isinstance(e, Query)]
            best = float("inf")
            for _ in range(passes):
                t0 = time.thread_time()
                for batch in batches:
                    sarp.ix.match_many(batch)
                best = min(best, time.thread_time() - t0)
        finally:
            sarp.close()
    return {
        "event_blocks_per_cpu_s": ev_blocks / t_ev if t_ev else 0.0,
        "query_blocks_per_cpu_s": q_blocks / t_q if t_q else 0.0,
        "queries": len(batches),
        "final_us_per_query": best / len(batches) * 1e6 if batches and passes else 0.0,
    }


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=DEFAULT_TRACE, show_default=True,
              help="Mooncake-format JSON Lines trace (512 tokens per hash id).")
@click.option("--requests", type=click.IntRange(1), default=1000, show_default=True,
              help="Replay the trace's first N rows.")
@click.option("-n", "--workers", type=click.IntRange(1, 65535), default=16, show_default=True,
              help="Simulated engines.")
@click.option("--passes", type=click.IntRange(0), default=8, show_default=True,
              help="Passes of every query over the final state (the best is reported).")
@click.option("--json", "json_out", metavar="FILE|-", help="Write the figures as JSON.")
def main(trace: Path, requests: int, workers: int, passes: int, json_out: str | None) -> None:
    got = measure(trace, requests, workers, passes)
    click.echo(f"replay: events {got['event_blocks_per_cpu_s']:,.0f} blocks/CPU s, queries "
               f"{got['query_blocks_per_cpu_s']:,.0f} blocks/CPU s; final state: "
               f"{got['final_us_per_query']:.1f} us a query (best of {passes} passes of "
               f"{got['queries']:,})", err=json_out == "-")
    write_json({"trace": str(trace), "requests": requests, "workers": workers,
                "passes": passes, **got}, json_out)


if __name__ == "__main__":
    main()
