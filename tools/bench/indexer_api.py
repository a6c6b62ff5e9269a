"""sarpd's indexer API against Dynamo's own standalone KV indexer, fed by the same
engines in one run: query throughput and latency, event lag, memory, and what each
answers after a kill -9.

    python -m tools.bench.indexer_api --json -
    python -m tools.bench.indexer_api --engines 8 --clients 32 --seconds 20 --index sarp

Both indexers run as real processes on this machine: sarpd with `--http-port` (a temp
data directory, the rocksdb backend, `--sync always`; tools.bench.spawn) and `python -m
dynamo.indexer --threads 4` (the ai-dynamo-runtime wheel, from an empty working
directory and without this checkout on its path). `--engines` publishers of vLLM's KV
events (tools.bench.vllm_publisher: an XPUB and a replay ROUTER each) are registered
on both, with their replay endpoints, before anything is published.

The workload (`Workload`, seeded): 4 system prompts of 8-32 blocks of 16 tokens, and
conversations on them, each on one engine: a first turn of 4-16 blocks stored under
its prompt; then, per engine batch, a new conversation, a next turn (2-8 new blocks,
after the blocks of the conversation the engine had evicted, stored again) or an
eviction of 1-8 blocks from a conversation's tail. Block hashes chain over the tokens
(the same tokens give the same hashes on every engine, as vLLM's) and evictions take
tails only, so Dynamo's and sarp's removal rules (docs/HTTP.md) agree; the run checks
both indexers' answers against the engines' own state (`answers_equal_engines_*`).

Phases, each index measured alike:

1. fill: `--sequences` conversations' first turns, published at once; `fill_s` is the
   time until the index answers each engine's last batch (its marker, below);
2. queries: `--clients` keep-alive HTTP/1.1 connections POST /query for `--seconds`,
   each a conversation so far plus a new turn's tokens (a partial match on several
   engines: never empty): `queries_per_s`, `query_us_p50` / `_p99` (per request, as
   the client sees it); then one connection, one request at a time, for half as
   long: `query_us_p50_one_client` (the same client and run for both indexes). The
   indexes take turns in slices of a second, so that both see the machine alike (on
   this VM a one-client p50 moves up to 3x between runs), and get the same draws of
   queries. The client writes pre-encoded requests and reads Content-Length answers
   (a raw asyncio protocol, `HttpConn`): it takes little CPU from the servers;
3. event lag: every engine publishes `--rate` batches a second for `--seconds`, each
   5th batch ending with a store of a marker block (tokens of its own); per index and
   engine a prober (its own connection; `--watch serial`: one connection asking every
   engine's in turn) asks /query every 2 ms for the engine's oldest marker not seen
   yet (then its next ones while they show: an engine's batches apply in order, so
   the probing does not grow with the lag) until its engine shows:
   `event_lag_ms_p99` from publish() to that answer. `event_lag_ms_start` / `_end`
   (medians of the first and last quarter of the markers) tell a growing backlog
   (`backlog_grows`), `event_lag_ms_tenths` the median of each tenth of the phase
   (by publish time); `markers_unseen`: not answered 30 s after the last publish;
4. `rss_bytes`: the indexer process's VmRSS after phases 1-3;
4b. fleet lag (`--fleet-speedup`, 0 skips it; tools/bench/indexer_fleet.py): the
   fleet bench's engines (the Mooncake trace, vLLM's prefix cache, 16 engines) publish
   their batches at the trace's pace divided by the speedup, markers as in 3:
   `fleet_event_lag_ms_*`, `fleet_backlog_grows`, and the load each tenth of it
   carried (`fleet_stored_blocks_tenths`, `fleet_removed_blocks_tenths`: removals
   begin once the engines' caches are full, so the last tenths carry about twice
   the first's); then they are unregistered;
5. restart, the publishers paused: each index answers a fixed probe set (32 queries,
   half of them the conversations the engines changed last: the "before" answers),
   is killed (SIGKILL; at once, or after `--idle-before-kill` seconds) and spawned
   again with the same arguments (sarp: its data directory, nothing registered again;
   Dynamo: no peers: it comes back empty). `restart_s`: from the spawn to the first
   round of probes answered all as before (null: not within `--restart-timeout`);
   `answers_right_after_restart`: the share answered as before in the first round the
   server answered (refused connections and 503, sarpd's "recovering, retry", are not
   answers; `first_http_s` is the first HTTP status of any kind); `wrong_rounds`:
   rounds answered otherwise before that, `first_round_wrong` the first one's
   differences;
6. resume: the engines publish for one more second, and every conversation's answer
   is compared with the engines' state (`converged_after_resume`, for sarp once it
   answers the engines' last markers).

Ratios are sarp / dynamo: below 1, sarp's latency, lag or memory is the smaller; above
1, its queries per second are the more. Every process shares this machine's cores
(`cores`, and `loadavg` before the run: other load moves every figure); compare the
figures of one run.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click

from sarpd.ctl.common import write_json
from tools.bench import vllm_schema as vs
from tools.bench.indexer_fleet import FleetOptions, describe, fleet_lag
from tools.bench.indexer_parts import (
    WATCHES,
    Answer,
    Conversation,
    Http,
    Indexer,
    Load,
    Marker,
    Watch,
    Workload,
    connect,
    drive,
    dynamo_indexer,
    pct,
    query_doc,
    register,
    request_bytes,
    sarp_indexer,
)
from tools.bench.vllm_publisher import Publisher

MARKER_EVERY = 5
PROBES = 32
CHECKS = 512  # conversations whose answers are checked against the engines' state
RESUME_S = 1.0
SLICE_S = 1.0  # the query loads take turns, index by index, in slices this long
INDEXES = ("sarp", "dynamo")

@dataclass
class Steady:
    """Publishing `rate` batches/s per engine (the engines' ticks staggered)."""

    rate: float
    seconds: float
    behind_s: float = 0.0  # how late the publishing loop was at worst
    batches: int = 0


class Bench:
    """The engines, the indexers and the workload of one run."""

    def __init__(self, ixs: list[Indexer], pubs: list[Publisher], wl: Workload,
                 watch: Watch = WATCHES["per-engine"]) -> None:
        self.ixs, self.pubs, self.wl, self.watch = ixs, pubs, wl, watch
        self.sent = [0] * len(pubs)  # batches published per engine

    def publish(self, engine: int, events: list[vs.KVCacheEvent], markers: list[Marker],
                marked: bool) -> None:
        tokens = None
        if marked:
            event, tokens = self.wl.marker()
            events = [*events, event]
        self.pubs[engine].publish(vs.encode_events(events))
        self.sent[engine] += 1
        if tokens is not None:
            markers.append(Marker(engine, tokens, time.perf_counter()))

    async def observed(self, feed: Callable[[list[Marker]], Awaitable[None]],
                       ixs: Sequence[Indexer]) -> list[Marker]:
        """Run `feed` (it publishes, markers included) with a watcher per index of
        `ixs`, until the watchers are done: the markers."""
        markers: list[Marker] = []
        done = asyncio.Event()
        watchers = [asyncio.ensure_future(self.watch(ix, markers, done)) for ix in ixs]
        try:
            await feed(markers)
        finally:
            done.set()
            await asyncio.gather(*watchers)
        return markers

    async def fill(self, sequences: int, markers: list[Marker]) -> None:
        for e, batches in enumerate(self.wl.fill(sequences)):
            for events in batches:
                self.publish(e, events, markers, False)
        for e in range(len(self.pubs)):
            self.publish(e, [], markers, True)

    async def steady(self, plan: Steady, markers: list[Marker]) -> None:
        engines = len(self.pubs)
        t0 = time.perf_counter()
        for k in range(max(1, round(plan.rate * plan.seconds))):
            for e in range(engines):
                due = t0 + (k + e / engines) / plan.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                plan.behind_s = max(plan.behind_s, -delay)
                self.publish(e, self.wl.step(e), markers, (k + 1) % MARKER_EVERY == 0)
                plan.batches += 1
        for e in range(engines):  # every engine's last batch is a marker
            self.publish(e, [], markers, True)


async def query_loads(ixs: Sequence[Indexer], requests: dict[str, list[bytes]], clients: int,
                      seconds: float, seed: int) -> dict[str, tuple[Load, Load]]:
    """Per index, `clients` connections for `seconds`, then one for half as long, in
    slices of about SLICE_S taken in turn by the indexes (the same machine for both;
    the same draws of `requests` for each): its (many, one) loads."""
    conns = {ix.name: [await connect(ix.port) for _ in range(clients)] for ix in ixs}
    out = {ix.name: (Load(), Load()) for ix in ixs}
    slices = max(1, round(seconds / SLICE_S))
    try:
        for ix in ixs:  # connections and caches warm, not counted
            for raw in requests[ix.name][:200]:
                await conns[ix.name][0].send(raw)
        for many, share in ((True, 1.0), (False, 0.5)):
            for s in range(slices):
                for ix in ixs:
                    mine = conns[ix.name] if many else conns[ix.name][:1]
                    await drive(mine, requests[ix.name], seconds * share / slices,
                                out[ix.name][0 if many else 1], seed * 100 + s)
    finally:
        for cs in conns.values():
            for c in cs:
                c.close()
    return out


def _tenths(markers: Sequence[Marker], lags: Sequence[float]) -> list[list[float]]:
    """The lags split in ten by publish time (equal spans of the phase's clock)."""
    if not markers:
        return []
    t0, t1 = markers[0].published, markers[-1].published
    width = (t1 - t0) / 10 or 1.0
    parts: list[list[float]] = [[] for _ in range(10)]
    for m, lag in zip(markers, lags, strict=True):
        parts[min(9, int((m.published - t0) / width))].append(lag)
    return parts


def lag_figures(name: str, markers: Sequence[Marker], end: float) -> dict[str, Any]:
    """Per-marker lag of index `name` (an unseen marker counts until `end`)."""
    lags = [(m.seen.get(name, end) - m.published) * 1e3 for m in markers]
    q = max(1, len(lags) // 4)
    start, last = pct(lags[:q], 50), pct(lags[-q:], 50)
    grows = None
    if start is not None and last is not None:
        grows = bool(last > 2 * start and last - start > 50)
    tenths = [pct(part, 50) for part in _tenths(markers, lags)]
    return {"event_lag_ms_p50": pct(lags, 50), "event_lag_ms_p99": pct(lags, 99),
            "event_lag_ms_tenths": tenths,
            "event_lag_ms_max": max(lags) if lags else None, "event_lag_ms_start": start,
            "event_lag_ms_end": last, "backlog_grows": grows, "markers": len(lags),
            "markers_unseen": sum(name not in m.seen for m in markers)}


def probe_round(http_: Http, probes: Sequence[dict[str, Any]]) -> tuple[bool, list[Answer] | None]:
    """(whether the server said anything over HTTP, its answers to `probes`: None while
    it refuses connections or answers 503)."""
    answers: list[Answer] = []
    for doc in probes:
        try:
            got = http_.request("POST", "/query", doc)
        except ConnectionError:
            return bool(answers), None
        if got[0] == 503:
            return True, None
        answers.append(got)
    return True, answers


def restart(ix: Indexer, probes: Sequence[dict[str, Any]], timeout: float,
            idle: float = 0.0) -> dict[str, Any]:
    """After `idle` seconds, kill -9 `ix`, spawn it again the same way, and time its
    answers to `probes` against those it gave just before the kill
    (`first_round_wrong`: the first answered round's differences, at most 4, as
    {instance: longest_matched} or the status)."""
    time.sleep(idle)
    http_ = Http(ix.port, timeout=5)
    before = [http_.request("POST", "/query", doc) for doc in probes]
    ix.kill9()
    http_.close()
    t0 = ix.spawn()
    out: dict[str, Any] = {"restart_s": None, "answers_right_after_restart": None,
                           "first_http_s": None, "first_answer_s": None,
                           "unavailable_rounds": 0, "wrong_rounds": 0}
    while True:
        up, answers = probe_round(http_, probes)
        now = time.perf_counter() - t0
        if up and out["first_http_s"] is None:
            out["first_http_s"] = now
        if answers is None:
            out["unavailable_rounds"] += int(up)
        else:
            wrong = [i for i, (a, b) in enumerate(zip(answers, before, strict=True)) if a != b]
            if out["first_answer_s"] is None:
                out["first_answer_s"] = now
                out["answers_right_after_restart"] = 1 - len(wrong) / len(probes)
                out["first_round_wrong"] = [{"probe": i, "before": _brief(before[i]),
                                             "after": _brief(answers[i])} for i in wrong[:4]]
            if not wrong:
                out["restart_s"] = now
                break
            out["wrong_rounds"] += 1
        if now > timeout:
            break
        time.sleep(0.005 if answers is None else 0.02)
    http_.close()
    out["probe_answers_before_nonempty"] = sum(b[0] == 200 and bool(b[1]["instances"])
                                               for b in before)
    return out


def _brief(answer: Answer) -> Any:
    status, body = answer
    if status != 200:
        return status
    return {i: r["longest_matched"] for i, r in sorted(body["instances"].items())}


def agreement(ix: Indexer, wl: Workload, convs: Sequence[Conversation]) -> float:
    """The share of `convs` whose answer from `ix` is what the engines' state calls
    for."""
    http_ = Http(ix.port)
    try:
        right = sum(http_.request("POST", "/query", query_doc(wl.query_tokens(c)))
                    == (200, wl.expected(c)) for c in convs)
    finally:
        http_.close()
    return right / len(convs) if convs else 1.0


# ---------------------------------------------------------------------- the run

@dataclass(frozen=True)
class Options:
    engines: int = 4
    clients: int = 16
    seconds: float = 10.0
    rate: float = 20.0
    sequences: int = 4000
    seed: int = 0
    indexes: tuple[str, ...] = INDEXES
    restart_timeout: float = 30.0
    idle_before_kill: float = 0.0
    dynamo_threads: int = 4
    fleet: FleetOptions | None = None  # None: no fleet phase
    watch: str = "per-engine"  # how markers are asked for (indexer_parts.WATCHES)


def say(msg: str) -> None:
    click.echo(f"indexer_api: {msg}", err=True)


def sample(convs: Sequence[Conversation], n: int, seed: int) -> list[Conversation]:
    """Up to `n` of `convs`, drawn with `seed` (the same run, the same draw)."""
    return random.Random(seed).sample(list(convs), min(n, len(convs)))


def phase_fill(bench: Bench, sequences: int) -> dict[str, dict[str, Any]]:
    t0 = time.perf_counter()

    async def feed(markers: list[Marker]) -> None:
        await bench.fill(sequences, markers)

    markers = asyncio.run(bench.observed(feed, bench.ixs))
    out = {}
    for ix in bench.ixs:
        seen = [m.seen.get(ix.name) for m in markers]
        fill_s = None if None in seen else max(s for s in seen if s is not None) - t0
        out[ix.name] = {"fill_s": fill_s}
        say(f"{ix.name}: fill of {sequences} conversations answered after "
            + ("never" if fill_s is None else f"{fill_s:.2f} s"))
    return out


def phase_queries(bench: Bench, opts: Options) -> dict[str, dict[str, Any]]:
    wl = bench.wl
    convs = sample(wl.convs, 1024, opts.seed)
    reqs = {ix.name: [request_bytes(ix.port, "/query", query_doc(wl.query_tokens(c)))
                      for c in convs] for ix in bench.ixs}
    loads = asyncio.run(query_loads(bench.ixs, reqs, opts.clients, opts.seconds, opts.seed))
    out = {}
    for name, (many, one) in loads.items():
        out[name] = r = {
            "queries_per_s": len(many.lat_us) / many.seconds,
            "query_us_p50": pct(many.lat_us, 50), "query_us_p99": pct(many.lat_us, 99),
            "query_us_p50_one_client": pct(one.lat_us, 50),
            "query_us_p99_one_client": pct(one.lat_us, 99),
            "queries": len(many.lat_us) + len(one.lat_us),
            "query_errors": many.errors + one.errors, "empty_answers": many.empty + one.empty}
        say(f"{name}: {r['queries_per_s']:,.0f} queries/s, p50 {r['query_us_p50']:,.0f} us "
            f"({opts.clients} clients), {r['query_us_p50_one_client']:,.0f} us (one)")
    return out


def phase_lag(bench: Bench, opts: Options) -> tuple[dict[str, dict[str, Any]], Steady]:
    plan = Steady(opts.rate, opts.seconds)

    async def feed(markers: list[Marker]) -> None:
        await bench.steady(plan, markers)

    markers = asyncio.run(bench.observed(feed, bench.ixs))
    end = time.perf_counter()
    out = {}
    for ix in bench.ixs:
        out[ix.name] = lag_figures(ix.name, markers, end)
        rss, hwm = ix.rss()
        out[ix.name].update(rss_bytes=rss, rss_peak_bytes=hwm)
        say(f"{ix.name}: event lag p99 {out[ix.name]['event_lag_ms_p99']:.1f} ms over "
            f"{len(markers)} markers ({plan.batches} batches); RSS {rss / 2**20:.0f} MiB")
    return out, plan


def phase_fleet(bench: Bench, fleet: FleetOptions) -> tuple[dict[str, dict[str, Any]],
                                                         dict[str, Any]]:
    """The fleet bench's engines at its pace (tools/bench/indexer_fleet.py): each
    index's lag, as `fleet_event_lag_*`."""
    markers, run, end = fleet_lag(bench.ixs, bench.wl, len(bench.pubs), fleet, bench.watch)
    out = {}
    for ix in bench.ixs:
        lag = lag_figures(ix.name, markers, end)
        out[ix.name] = {f"fleet_{k}": v for k, v in lag.items()}
        say(f"{ix.name}: fleet x{fleet.speedup:g} ({run.blocks / max(run.span_s, 1e-9):,.0f} "
            f"event blocks/s): lag p99 {lag['event_lag_ms_p99']:.1f} ms, first quarter "
            f"{lag['event_lag_ms_start']:.1f} ms, last {lag['event_lag_ms_end']:.1f} ms")
    return out, describe(run, fleet)


def phase_restart(bench: Bench, opts: Options) -> dict[str, dict[str, Any]]:
    checks = sample(bench.wl.convs, CHECKS, opts.seed + 1)
    recent = bench.wl.recent(PROBES // 2)  # what a restart may have missed, if anything
    chosen = recent + [c for c in checks if c not in recent][:PROBES - len(recent)]
    probes = [query_doc(bench.wl.query_tokens(c)) for c in chosen]
    out = {}
    for ix in bench.ixs:  # the publishers are paused: both hold the engines' state
        out[ix.name] = {"answers_equal_engines_before": agreement(ix, bench.wl, checks)}
    for ix in bench.ixs:
        out[ix.name].update(restart(ix, probes, opts.restart_timeout, opts.idle_before_kill))
        r = out[ix.name]
        share = r["answers_right_after_restart"]
        say(f"{ix.name}: restarted: first answer after {_s(r['first_answer_s'])}, "
            + ("none" if share is None else f"{share:.0%}") + " of the probes as before; "
            f"all as before after {_s(r['restart_s'])}")
    return out


def phase_resume(bench: Bench, opts: Options) -> dict[str, dict[str, Any]]:
    """The engines publish again for RESUME_S; sarp (it resubscribed by itself) is
    awaited to its last markers; every index's answers against the engines' state."""
    plan = Steady(opts.rate, RESUME_S)

    async def feed(markers: list[Marker]) -> None:
        await bench.steady(plan, markers)

    sarps = [ix for ix in bench.ixs if ix.name == "sarp"]
    markers = asyncio.run(bench.observed(feed, sarps))
    checks = sample(bench.wl.convs, CHECKS, opts.seed + 2)
    out = {}
    for ix in bench.ixs:
        share = agreement(ix, bench.wl, checks)
        seen = all(ix.name in m.seen for m in markers)
        out[ix.name] = {"answers_equal_engines_after_resume": share,
                        "converged_after_resume": seen and share == 1.0}
        say(f"{ix.name}: after resuming, {share:.0%} of {len(checks)} answers are the "
            "engines' state")
    return out


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.3f} s"


def measure(bench: Bench, opts: Options) -> dict[str, Any]:
    loadavg = os.getloadavg()
    res = {ix.name: {"index": ix.name} for ix in bench.ixs}
    for name, got in phase_fill(bench, opts.sequences).items():
        res[name].update(got)
    blocks_filled = bench.wl.blocks_held()
    queries = phase_queries(bench, opts)
    lag, plan = phase_lag(bench, opts)
    blocks = bench.wl.blocks_held()
    fleet, fleet_run = phase_fleet(bench, opts.fleet) if opts.fleet else ({}, {})
    for phase in (queries, lag, fleet, phase_restart(bench, opts), phase_resume(bench, opts)):
        for name, got in phase.items():
            res[name].update(got)
    doc: dict[str, Any] = {
        "benchmark": "indexer_api", "indexes": [res[ix.name] for ix in bench.ixs],
        "engines": opts.engines, "clients": opts.clients, "seconds": opts.seconds,
        "rate": opts.rate, "sequences": opts.sequences, "seed": opts.seed,
        "cores": os.cpu_count(), "loadavg": list(loadavg),
        "blocks_indexed_after_fill": blocks_filled, "blocks_indexed": blocks,
        "conversations": len(bench.wl.convs), "batches": sum(bench.sent),
        "publish_behind_s": plan.behind_s, "idle_before_kill_s": opts.idle_before_kill,
        "watch": opts.watch,
        "sarp": {"backend": "rocksdb", "sync": "always"},
        "dynamo": {"threads": opts.dynamo_threads, "version": _dynamo_version()},
        **fleet_run}
    doc.update(ratios(res))
    return doc


RATIOS = {"qps_ratio": "queries_per_s", "p50_ratio": "query_us_p50",
          "p99_ratio": "query_us_p99", "p50_one_client_ratio": "query_us_p50_one_client",
          "lag_p99_ratio": "event_lag_ms_p99", "fleet_lag_p99_ratio": "fleet_event_lag_ms_p99",
          "rss_ratio": "rss_bytes"}


def ratios(res: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """sarp / dynamo of the headline figures (None without both, or a zero)."""
    out: dict[str, float | None] = {}
    for name, key in RATIOS.items():
        a, b = res.get("sarp", {}).get(key), res.get("dynamo", {}).get(key)
        out[name] = a / b if a is not None and b else None
    return out


def _dynamo_version() -> str | None:
    try:
        return importlib.metadata.version("ai-dynamo-runtime")
    except importlib.metadata.PackageNotFoundError:
        return None


def run(opts: Options) -> dict[str, Any]:
    """Start the indexers and the engines, measure, and stop every process (also on
    an exception or Ctrl-C)."""
    base = Path(tempfile.mkdtemp(prefix="sarp-ixapi-", dir="/tmp"))
    ixs: list[Indexer] = []
    pubs: list[Publisher] = []
    try:
        for name in opts.indexes:
            ixs.append(sarp_indexer(base) if name == "sarp"
                       else dynamo_indexer(base, opts.dynamo_threads))
            ixs[-1].spawn()
        for ix in ixs:
            ix.wait_up()
        pubs = [Publisher() for _ in range(opts.engines)]
        register(ixs, pubs)
        return measure(Bench(ixs, pubs, Workload(opts.engines, opts.seed),
                             WATCHES[opts.watch]), opts)
    finally:
        for ix in ixs:
            ix.kill9()
        for pub in pubs:
            pub.close()
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- the CLI

TABLE = (("queries_per_s", "{:,.0f}"), ("query_us_p50", "{:,.0f}"), ("query_us_p99", "{:,.0f}"),
         ("query_us_p50_one_client", "{:,.0f}"), ("event_lag_ms_p99", "{:,.1f}"),
         ("event_lag_ms_start", "{:,.1f}"), ("event_lag_ms_end", "{:,.1f}"),
         ("markers_unseen", "{}"), ("fleet_event_lag_ms_p99", "{:,.1f}"),
         ("fleet_event_lag_ms_start", "{:,.1f}"), ("fleet_event_lag_ms_end", "{:,.1f}"),
         ("fleet_backlog_grows", "{}"), ("fleet_markers_unseen", "{}"),
         ("rss_bytes", "{:,}"), ("fill_s", "{:.2f}"),
         ("restart_s", "{:.3f}"), ("first_answer_s", "{:.3f}"),
         ("answers_right_after_restart", "{:.2f}"), ("wrong_rounds", "{}"),
         ("answers_equal_engines_before", "{:.2f}"),
         ("converged_after_resume", "{}"))


def table(doc: dict[str, Any]) -> str:
    rows = doc["indexes"]
    lines = [f"{'':30}" + "".join(f"{r['index']:>16}" for r in rows)]
    for key, fmt in TABLE:
        cells = ["-" if r.get(key) is None else fmt.format(r[key]) for r in rows]
        lines.append(f"{key:30}" + "".join(f"{c:>16}" for c in cells))
    lines.append(f"{doc['engines']} engines, {doc['clients']} clients, {doc['seconds']:g} s, "
                 f"{doc['rate']:g} batches/s per engine, {doc['blocks_indexed']:,} blocks "
                 f"indexed, {doc['cores']} cores (load {doc['loadavg'][0]:.2f} before)")
    return "\n".join(lines)


def _indexes(_ctx: click.Context, _p: click.Parameter, value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in INDEXES]
    if bad or not names:
        raise click.BadParameter(f"{value!r}: a comma-separated list of {', '.join(INDEXES)}")
    if "dynamo" in names and importlib.util.find_spec("dynamo") is None:
        raise click.BadParameter("dynamo: Dynamo's indexer is not installed (pip install "
                                 "ai-dynamo-runtime==1.6.1, the dev extra's pin)")
    return names


def _terminate(_sig: int, _frame: FrameType | None) -> None:
    raise SystemExit(143)  # unwinds through run(): every process is stopped


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engines", type=click.IntRange(1), default=4, show_default=True,
              help="Engines (publishers of vLLM's KV events), each registered on every "
              "index with its replay endpoint.")
@click.option("--clients", type=click.IntRange(1), default=16, show_default=True,
              help="Concurrent keep-alive HTTP connections of the query load.")
@click.option("--seconds", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="Length of the query load (per index; the one-client run lasts half "
              "as long) and of the steady publishing of the event-lag phase.")
@click.option("--rate", type=click.FloatRange(0.1), default=20.0, show_default=True,
              help="Batches a second each engine publishes in the event-lag phase (every "
              f"{MARKER_EVERY}th ends with a marker).")
@click.option("--sequences", type=click.IntRange(1), default=4000, show_default=True,
              help="Conversations of the fill (their first turns), dealt over the engines.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the workload (the same seed, the same events) and of the "
              "queries' draw.")
@click.option("--index", "indexes", default=",".join(INDEXES), show_default=True,
              callback=_indexes, help="Which indexers to run: sarp, dynamo, or both.")
@click.option("--restart-timeout", type=click.FloatRange(0.1), default=30.0,
              show_default=True, help="Seconds after a restart's spawn to wait for the "
              "probes' answers to be as before (restart_s is null past it).")
@click.option("--idle-before-kill", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds the engines stay paused before each kill -9 (0: at once, "
              "as a crash comes). sarpd saves its listeners' watermarks about once a "
              "second: killed sooner, it replays the batches since the last save when "
              "it comes back (docs/HTTP.md, \"Restarts\").")
@click.option("--dynamo-threads", type=click.IntRange(1), default=4, show_default=True,
              help="Dynamo's --threads (its default: 4).")
@click.option("--fleet-speedup", type=click.FloatRange(0), default=16.0, show_default=True,
              help="The fleet phase: the fleet bench's engines (the Mooncake trace, "
              "vLLM's prefix cache) publish at its pace divided by this (its default, "
              "16); the lag of their events per index. 0: no fleet phase.")
@click.option("--fleet-requests", type=click.IntRange(1), default=1000, show_default=True,
              help="The trace's first N requests in the fleet phase (the fleet bench's "
              "default).")
@click.option("--fleet-engines", type=click.IntRange(1), default=16, show_default=True,
              help="The fleet phase's engines (the fleet bench's default).")
@click.option("--watch", "watch_method", type=click.Choice(sorted(WATCHES)),
              default="per-engine", show_default=True,
              help="How the lag phases ask for their markers: a prober per engine (its "
              "own connection), or one connection asking every engine's in turn (the "
              "second session's method: markers pending at once wait for each other's "
              "answers too).")
@click.option("--json", "json_out", metavar="FILE|-", default=None,
              help="Write the results as one JSON object to FILE, or stdout with '-' (the "
              "table then goes to stderr).")
def main(engines: int, clients: int, seconds: float, rate: float, sequences: int, seed: int,
         indexes: tuple[str, ...], restart_timeout: float, idle_before_kill: float,
         dynamo_threads: int, fleet_speedup: float, fleet_requests: int, fleet_engines: int,
         watch_method: str, json_out: str | None) -> None:
    """sarpd's indexer API (--http-port) against Dynamo's standalone KV indexer
    (python -m dynamo.indexer), on the same engines' events in one run.

    Per index: queries per second and the p50/p99 latency of /query under --clients
    connections, and the p50 of one connection alone; the lag from an engine's
    publish to a query that sees it, at --rate batches/s per engine; the process's
    RSS; and after a kill -9 and a spawn with the same arguments (no registration
    again), the time until its answers are those of before the kill and the share
    right at its first answer. The module docstring says how each is measured.
    """
    opts = Options(engines, clients, seconds, rate, sequences, seed, indexes,
                   restart_timeout, idle_before_kill, dynamo_threads,
                   FleetOptions(fleet_speedup, fleet_requests, fleet_engines)
                   if fleet_speedup else None, watch_method)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        doc = run(opts)
    except (RuntimeError, ConnectionError) as exc:  # an indexer failed: its log says why
        raise click.ClickException(str(exc)) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(table(doc), err=json_out == "-")
    write_json(doc, json_out)


if __name__ == "__main__":
    main()
