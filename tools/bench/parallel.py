"""Matches on every core (issue 25): the same read-only match batches on 1, 2, ... threads.

    python -m tools.bench.parallel --threads 1,2 --json -
    python -m tools.bench.parallel --threads 1,2 --runs 9 --batch 16 --batches 1024

One `SarpIndex` in this process (rocksdb on a temp dir, the daemon's default engine
budget and index settings, no fsync) is preloaded with the turns of a workload from
the benchmark's generators (tools/bench/workloads.py; several comma-separated share
the index, each in its own namespace): every turn's sequence is inserted
(`write_many`, batches of one turn per session as the replays insert), until the index
holds `--blocks` blocks; more segments than the decoded-segment cache keeps (4,096),
so that matches read from the backend; then every segment is folded (written whole:
read from the backend, not merged in memory). The prompts of those turns, shuffled
(seeded), make `--batches` request batches of `--batch` queries (`Match` objects built
before any clock), cycling through the prompts when there are fewer. Threads pay off
only when the daemon is loaded, when its batches are large: 64 by default (loadgen's
16 clients x 4 in flight); a batch of 16 shows what small batches get.

Each thread count runs ALL those batches (the same ones, each once): its threads take
the next batch from a shared counter and call `index.match_many(batch)`, from a
barrier to the last thread's end; no write runs meanwhile. `--seconds S` instead runs
the batches (cycling) for S seconds per measurement. `match_blocks_per_s`: blocks
matched (the answers' `blocks`) per wall second. The thread counts are measured in
one process, interleaved over `--runs` (run r goes through them in order, the next
run in reverse order), after one untimed single-threaded pass that warms the caches
and gives the reference answers: every measured batch's answers must equal them
(`exact`: blocks, and metas by a 128-bit digest of their bytes taken in the
matching thread: `answers`), else the bench fails. Reported per thread
count: the best and the median of the runs, every run's figures (rate, seconds, CPU
seconds of the process: above the wall time when threads run at once), and the
conditions: backend, page cache or direct I/O (`--direct-io`), engine budget, the
native paths that ran, segment reads per pass (cache misses that went to the
backend), the interpreter's switch interval (`--switch-interval`), and per run the CPU
other processes took meanwhile (`others_cpu_s`: on a shared machine a run beside a busy
neighbour is no measure of threads). Before the runs the garbage collector freezes what
the preload and the batches made (`gc.freeze`: no collection walks them).
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
import xxhash

from sarpd.config import IndexConfig, ServerConfig
from sarpd.core import SarpIndex, open_backend
from sarpd.ctl.common import write_json
from sarpd.errors import SarpError
from sarpd.model import IdArray, Insert, Match, MatchResult, SeqSpec
from tools.bench.api import Ids, Turn
from tools.bench.runner import batches as turn_batches
from tools.bench.workloads import get_workload

PRELOAD_BATCH = 64  # turns per write_many while preloading (one per session)
SCALE = 1_000  # the workloads' scale: sessions are built lazily, turns taken as needed

Answer = tuple[int, bytes]  # blocks matched, the digest of their metas' bytes


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every process, /proc/stat; 0.0
    where there is none): minus this process's own, what others took meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return 0.0
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _ids(ids: Ids) -> IdArray:
    out = np.zeros((len(ids), 2), dtype=np.uint64)
    out[:, 0] = ids
    return out


def interleaved(names: Sequence[str], seed: int) -> Iterator[Turn]:
    """The turns of every named workload, one of each in turn (each in its namespace)."""
    streams = [get_workload(n, scale=SCALE, seed=seed).turns() for n in names]
    for group in itertools.zip_longest(*streams):
        yield from (t for t in group if t is not None)


@dataclass(slots=True)
class Loaded:
    """The preloaded index and the prompts of the turns that built it."""

    index: SarpIndex
    prompts: list[tuple[str, Ids]]
    turns: int
    seconds: float


def preload(index: SarpIndex, names: Sequence[str], blocks: int, seed: int) -> Loaded:
    """Insert the workloads' turns until the index holds `blocks` blocks."""
    prompts: list[tuple[str, Ids]] = []
    turns = 0
    stream = interleaved(names, seed)
    t0 = time.perf_counter()
    meta = 0
    while index.counters.blocks < blocks:
        chunk = list(itertools.islice(stream, PRELOAD_BATCH * 4))
        if not chunk:
            break
        for _, part in turn_batches(chunk, PRELOAD_BATCH):
            ops = []
            for t in part:
                meta += 1
                ops.append(Insert(0, SeqSpec(t.ns, hashes=_ids(t.sequence)), meta=meta))
                if len(t.prompt):
                    prompts.append((t.ns, t.prompt))
            for r in index.write_many(ops):
                if isinstance(r, SarpError):
                    raise click.ClickException(f"preload: {r}")
            turns += len(part)
    index.fold()  # segments whole on the backend: matches read them there, not from memory
    index.store.sync()
    return Loaded(index, prompts, turns, time.perf_counter() - t0)


def make_batches(prompts: Sequence[tuple[str, Ids]], count: int, size: int,
                 seed: int) -> list[list[Match]]:
    """`count` batches of `size` match requests: the prompts shuffled, cycled."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    picks = itertools.islice(itertools.cycle(order), count * size)
    reqs = [Match(i % size, SeqSpec(prompts[p][0], hashes=_ids(prompts[p][1])))
            for i, p in enumerate(picks)]
    return [reqs[i : i + size] for i in range(0, len(reqs), size)]


def answers(results: Sequence[MatchResult | SarpError]) -> list[Answer]:
    """A batch's answers as kept for the comparison: each query's blocks and a 128-bit
    digest of its metas' bytes (XXH3), taken in the thread that matched. Keeping the
    answers themselves (a 64-query batch's metas: ~0.5 MB) made every batch fault in
    fresh pages under the GIL: a cost of the harness, not of matching."""
    out: list[Answer] = []
    for r in results:
        if isinstance(r, SarpError):
            raise click.ClickException(f"match_many: {r}")
        out.append((r.blocks, xxhash.xxh3_128_digest(np.ascontiguousarray(r.meta, np.uint64).data)))
    return out


@dataclass(slots=True)
class Measured:
    """One measurement: a thread count on the batches."""

    threads: int
    seconds: float
    cpu_s: float
    others_cpu_s: float  # the machine's busy CPU meanwhile beyond this process's
    batches: int
    blocks: int  # matched
    queried: int
    segment_reads: int
    got: dict[int, list[list[Answer]]] = field(default_factory=dict)  # batch -> answers

    @property
    def blocks_per_s(self) -> float:
        return self.blocks / self.seconds


def measure(index: SarpIndex, work: Sequence[list[Match]], threads: int,
            seconds: float | None) -> Measured:
    """Every batch of `work` once (or, with `seconds`, cycling until then) on `threads`
    threads taking the next batch from one counter."""
    nxt = itertools.count()  # next(): atomic under the GIL
    n = len(work)
    got: dict[int, list[list[Answer]]] = {}
    raw: list[list[tuple[int, list[Answer]]]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)
    stop = [float("inf")]

    def worker(me: list[tuple[int, list[Answer]]]) -> None:
        try:
            start.wait()
            while True:
                i = next(nxt)
                if (seconds is None and i >= n) or time.perf_counter() >= stop[0]:
                    return
                me.append((i % n, answers(index.match_many(work[i % n]))))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(raw[k],), name=f"match-{k}")
            for k in range(threads)]
    for th in pool:
        th.start()
    reads0 = index.activity.segment_reads
    c0, b0 = time.process_time(), busy_cpu_s()
    start.wait()
    t0 = time.perf_counter()
    if seconds is not None:
        stop[0] = t0 + seconds
    for th in pool:
        th.join()
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    others = max(0.0, busy_cpu_s() - b0 - cpu)
    if errors:
        raise errors[0]
    done = blocks = queried = 0
    for me in raw:
        for i, got_i in me:
            got.setdefault(i, []).append(got_i)
            done += 1
            blocks += sum(b for b, _ in got_i)
    for i, _ in ((i, None) for me in raw for i, _ in me):
        queried += sum(len(m.seq.hashes) for m in work[i] if m.seq.hashes is not None)
    return Measured(threads, took, cpu, others, done, blocks, queried,
                    index.activity.segment_reads - reads0, got)


def run(names: Sequence[str], blocks: int, threads: Sequence[int], runs: int, batch: int,
        count: int, seconds: float | None, backend: str, cache_bytes: int, direct_io: bool,
        seed: int, progress: bool = False) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="sarp-parallel-"))

    def say(line: str) -> None:
        if progress:
            click.echo(line, err=True)

    try:
        be = open_backend(backend, root / backend, cache_bytes=cache_bytes, direct_io=direct_io)
        index = SarpIndex(be, IndexConfig(), None, sync=False)
        index.recover()
        try:
            loaded = preload(index, names, blocks, seed)
            say(f"preloaded {index.counters.blocks:,} blocks in {index.counters.segments:,} "
                f"segments ({loaded.turns:,} turns) in {loaded.seconds:.1f} s")
            work = make_batches(loaded.prompts, count, batch, seed)
            index.store.forget_segments()
            warm = measure(index, work, 1, None)  # untimed: caches, reference answers
            ref = {i: a[0] for i, a in warm.got.items()}
            gc.collect()
            gc.freeze()  # the preloaded index and the batches: no collection walks them
            per: dict[int, list[Measured]] = {t: [] for t in threads}
            for r in range(runs):
                for t in (threads if r % 2 == 0 else list(reversed(threads))):
                    m = measure(index, work, t, seconds)
                    for i, got in m.got.items():
                        if any(g != ref[i] for g in got):
                            raise click.ClickException(
                                f"{t} threads: batch {i}'s answers differ from one thread's")
                    m.got = {}
                    per[t].append(m)
                    say(f"run {r + 1}: {t} thread(s) {m.blocks_per_s:,.0f} match blocks/s "
                        f"({m.batches} batches in {m.seconds:.3f} s, CPU {m.cpu_s:.3f} s; "
                        f"other processes {m.others_cpu_s:.3f} s)")
            stats = index.stats()
        finally:
            gc.unfreeze()
            index.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = []
    base = max(m.blocks_per_s for m in per[threads[0]])
    for t in threads:
        ms = per[t]
        rates = [m.blocks_per_s for m in ms]
        results.append({
            "threads": t,
            "match_blocks_per_s": max(rates),
            "match_blocks_per_s_median": statistics.median(rates),
            "speedup": max(rates) / base,
            "speedup_median": statistics.median(rates) / statistics.median(
                [m.blocks_per_s for m in per[threads[0]]]),
            "runs": [{"match_blocks_per_s": m.blocks_per_s, "seconds": m.seconds,
                      "cpu_s": m.cpu_s, "others_cpu_s": m.others_cpu_s,
                      "batches": m.batches, "matched_blocks": m.blocks,
                      "queried_blocks": m.queried, "segment_reads": m.segment_reads}
                     for m in ms],
        })
    return {
        "results": results,
        "workload": ",".join(names), "seed": seed,
        "blocks": stats["blocks"], "segments": stats["segments"],
        "preload_turns": loaded.turns, "prompts": len(loaded.prompts),
        "batch": batch, "batches": count, "seconds": seconds, "runs": runs,
        "matched_blocks_per_pass": warm.blocks, "queried_blocks_per_pass": warm.queried,
        "segment_reads_per_pass": warm.segment_reads,
        "exact": True,  # every measured batch answered as the single-threaded pass did
        "backend": backend, "direct_io": direct_io,
        "page_cache": "bypassed (direct I/O)" if direct_io else "used",
        "cache_bytes": cache_bytes, "segment_cache": index.store.cache_segments,
        "exact_match": bool(stats["exact_match"]),
        "native": index.k.status(), "kernels": stats["kernels"], "verifier": stats["verifier"],
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "switch_interval_s": sys.getswitchinterval(),
    }


def parse_threads(value: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: thread counts, comma-separated") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: thread counts must be >= 1")
    return list(dict.fromkeys(out))


@click.command()
@click.option("--threads", "threads_", default="1,2", show_default=True,
              help="Thread counts to compare, comma-separated (the first is the base).")
@click.option("--workload", "-w", default="ultrachat,codeact", show_default=True,
              help="Workloads (tools/bench/workloads.py), comma-separated: one index, "
                   "a namespace each.")
@click.option("--blocks", type=click.IntRange(1), default=300_000, show_default=True,
              help="Preload until the index holds this many blocks.")
@click.option("--batch", type=click.IntRange(1), default=64, show_default=True,
              help="Queries per match_many call (64: a loaded daemon's batch, loadgen's 16 "
                   "clients x 4 in flight; 16: what the replays use).")
@click.option("--batches", "count", type=click.IntRange(1), default=256, show_default=True,
              help="Match batches per measurement (each thread count runs all of them).")
@click.option("--seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Instead: run the batches (cycling) for this long per measurement.")
@click.option("--runs", type=click.IntRange(1), default=5, show_default=True,
              help="Measurements per thread count, interleaved; best and median reported.")
@click.option("--backend", default="rocksdb", show_default=True)
@click.option("--cache-bytes", type=click.IntRange(0), default=ServerConfig().cache_bytes,
              show_default=True, help="The engine's memory budget (the daemon's default).")
@click.option("--direct-io", is_flag=True, help="Read around the OS page cache.")
@click.option("--switch-interval", type=click.FloatRange(0, min_open=True), default=None,
              help="sys.setswitchinterval for the measurements (default: Python's, 5 ms): "
                   "how long a thread waiting for the GIL waits before asking for it.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "json_out", default=None, metavar="FILE|-",
              help="Write the figures as one JSON object (to stdout with -).")
def main(threads_: str, workload: str, blocks: int, batch: int, count: int,
         seconds: float | None, runs: int, backend: str, cache_bytes: int, direct_io: bool,
         switch_interval: float | None, seed: int, json_out: str | None) -> None:
    """Match throughput of one in-process index on 1, 2, ... threads, same batches."""
    threads = parse_threads(threads_)
    names = [w for w in workload.split(",") if w]
    before = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        doc = run(names, blocks, threads, runs, batch, count, seconds, backend, cache_bytes,
                  direct_io, seed, progress=json_out != "-")
    finally:
        sys.setswitchinterval(before)
    if json_out is not None:
        write_json(doc, json_out)
    if json_out != "-":
        for r in doc["results"]:
            click.echo(f"{r['threads']} thread(s): {r['match_blocks_per_s']:,.0f} match "
                       f"blocks/s best, {r['match_blocks_per_s_median']:,.0f} median "
                       f"(x{r['speedup']:.2f} / x{r['speedup_median']:.2f})")


if __name__ == "__main__":
    main()
