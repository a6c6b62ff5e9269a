"""Issue 13's fleet benchmark: N simulated engines replay a trace, and every index
under test keeps up with their KV events and answers the router's queries, in one run.

    python -m tools.bench.fleet                          # defaults: 1,000 requests
    python -m tools.bench.fleet --speedup 10,40,160 --json fleet.json
    python -m tools.bench.fleet --requests 0 --speedup 1,4,16   # the full trace, 59 min

The engines (tools/bench/fleet_model.py): the trace's sessions round-robin over
`--workers` engines, each with `--gpu-blocks` blocks of `--block-tokens` tokens and
vLLM's prefix cache (LRU eviction of free blocks); replaying them gives each engine's
BlockStored/BlockRemoved batches and, per request, a routing query made before it is
served, with the engines' true per-worker runs at that moment.

The indexes, each from empty, on the same timeline: `sarp` (one shared namespace,
protocol 2, a holder per worker), `sarp-ns-per-worker` (a namespace per worker, one
match per worker per query), `dynamo-radix` (the ai-dynamo-runtime wheel's RadixTree,
in-process; skipped, and said so, without the wheel) and `redis-llmd` (a real
redis-server, a key per block holding a hash of pods). Transport of sarp's events:
`--bridge` (the default: each engine's EventBatches published in vLLM's schema and
applied by a real bridge per engine, tools/bench/fleet_bridge.py), `--direct` (the
driver's requests on sarpd's socket) or `--in-process` (SarpIndex itself, no socket;
dynamo is in-process anyway and redis always a server). See fleet_sarp.py,
fleet_indexes.py and fleet_run.py (pacing, counts, agreement, the crash run).

Each `--speedup` compresses the trace's timeline (several: an offered-load sweep);
the replay is paced by it, so the achieved block-ops/s equal the offered ones until
the index cannot keep up. sarp is also run once with sarpd killed -9 mid-replay and
restarted on its data (sync=always, at the first speedup): `recovery_s` and
`agreement_after_recovery`. Output: a table on stdout (and the ratios of sarp to each
other index at each speedup); `--json FILE|-`: one JSON object, the config first.

The default is small (`--requests 1000`: the first 1,000 rows, 330 s of trace, 2.08 M
block-ops, 6.3 k/s offered at speedup 1). The full run is `--requests 0` (12,031
requests, 3,537 s of trace, 23.9 M block-ops at the default geometry: 9.0 M query,
7.5 M stored and 7.3 M removed hashes, 6.7 k/s at speedup 1): at speedup 1 it takes
an hour per index and speedup. With `--json -` the table goes to stderr.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from sarpd.ctl.common import write_json
from tools.bench.fleet_indexes import FleetConfig, Sync
from tools.bench.fleet_model import TPOT_MS, Timeline, build_timeline, load_requests
from tools.bench.fleet_run import (
    INDEXES,
    NotRun,
    ProgressFn,
    Result,
    RunResult,
    missing,
    run_crash,
    run_one,
)

DEFAULT_TRACE = Path("/work/shared/traces/mooncake_fast25_conversation_trace.jsonl")
SCHEMA = 1
ProgressFactory = Callable[[str, int], tuple[ProgressFn, Callable[[], None]]]


def parse_speedups(values: Sequence[str]) -> list[float]:
    """`--speedup` values, repeated and/or comma-separated; 0 = unpaced."""
    out: list[float] = []
    for v in values:
        for part in v.split(","):
            try:
                x = float(part)
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a number",
                                         param_hint="--speedup") from None
            if x < 0:
                raise click.BadParameter(f"{x} is negative", param_hint="--speedup")
            out.append(x)
    return out


def click_progress(label: str, total: int) -> tuple[ProgressFn, Callable[[], None]]:
    bar = click.progressbar(length=total, label=f"{label:>28}", file=sys.stderr)
    bar.__enter__()
    return bar.update, lambda: bar.__exit__(None, None, None)


def run_fleet(timeline: Timeline, names: Sequence[str], speedups: Sequence[float],
              cfg: FleetConfig, transport: str, root: Path, crash: bool = True,
              progress: ProgressFactory | None = None) -> dict[str, Any]:
    """Every index at every speedup (and sarp's crash run): the results and ratios."""
    results: list[Result] = []
    skip = {n: missing(n) for n in names}
    results += [NotRun(n, None, skipped=why) for n, why in skip.items() if why]
    n_entries = len(timeline.entries)
    for x in speedups:
        for name in (n for n in names if not skip[n]):
            bar, done = progress(f"{name} x{x:g}", n_entries) if progress else (None, None)
            try:
                results.append(run_one(name, timeline, x, cfg, transport, root / f"{name}-x{x:g}",
                                       bar))
            except Exception as exc:  # one index failing must not cost the others
                results.append(NotRun(name, x, error=f"{type(exc).__name__}: {exc}"))
            finally:
                if done is not None:
                    done()
    crash_doc: dict[str, Any] | None = None
    if crash and "sarp" in names and speedups:
        bar, done = progress("sarp kill -9 run", n_entries) if progress else (None, None)
        try:
            crash_doc = run_crash(timeline, speedups[0], cfg, transport, root / "sarp-crash", bar)
        except Exception as exc:
            crash_doc = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if done is not None:
                done()
        results = [_with_crash(r, crash_doc, speedups[0]) for r in results]
    return {"results": [r.public() for r in results], "crash_run": crash_doc,
            "ratios": ratios(results)}


def _with_crash(r: Result, doc: dict[str, Any], speedup: float) -> Result:
    if not isinstance(r, RunResult) or r.index != "sarp" or r.speedup != speedup or "error" in doc:
        return r
    return replace(r, recovery_s=doc["recovery_s"],
                   agreement_after_recovery=doc["agreement_after_recovery"], recovery=doc)


def ratios(results: Sequence[Result]) -> list[dict[str, Any]]:
    """sarp / each other index at each speedup: achieved block-ops/s and query p50."""
    ok = [r for r in results if isinstance(r, RunResult)]
    out = []
    for s in (r for r in ok if r.index == "sarp"):
        for o in (r for r in ok if r.speedup == s.speedup and r.index != "sarp"):
            out.append({"speedup": s.speedup, "vs": o.index,
                        "block_ops_per_s": s.block_ops_per_s / o.block_ops_per_s,
                        "query_us_p50": s.query_us_p50 / o.query_us_p50,
                        "query_call_blocks_per_s":
                            s.query_call_blocks_per_s / o.query_call_blocks_per_s,
                        "event_call_blocks_per_s":
                            s.event_call_blocks_per_s / o.event_call_blocks_per_s})
    return out


def _num(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def table(doc: dict[str, Any]) -> str:
    """The short table printed to stdout."""
    head = ("index", "speedup", "offered/s", "block-ops/s", "query-blk/s", "event-blk/s",
            "p50 us", "p99 us", "agree", "err", "recov s", "agree after")
    rows = [head]
    notes = []
    for r in doc["results"]:
        if "skipped" in r or "error" in r:
            notes.append(f"{r['index']}"
                         f"{'' if r['speedup'] is None else ' x' + format(r['speedup'], 'g')}: "
                         f"{r.get('skipped') or 'FAILED: ' + r.get('error', '')}")
            continue
        rows.append((r["index"], format(r["speedup"], "g"), _num(r["offered_block_ops_per_s"]),
                     _num(r["block_ops_per_s"]), _num(r["query_blocks_per_s"]),
                     _num(r["event_blocks_per_s"]), _num(r["query_us_p50"]),
                     _num(r["query_us_p99"]), format(r["agreement"], ".4f"),
                     f"{r['holder_blocks_error']:,}", _num(r["recovery_s"], ".3f"),
                     _num(r["agreement_after_recovery"], ".4f")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines += [f"sarp / {q['vs']} at x{q['speedup']:g}: block-ops/s {q['block_ops_per_s']:.2f}x, "
              f"query p50 {q['query_us_p50']:.2f}x; on each index's own calls: query blocks/s "
              f"{q['query_call_blocks_per_s']:.2f}x, event blocks/s "
              f"{q['event_call_blocks_per_s']:.2f}x" for q in doc["ratios"]]
    lines.append("own calls: time inside each index's apply/query only, inputs built before "
                 "the clock (dynamo-radix's event JSON and query lists: `prepare`)")
    return "\n".join(lines + notes)


def config_doc(trace: Path, timeline: Timeline, args: dict[str, Any]) -> dict[str, Any]:
    t = timeline.totals
    return {"schema": SCHEMA, "benchmark": "fleet", "trace": str(trace), **args,
            "requests": t.requests, "trace_span_s": timeline.span_ms / 1000.0,
            "block_ops": t.block_ops, "query_blocks": t.query_blocks,
            "stored_blocks": t.stored_blocks, "removed_blocks": t.removed_blocks,
            "batches": t.batches, "stored_events": t.stored_events,
            "removed_events": t.removed_events,
            "session_assignment": "round-robin: worker = session % workers"}


@click.command()
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=DEFAULT_TRACE, show_default=True,
              help="Mooncake-format JSON Lines trace (timestamp, input/output_length, "
                   "hash_ids).")
@click.option("--trace-block-tokens", default=512, show_default=True, type=click.IntRange(16),
              help="Tokens per hash id of the trace (Mooncake's: 512).")
@click.option("--block-tokens", default=16, show_default=True, type=click.IntRange(16),
              help="The engines' block size in tokens (vLLM's default 16; a multiple of 16 "
                   "dividing the trace's block size).")
@click.option("--workers", "-n", default=16, show_default=True, type=click.IntRange(1, 65535),
              help="Simulated engines (sessions round-robin over them).")
@click.option("--gpu-blocks", "-g", default=16_384, show_default=True, type=click.IntRange(1),
              help="GPU KV blocks per engine.")
@click.option("--holders", "-k", default=None, type=click.IntRange(1, 1024),
              help="Holders (K) answered per query [default: --workers, at most 1024].")
@click.option("--speedup", "speedups", multiple=True, default=("16",), show_default=True,
              help="Timeline compression; repeat or comma-separate for an offered-load "
                   "sweep (10,40,160); 0 = unpaced.")
@click.option("--requests", default=1000, show_default=True, type=click.IntRange(0),
              help="Replay the trace's first N rows (0: all of it, the full run).")
@click.option("--tpot-ms", default=TPOT_MS, show_default=True, type=click.FloatRange(0),
              help="Decode time per output token: how long a request holds its blocks.")
@click.option("--index", "indexes", default=",".join(INDEXES), show_default=True,
              help="Comma-separated indexes to compare.")
@click.option("--direct", "transport", flag_value="direct",
              help="sarp's events go straight to sarpd over its socket, no bridge.")
@click.option("--in-process", "transport", flag_value="in-process",
              help="Drive sarp as SarpIndex in this process (no socket, no bridge).")
@click.option("--bridge", "transport", flag_value="bridge", default=True,
              help="(the default) sarp's events through the real vLLM bridge: a publisher "
                   "of vLLM's current schema and a bridge per engine "
                   "(tools/bench/fleet_bridge.py).")
@click.option("--sync", type=click.Choice(["none", "always"]), default="none", show_default=True,
              help="sarpd's --sync (redis: appendfsync always/everysec) of the sweep; the "
                   "kill -9 run is always sync=always.")
@click.option("--no-crash", is_flag=True, help="Skip sarp's kill -9 run.")
@click.option("--seed", default=0, show_default=True, help="Salts the block ids.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the indexes keep their data (default: a temporary directory).")
@click.option("--json", "json_out", default=None, metavar="FILE|-",
              help="Write the config and results as one JSON object to FILE ('-': stdout).")
def main(trace: Path, trace_block_tokens: int, block_tokens: int, workers: int, gpu_blocks: int,
         holders: int | None, speedups: tuple[str, ...], requests: int, tpot_ms: float,
         indexes: str, transport: str, sync: Sync, no_crash: bool, seed: int,
         data_dir: Path | None, json_out: str | None) -> None:
    """Fleet benchmark: N engines' KV events and routing queries into sarp, sarp with a
    namespace per worker, Dynamo's radix tree and an llm-d-style Redis index."""
    names = [n.strip() for n in indexes.split(",") if n.strip()]
    if unknown := [n for n in names if n not in INDEXES]:
        raise click.BadParameter(f"unknown {', '.join(unknown)} (known: {', '.join(INDEXES)})",
                                 param_hint="--index")
    xs = parse_speedups(speedups)
    k = holders or min(workers, 1024)
    t0 = time.perf_counter()
    try:
        reqs = load_requests(trace, workers=workers, trace_block_tokens=trace_block_tokens,
                             block_tokens=block_tokens, limit=requests, seed=seed)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    timeline = build_timeline(reqs, workers, gpu_blocks, tpot_ms)
    click.echo(f"model: {timeline.totals.requests:,} requests, {len(timeline.entries):,} "
               f"entries, {timeline.totals.block_ops:,} block-ops over "
               f"{timeline.span_ms / 1000:,.1f} s of trace ({time.perf_counter() - t0:.1f} s)",
               err=True)
    args = {"workers": workers, "gpu_blocks": gpu_blocks, "block_tokens": block_tokens,
            "trace_block_tokens": trace_block_tokens, "holders": k, "speedups": xs,
            "tpot_ms": tpot_ms, "transport": transport, "sync": sync, "seed": seed,
            "indexes": names, "requests_limit": requests}
    cfg = FleetConfig(workers, k, sync)
    with tempfile.TemporaryDirectory(prefix="sarp-fleet-", dir=data_dir) as tmp:
        out = run_fleet(timeline, names, xs, cfg, transport, Path(tmp), not no_crash,
                        click_progress)
    doc = {**config_doc(trace, timeline, args), **out}
    click.echo(table(doc), err=json_out == "-")
    write_json(doc, json_out)


if __name__ == "__main__":
    main()
