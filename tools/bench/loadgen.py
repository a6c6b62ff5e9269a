"""The daemon over its socket against sarp in-process, on the same turns.

    python -m tools.bench.loadgen -w ultrachat --json -

Both sides get the same index (rocksdb, no fsync, the daemon's default cache and
settings) and the same turns, every request built before its clock starts:

- in-process: `SarpIndex.match_many` then `write_many` on batches of at most
  `--inprocess-batch` turns, one per session (16, as `sarpctl bench` replays; 64 =
  clients x depth is the largest batch the daemon can form); the `Match`/`Insert`
  objects are made beforehand;
- daemon: a real `sarpd` (`--sync none`, temp dir) and `--clients` connections, each
  with `--depth` sessions in flight (pipelined: each session's turn is a match, then
  an insert of the extended sequence, each sent once the previous answer is in). Every
  request frame is msgpack-encoded beforehand (ids as lists of 64-bit uints, as the
  serving engines send them); the clock runs from the first frame sent to the last
  answer read, so it measures the daemon, not the client library.

Besides turns per second, each side reports its CPU per turn (the in-process
process; the daemon process, all threads, from /proc), and the daemon its clients'
CPU: on a shared machine the CPU figures move far less than the rates, and their
ratio (`cpu_ratio`) is what the daemon's own costs leave of in-process speed.

A turn is a match then an insert; both rates are turns per second. `--runs N`
alternates the two N times and keeps the fastest of each (interference on a shared
machine only adds time). The target (issue 14): daemon >= 80 % of in-process.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import msgpack
import numpy as np
import uvloop

from sarpd.client.fields import ids_field
from sarpd.config import IndexConfig, ServerConfig
from sarpd.core import SarpIndex, open_backend
from sarpd.ctl.common import write_json
from sarpd.model import Insert, Match, SeqSpec
from sarpd.protocol.wire import encode_request
from tools.bench.api import Turn
from tools.bench.runner import batches
from tools.bench.spawn import start_daemon, stop_daemon

_LANE_SHIFT = 32  # request id = lane << 32 | position of the frame in its lane, from 1


def lanes_of(turns: Sequence[Turn], clients: int, depth: int) -> list[list[list[Turn]]]:
    """`clients * depth` lanes, each a list of whole sessions (sessions dealt round-robin
    in order of first appearance); lane i belongs to connection i // depth."""
    by_session: dict[tuple[str, int], list[Turn]] = defaultdict(list)
    for t in turns:
        by_session[(t.ns, t.session)].append(t)
    lanes: list[list[list[Turn]]] = [[] for _ in range(clients * depth)]
    for i, seq in enumerate(by_session.values()):
        lanes[i % len(lanes)].append(seq)
    return lanes


def lane_frames(lane: int, sessions: list[list[Turn]]) -> list[bytes]:
    """The frames of one lane, in order: match, insert, match, insert, ..."""
    frames: list[bytes] = []
    done = 0
    for turns in sessions:
        for t in turns:
            rid = (lane << _LANE_SHIFT) | (len(frames) + 1)
            frames.append(encode_request(rid, "match",
                                         {"ns": t.ns, "hashes": ids_field(t.prompt, "hashes")}))
            done += 1
            frames.append(encode_request(rid + 1, "insert", {
                "ns": t.ns, "hashes": ids_field(t.sequence, "hashes"), "meta": done}))
    return frames


class _Pipeline(asyncio.Protocol):
    """One connection driving its lanes: each answer sends the next frame of its lane."""

    def __init__(self, lanes: dict[int, list[bytes]], done: asyncio.Future[int]) -> None:
        self.lanes = lanes
        self.done = done
        self.left = sum(len(f) for f in lanes.values())
        self.answered = 0
        self.transport: asyncio.Transport | None = None
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=256 << 20)

    def start(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        first = [frames[0] for frames in self.lanes.values() if frames]
        if not first:
            self.done.set_result(0)
            return
        transport.write(b"".join(first))

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        out: list[bytes] = []
        for msg in self._unpacker:
            if msg.get("ok") is not True:
                self._fail(RuntimeError(f"sarpd answered an error: {msg!r:.300}"))
                return
            rid = msg["id"]
            frames = self.lanes[rid >> _LANE_SHIFT]
            pos = rid & ((1 << _LANE_SHIFT) - 1)  # the next frame's index
            if pos < len(frames):
                out.append(frames[pos])
            self.answered += 1
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
        if self.answered == self.left and not self.done.done():
            self.done.set_result(self.answered)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"sarpd closed the connection ({exc})"))

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


def _returns(pipe: _Pipeline) -> Callable[[], _Pipeline]:
    return lambda: pipe


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) process `pid` has used so far: all its threads, or
    only thread `tid` (the daemon's event loop is the thread whose id is its pid)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Driven:
    """CPU seconds of one drive, next to its wall `seconds`: the daemon (all threads;
    0 without a pid), its event-loop thread alone (decode, validate, queue, send), and
    the clients (this process)."""

    seconds: float
    daemon: float = 0.0
    loop: float = 0.0
    clients: float = 0.0


async def _drive(sock: Path, frames: list[list[bytes]], depth: int,
                 pid: int | None = None) -> Driven:
    """Drive `frames` (one list per lane, `depth` lanes per connection) through the
    daemon at `sock`, from the first frame sent to the last answer read."""
    loop = asyncio.get_running_loop()
    pipes: list[tuple[_Pipeline, asyncio.Transport]] = []
    for c in range(0, len(frames), depth):
        mine = {lane: frames[lane] for lane in range(c, min(c + depth, len(frames)))}
        pipe = _Pipeline(mine, loop.create_future())
        transport, _ = await loop.create_unix_connection(_returns(pipe), str(sock))
        pipes.append((pipe, transport))
    cpu0 = (cpu_seconds(pid), cpu_seconds(pid, pid)) if pid is not None else (0.0, 0.0)
    own0, t0 = time.process_time(), time.perf_counter()
    for pipe, transport in pipes:
        pipe.start(transport)
    counts = await asyncio.gather(*(pipe.done for pipe, _ in pipes))
    out = Driven(time.perf_counter() - t0, clients=time.process_time() - own0)
    if pid is not None:  # the thread's clock read inside the process's: loop <= all
        loop_s = cpu_seconds(pid, pid) - cpu0[1]
        out = Driven(out.seconds, cpu_seconds(pid) - cpu0[0], loop_s, out.clients)
    for _, transport in pipes:
        transport.close()
    assert sum(counts) == sum(len(f) for f in frames), "every request answered once"
    return out


@dataclass(frozen=True, slots=True)
class Rate:
    """One side's figures: turns per second, CPU microseconds per turn, and for the
    daemon those of its event-loop thread and of the clients."""

    tps: float
    cpu_us: float
    loop_cpu_us: float = 0.0
    client_cpu_us: float = 0.0


def daemon_tps(turns: Sequence[Turn], root: Path, clients: int, depth: int, window_ms: float,
               batch_max: int) -> Rate:
    """Turns per second through a fresh sarpd on `root` (removed afterwards), and the
    daemon process's CPU per turn."""
    frames = [lane_frames(i, lane) for i, lane in enumerate(lanes_of(turns, clients, depth))]
    proc, sock = start_daemon(root, extra=["--batch-window-ms", str(window_ms),
                                           "--batch-max", str(batch_max)])
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            d = runner.run(_drive(sock, frames, depth, proc.pid))
        n = len(turns)
        return Rate(n / d.seconds, d.daemon * 1e6 / n, d.loop * 1e6 / n, d.clients * 1e6 / n)
    finally:
        stop_daemon(proc, sock)
        shutil.rmtree(root, ignore_errors=True)


def inprocess_tps(turns: Sequence[Turn], root: Path, batch: int) -> Rate:
    """Turns per second through `SarpIndex` opened as sarpd opens it (its default cache,
    no fsync), batches of at most `batch` turns, requests built beforehand."""
    cfg = ServerConfig()
    backend = open_backend(cfg.backend, root / cfg.backend, cache_bytes=cfg.cache_bytes)
    (root / "snapshots").mkdir(parents=True, exist_ok=True)
    index = SarpIndex(backend, IndexConfig(), root / "snapshots", sync=False)
    try:
        index.recover()
        work: list[tuple[list[Match], list[Insert]]] = []
        done = 0
        for _, chunk in batches(turns, batch):
            matches = [Match(i, SeqSpec(t.ns, hashes=_ids(t.prompt))) for i, t in enumerate(chunk)]
            inserts = [Insert(i, SeqSpec(t.ns, hashes=_ids(t.sequence)), meta=done + i + 1)
                       for i, t in enumerate(chunk)]
            done += len(chunk)
            work.append((matches, inserts))
        cpu0, t0 = time.process_time(), time.perf_counter()
        for matches, inserts in work:
            index.match_many(matches)
            for r in index.write_many(inserts):
                assert not isinstance(r, Exception), r
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        index.close()
        shutil.rmtree(root, ignore_errors=True)
    return Rate(len(turns) / seconds, cpu * 1e6 / len(turns))


def _ids(ids: Any) -> np.ndarray[Any, np.dtype[np.uint64]]:
    out = np.zeros((len(ids), 2), dtype=np.uint64)
    out[:, 0] = ids
    return out


SWEEP = [(w, m) for w in (0.0, 0.25, 0.5, 1.0, 2.0) for m in (16, 64, 256)]


def _best(rates: list[Rate]) -> Rate:
    """The fastest run's rate, with the CPU figures of the run that used the least CPU per
    turn (all from one run: the loop's share is part of that run's total)."""
    least = min(rates, key=lambda r: r.cpu_us)
    return Rate(max(r.tps for r in rates), least.cpu_us, least.loop_cpu_us, least.client_cpu_us)


@click.command()
@click.option("--workload", "-w", default="ultrachat", show_default=True)
@click.option("--scale", default=1, show_default=True)
@click.option("--clients", default=16, show_default=True, type=click.IntRange(1),
              help="Connections.")
@click.option("--depth", default=4, show_default=True, type=click.IntRange(1),
              help="Sessions in flight per connection.")
@click.option("--batch-window-ms", default=0.5, show_default=True)
@click.option("--batch-max", default=256, show_default=True)
@click.option("--inprocess-batch", default=16, show_default=True, type=click.IntRange(1),
              help="Turns per in-process batch (16: as `sarpctl bench` replays; "
                   "clients x depth: the largest batches the daemon can form).")
@click.option("--runs", default=1, show_default=True, type=click.IntRange(1),
              help="Alternate in-process and daemon this many times; keep the fastest of each.")
@click.option("--sweep", is_flag=True,
              help="Also measure every combination of batch windows 0-2 ms and batch sizes "
                   "16-256 (the batching curve).")
@click.option("--json", "json_out", default=None, metavar="FILE|-",
              help="Write the figures as one JSON object (to stdout with -; the text "
                   "lines then go to stderr).")
def main(workload: str, scale: int, clients: int, depth: int, batch_window_ms: float,
         batch_max: int, inprocess_batch: int, runs: int, sweep: bool,
         json_out: str | None) -> None:
    """Throughput of sarpd over its socket vs sarp in-process, same turns."""
    from tools.bench.workloads import get_workload

    turns = list(get_workload(workload, scale=scale).turns())
    err = json_out == "-"
    root = Path(tempfile.mkdtemp(prefix="sarp-load-"))
    inproc_runs: list[Rate] = []
    daemon_runs: list[Rate] = []
    cells: list[dict[str, float]] = []
    try:
        for r in range(runs):
            inproc_runs.append(inprocess_tps(turns, root / f"inproc{r}", inprocess_batch))
            daemon_runs.append(daemon_tps(turns, root / f"d{r}", clients, depth,
                                          batch_window_ms, batch_max))
        inproc, daemon = _best(inproc_runs), _best(daemon_runs)
        click.echo(f"{workload}: {len(turns):,} turns; in-process {inproc.tps:,.0f} turns/s "
                   f"(batches of {inprocess_batch}; {inproc.cpu_us:,.0f} us CPU per turn)",
                   err=err)
        click.echo(f"daemon ({clients} clients x {depth} in flight), window {batch_window_ms} "
                   f"ms, batch max {batch_max}: {daemon.tps:,.0f} turns/s = "
                   f"{daemon.tps / inproc.tps * 100:.0f} % of in-process "
                   f"({daemon.cpu_us:,.0f} us CPU per turn, {daemon.loop_cpu_us:,.0f} of it in "
                   f"the event loop; its clients {daemon.client_cpu_us:,.0f} us)", err=err)
        for i, (w, m) in enumerate(SWEEP if sweep else []):
            cell = daemon_tps(turns, root / f"s{i}", clients, depth, w, m)
            cells.append({"batch_window_ms": w, "batch_max": m, "daemon_tps": cell.tps,
                          "daemon_cpu_us_per_turn": cell.cpu_us})
            click.echo(f"  window {w} ms, batch max {m}: {cell.tps:,.0f} turns/s = "
                       f"{cell.tps / inproc.tps * 100:.0f} %", err=err)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    doc: dict[str, Any] = {
        "workload": workload, "scale": scale, "turns": len(turns), "clients": clients,
        "depth": depth, "batch_window_ms": batch_window_ms, "batch_max": batch_max,
        "inprocess_batch": inprocess_batch, "runs": runs,
        "inprocess_tps": inproc.tps, "daemon_tps": daemon.tps, "ratio": daemon.tps / inproc.tps,
        "inprocess_cpu_us_per_turn": inproc.cpu_us, "daemon_cpu_us_per_turn": daemon.cpu_us,
        "cpu_ratio": inproc.cpu_us / daemon.cpu_us if daemon.cpu_us else 0.0,
        "daemon_loop_cpu_us_per_turn": daemon.loop_cpu_us,
        "client_cpu_us_per_turn": daemon.client_cpu_us,
        "inprocess_runs_tps": [r.tps for r in inproc_runs],
        "daemon_runs_tps": [r.tps for r in daemon_runs],
    }
    if sweep:
        doc["sweep"] = cells
    write_json(doc, json_out)


if __name__ == "__main__":
    main()
