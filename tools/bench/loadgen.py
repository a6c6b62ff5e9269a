"""The daemon over its socket against sarp in-process, on the same turns.

    python -m tools.bench.loadgen -w ultrachat --clients 16 --depth 4

Starts a real `sarpd` (rocksdb, --sync none, temp dir), replays the workload through
`--clients` connections, each with `--depth` sessions in flight (pipelined: each
session's turn is a match, then an insert of the extended sequence, in order), and
replays the same turns through `SarpIndex` in-process (batches of 16, as the
benchmark does). Prints both throughputs and their ratio (the performance issue's
target: the daemon reaches >= 60 % of in-process throughput).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import click

from sarpd.client import Client
from tools.bench.api import Turn
from tools.bench.runner import cache_budget, replay
from tools.bench.sarp_index import SarpBench
from tools.bench.spawn import start_daemon, stop_daemon


async def _worker(client: Client, sessions: list[list[Turn]]) -> int:
    done = 0
    for turns in sessions:
        for t in turns:
            await client.match(hashes=t.prompt, ns=t.ns)
            await client.insert(hashes=t.sequence, meta=done + 1, ns=t.ns)
            done += 1
    return done


async def _drive(sock: Path, turns: list[Turn], clients: int, depth: int) -> float:
    by_session: dict[tuple[str, int], list[Turn]] = defaultdict(list)
    for t in turns:
        by_session[(t.ns, t.session)].append(t)
    workers: list[list[list[Turn]]] = [[] for _ in range(clients * depth)]
    for i, seq in enumerate(by_session.values()):
        workers[i % len(workers)].append(seq)
    conns = [await Client.connect(str(sock)) for _ in range(clients)]
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(_worker(conns[i // depth], w) for i, w in enumerate(workers)))
    seconds = time.perf_counter() - t0
    for c in conns:
        await c.close()
    assert sum(counts) == len(turns)
    return len(turns) / seconds


def daemon_rps(turns: list[Turn], root: Path, clients: int, depth: int, window_ms: float,
               batch_max: int) -> float:
    proc, sock = start_daemon(root, extra=["--batch-window-ms", str(window_ms),
                                           "--batch-max", str(batch_max)])
    try:
        time.sleep(0.5)
        return asyncio.run(_drive(sock, turns, clients, depth))
    finally:
        stop_daemon(proc, sock)
        shutil.rmtree(root, ignore_errors=True)


@click.command()
@click.option("--workload", "-w", default="ultrachat", show_default=True)
@click.option("--scale", default=1, show_default=True)
@click.option("--clients", default=16, show_default=True, help="Connections.")
@click.option("--depth", default=4, show_default=True, help="Sessions in flight per connection.")
@click.option("--batch-window-ms", default=0.5, show_default=True)
@click.option("--batch-max", default=256, show_default=True)
@click.option("--sweep", is_flag=True,
              help="Measure every combination of batch windows 0-2 ms and batch sizes 16-256 "
                   "(the batching curve) instead of one setting.")
def main(workload: str, scale: int, clients: int, depth: int, batch_window_ms: float,
         batch_max: int, sweep: bool) -> None:
    """Throughput of sarpd over its socket vs sarp in-process, same turns."""
    from tools.bench.workloads import get_workload

    turns = list(get_workload(workload, scale=scale).turns())
    root = Path(tempfile.mkdtemp(prefix="sarp-load-"))
    try:
        index = SarpBench()
        _, cache = cache_budget(turns)
        index.open(root / "inproc", "rocksdb", cache)
        _, total, _, _, _ = replay(index, turns, 16)
        index.close()
        inproc = len(turns) / total
        click.echo(f"{workload}: {len(turns):,} turns; in-process {inproc:,.0f} turns/s")
        grid = ([(w, m) for w in (0.0, 0.25, 0.5, 1.0, 2.0) for m in (16, 64, 256)] if sweep
                else [(batch_window_ms, batch_max)])
        for i, (w, m) in enumerate(grid):
            rps = daemon_rps(turns, root / f"d{i}", clients, depth, w, m)
            click.echo(f"daemon ({clients} clients x {depth} in flight), window {w} ms, "
                       f"batch max {m}: {rps:,.0f} turns/s = {rps / inproc * 100:.0f} % of "
                       "in-process")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
