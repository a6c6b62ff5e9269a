"""Soak benchmark: many clients against one real sarpd for a bounded time, on loopback
(a Unix socket in a temp dir). Reports, per interval, throughput, p50/p99 latency
and the daemon's RSS, and says whether RSS plateaued.

    python -m tools.bench.soak --duration 180 --clients 32
    python -m tools.bench.soak --duration 30 --clients 8 --json soak.json

The workload is an agentic chat: `--prompts` shared system prompts of 32 blocks;
each client runs `--sessions` conversations round-robin, every turn a `match` of
the conversation so far plus the new user blocks, then an `insert` of it with the
answer's blocks. A conversation ends after `--turns` turns; with `--evict` (the
default) its own blocks are then removed (`remove` from the end of the system
prompt), as a serving engine evicts, so the live index stays bounded and RSS
should plateau. Block ids are caller hashes (`hashes`, 16-byte `bin`), so the
clients spend no time hashing tokens.

Each interval also records, from the daemon's `stats`, what RSS is made of: indexed
blocks, routing directory bytes, and (rocksdb) memtable and block-cache bytes.
RocksDB's memtables and block cache (together the daemon's `cache_bytes`, 128 MiB by
default: 2 x 16 MiB of memtables, the rest block cache) fill over the first minutes,
so RSS rises until they are full.

Plateau rule: the peak RSS of the last third of the run is within `--tolerance`
(default 5 %) of the peak of the middle third. The first third is warm-up (caches,
the directory and the segment cache fill).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
import numpy as np

from sarpd.client import Client
from tools.bench.spawn import DaemonStartError, start_daemon, stop_daemon

SYS_BLOCKS = 32


@dataclass(slots=True)
class Interval:
    t: float  # seconds since start, at the end of the interval
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    rss_mb: float
    blocks: int = 0
    directory_kb: float = 0.0
    memtable_mb: float = 0.0
    cache_mb: float = 0.0


@dataclass(slots=True)
class Report:
    clients: int
    duration_s: float
    requests: int
    errors: int
    rps: float
    p99_ms: float
    rss_start_mb: float
    rss_end_mb: float
    rss_peak_mb: float
    plateaued: bool
    intervals: list[Interval] = field(default_factory=list)


class Recorder:
    """Latencies and error counts since the last `take`."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.errors = 0

    def take(self) -> tuple[np.ndarray[tuple[int], np.dtype[np.float64]], int]:
        lat, self.lat = np.asarray(self.lat, dtype=np.float64), []
        err, self.errors = self.errors, 0
        return lat, err


def ids(rng: np.random.Generator, n: int) -> np.ndarray[tuple[int, int], np.dtype[np.uint64]]:
    out = np.zeros((n, 2), dtype=np.uint64)
    out[:, 0] = rng.integers(1, 2**63, size=n, dtype=np.uint64)
    return out


async def timed(rec: Recorder, coro: object) -> None:
    t0 = time.perf_counter()
    try:
        await coro  # type: ignore[misc]
    except Exception:
        rec.errors += 1
    rec.lat.append(time.perf_counter() - t0)


async def client_loop(path: str, cid: int, opts: dict[str, int | bool], prompts: list[np.ndarray],
                      rec: Recorder, stop: asyncio.Event) -> None:
    rng = np.random.default_rng(cid)
    client = await Client.connect(path)
    ns = f"soak{cid % 4}"
    sessions: list[np.ndarray] = []
    turns: list[int] = []
    try:
        for _ in range(int(opts["sessions"])):
            sessions.append(prompts[int(rng.integers(len(prompts)))])
            turns.append(0)
        i = 0
        while not stop.is_set():
            s = i % len(sessions)
            i += 1
            user = ids(rng, int(rng.integers(1, 8)))
            query = np.concatenate([sessions[s], user])
            await timed(rec, client.match(hashes=query, ns=ns))
            answer = ids(rng, int(rng.integers(2, 16)))
            full = np.concatenate([query, answer])
            await timed(rec, client.insert(hashes=full, meta=cid, ns=ns))
            sessions[s], turns[s] = full, turns[s] + 1
            if turns[s] >= int(opts["turns"]):
                if opts["evict"]:
                    await timed(rec, client.remove(hashes=full, ns=ns, start=SYS_BLOCKS))
                sessions[s] = prompts[int(rng.integers(len(prompts)))]
                turns[s] = 0
    finally:
        await client.close()


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def drive(path: str, pid: int, clients: int, duration: float, every: float,
                opts: dict[str, int | bool]) -> list[Interval]:
    rng = np.random.default_rng(12345)
    prompts = [ids(rng, SYS_BLOCKS) for _ in range(int(opts["prompts"]))]
    rec, stop = Recorder(), asyncio.Event()
    tasks = [asyncio.create_task(client_loop(path, c, opts, prompts, rec, stop))
             for c in range(clients)]
    out: list[Interval] = []
    probe = await Client.connect(path)
    start = last = time.monotonic()
    with click.progressbar(length=int(duration), label="soak", file=sys.stderr,
                           item_show_func=lambda s: s) as bar:
        while last - start < duration:
            await asyncio.sleep(every)
            now = time.monotonic()
            lat, err = rec.take()
            p50, p99 = (np.percentile(lat, [50, 99]) * 1000).tolist() if lat.size else (0, 0)
            st = await probe.stats()
            iv = Interval(round(now - start, 1), int(lat.size), lat.size / (now - last),
                          p50, p99, err, rss_mb(pid), int(st.get("blocks", 0)),
                          st.get("directory_bytes", 0) / 1024,
                          st.get("backend_memtable_bytes", 0) / 2**20,
                          st.get("backend_block_cache_usage", 0) / 2**20)
            out.append(iv)
            bar.update(int(now - start) - bar.pos,
                       f"{iv.rps:,.0f} req/s p99 {iv.p99_ms:.1f} ms RSS {iv.rss_mb:.0f} MB")
            last = now
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await probe.close()
    return out


def plateaued(rss: list[float], tolerance: float) -> bool:
    third = len(rss) // 3
    if third < 1:
        return False
    middle, last = max(rss[third : 2 * third]), max(rss[2 * third :])
    return last <= middle * (1 + tolerance)


@click.command()
@click.option("--duration", type=click.FloatRange(5), default=120.0, show_default=True,
              help="Seconds of load.")
@click.option("--clients", type=click.IntRange(1), default=32, show_default=True,
              help="Concurrent client connections.")
@click.option("--sessions", type=click.IntRange(1), default=4, show_default=True,
              help="Conversations per client, taken round-robin.")
@click.option("--turns", type=click.IntRange(1), default=8, show_default=True,
              help="Turns per conversation before it ends.")
@click.option("--prompts", type=click.IntRange(1), default=8, show_default=True,
              help="Shared system prompts (32 blocks each).")
@click.option("--evict/--no-evict", default=True, show_default=True,
              help="Remove a conversation's own blocks when it ends.")
@click.option("--interval", "every", type=click.FloatRange(0.5), default=5.0, show_default=True,
              help="Seconds per reported interval.")
@click.option("--backend", default="rocksdb", show_default=True, help="sarpd storage engine.")
@click.option("--sync", type=click.Choice(["always", "none"]), default="always",
              show_default=True, help="sarpd --sync.")
@click.option("--tolerance", type=click.FloatRange(0), default=0.05, show_default=True,
              help="RSS plateau tolerance (fraction).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the report as JSON here.")
def main(duration: float, clients: int, sessions: int, turns: int, prompts: int, evict: bool,
         every: float, backend: str, sync: str, tolerance: float, json_path: Path | None) -> None:
    """Soak a real sarpd with many clients for --duration seconds; report throughput,
    p99 latency and RSS over time, and whether RSS plateaued (exit 1 if not)."""
    root = Path(tempfile.mkdtemp(prefix="sarp-soak-", dir="/tmp"))
    try:
        proc, sock = start_daemon(root / "data", backend=backend, sync=sync)
    except DaemonStartError as exc:
        raise click.ClickException(str(exc)) from exc
    opts: dict[str, int | bool] = {"sessions": sessions, "turns": turns, "prompts": prompts,
                                   "evict": evict}
    try:
        time.sleep(0.5)
        rss0 = rss_mb(proc.pid)
        intervals = asyncio.run(drive(str(sock), proc.pid, clients, duration, every, opts))
    finally:
        stop_daemon(proc, sock)
        shutil.rmtree(root, ignore_errors=True)
    report = summarize(intervals, clients, rss0, tolerance)
    print_report(report)
    if json_path is not None:
        json_path.write_text(json.dumps(asdict(report), indent=2))
    sys.exit(0 if report.plateaued else 1)


def summarize(intervals: list[Interval], clients: int, rss0: float, tol: float) -> Report:
    rss = [iv.rss_mb for iv in intervals]
    total = sum(iv.requests for iv in intervals)
    dur = intervals[-1].t if intervals else 0.0
    return Report(clients, dur, total, sum(iv.errors for iv in intervals),
                  total / dur if dur else 0.0, max((iv.p99_ms for iv in intervals), default=0.0),
                  rss0, rss[-1] if rss else rss0, max(rss, default=rss0),
                  plateaued(rss, tol), intervals)


def print_report(r: Report) -> None:
    click.echo(f"{'t (s)':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
               f"{'RSS MB':>8} {'blocks':>9} {'dir KB':>8} {'memtbl MB':>9} {'cache MB':>8}")
    for iv in r.intervals:
        click.echo(f"{iv.t:7.1f} {iv.rps:9,.0f} {iv.p50_ms:8.2f} {iv.p99_ms:8.2f} "
                   f"{iv.errors:7d} {iv.rss_mb:8.1f} {iv.blocks:9,d} {iv.directory_kb:8.0f} "
                   f"{iv.memtable_mb:9.1f} {iv.cache_mb:8.1f}")
    verdict = "plateaued" if r.plateaued else "still growing"
    click.echo(f"{r.clients} clients, {r.duration_s:.0f} s: {r.requests:,} requests "
               f"({r.rps:,.0f}/s), {r.errors} errors, worst interval p99 {r.p99_ms:.1f} ms; "
               f"RSS {r.rss_start_mb:.0f} -> {r.rss_end_mb:.0f} MB (peak {r.rss_peak_mb:.0f}): "
               f"{verdict}")


if __name__ == "__main__":
    main()
