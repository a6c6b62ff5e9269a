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
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import click

from sarpd.client import Client
from tools.bench.api import Turn
from tools.bench.runner import cache_budget, replay
from tools.bench.sarp_index import SarpBench

REPO = Path(__file__).resolve().parents[2]


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


def _daemon(root: Path) -> tuple[subprocess.Popen[bytes], Path]:
    sock = Path(tempfile.mkdtemp(prefix="sarp-load-", dir="/tmp")) / "sarpd.sock"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "sarpd.daemon", "--data-dir", str(root),
                             "--socket", str(sock), "--backend", "rocksdb", "--sync", "none",
                             "--log-level", "WARNING"], env=env, cwd=REPO)
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sarpd did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return proc, sock


@click.command()
@click.option("--workload", "-w", default="ultrachat", show_default=True)
@click.option("--scale", default=1, show_default=True)
@click.option("--clients", default=16, show_default=True, help="Connections.")
@click.option("--depth", default=4, show_default=True, help="Sessions in flight per connection.")
def main(workload: str, scale: int, clients: int, depth: int) -> None:
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
        proc, sock = _daemon(root / "daemon")
        try:
            time.sleep(0.5)
            daemon = asyncio.run(_drive(sock, turns, clients, depth))
        finally:
            proc.terminate()
            proc.wait(60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    click.echo(f"{workload}: {len(turns):,} turns; in-process {inproc:,.0f} turns/s; daemon "
               f"({clients} clients x {depth} in flight) {daemon:,.0f} turns/s = "
               f"{daemon / inproc * 100:.0f} % of in-process")


if __name__ == "__main__":
    main()
