"""Events/s applied through the vLLM bridge into a real sarpd.

    python -m tools.bench.bridge                      # starts a sarpd on a temp dir
    python -m tools.bench.bridge --sync always --batches 2000 --events 32
    python -m tools.bench.bridge --socket var/sarpd.sock   # an existing sarpd

A `Publisher` (vLLM's wire format) sends pre-encoded `EventBatch`es (`--encoding`:
``array`` all array_like, ``map`` all maps, ``current`` vLLM's current schema
encoded by msgspec, `tools.bench.vllm_schema`): `--events` events per batch, each a
`BlockStored` of `--blocks` blocks continuing an earlier chain (parent) or starting a
new one, and every `--remove-every`-th a `BlockRemoved` of old blocks. The clock runs
from the first batch published to the last one acknowledged by sarpd (the bridge's
position), so it measures the whole path: ZMQ, decoding, translation, the pipelined
requests, sarpd's durable writes.

``--json -`` prints one JSON object (``events_per_s``, ``blocks_per_s``,
``bare_blocks_per_s``, ``bridge_alone_events_per_s``, the CPU time per event of the
bridge and of sarpd, ...). ``bare_blocks_per_s`` is the ceiling of the same run: the
very records sarpd's write path commits for these events (segments, block locators,
change log, counters: captured by applying the bridge's own requests to an
in-process index on a recording backend, one write transaction per `EventBatch`,
vLLM's unit of publication) written again as bare backend write batches, one per
`EventBatch`, synced, into a fresh RocksDB: what the blocks cost the engine alone.
``bridge_alone_events_per_s``: the same events into `tools.bench.null_sarpd`, which
answers every request at once (the bridge's own ceiling).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from backends.base import WriteBatch
from backends.memory import MemoryBackend
from backends.registry import open_backend
from sarpd.bridge.vllm import BridgeConfig, VllmBridge
from sarpd.config import IndexConfig
from sarpd.core import SarpIndex, WriteOp
from sarpd.events.mapping import ClearOp, InsertOp, Op, RemoveOp, Translator
from sarpd.events.schema import decode_batch
from sarpd.model import Clear, IdArray, Insert, Remove, SeqSpec
from tools.bench import vllm_schema as vs
from tools.bench.spawn import DaemonStartError, start_daemon, stop_daemon
from tools.bench.vllm_publisher import Publisher, encode_batch, removed, stored

ENCODINGS = ("array", "map", "current")


def _encode(evs: list[dict[str, Any]], encoding: str) -> bytes:
    if encoding != "current":
        return encode_batch(evs, array_like=encoding == "array")
    structs: list[vs.KVCacheEvent] = [
        vs.block_removed(e["block_hashes"]) if e["type"] == "BlockRemoved"
        else vs.block_stored(e["block_hashes"], e["parent_block_hash"], e["token_ids"],
                             group_idx=0)
        for e in evs
    ]  # fmt: skip
    return vs.encode_events(structs)


def make_batches(
    n_batches: int, events: int, blocks: int, remove_every: int, seed: int, encoding: str
) -> tuple[list[bytes], int]:
    """Encoded payloads and how many events they hold."""
    rng = random.Random(seed)
    tails: list[int] = []
    live: list[int] = []
    gone: set[int] = set()  # removed since the last store: not a parent any more
    next_hash = 1
    out, count = [], 0
    for b in range(n_batches):
        evs: list[dict[str, Any]] = []
        for e in range(events):
            if remove_every and (b * events + e) % remove_every == remove_every - 1 and live:
                k = min(len(live), blocks)
                evs.append(removed(live[:k]))
                gone.update(live[:k])
                del live[:k]
                continue
            tails = [t for t in tails if t not in gone] if gone else tails
            gone.clear()
            parent = rng.choice(tails) if tails and rng.random() < 0.7 else None
            hashes = list(range(next_hash, next_hash + blocks))
            next_hash += blocks
            evs.append(stored(hashes, parent, [0] * (16 * blocks)))
            tails.append(hashes[-1])
            live.extend(hashes)
            if len(tails) > 1000:
                tails = tails[-1000:]
        count += len(evs)
        out.append(_encode(evs, encoding))
    return out, count


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` (/proc)."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(socket: Path, payloads: list[bytes], inflight: int,
        daemon_pid: int | None = None) -> tuple[float, dict[str, Any]]:  # fmt: skip
    """(seconds, the bridge's counters, plus ``cpu_s``: this process's CPU time over
    the run (the bridge, and the publisher's thread), and ``sarpd_cpu_s``)."""
    pub = Publisher()
    cfg = BridgeConfig(endpoint=pub.endpoint, socket=str(socket), max_inflight=inflight)
    bridge: list[VllmBridge] = []
    ready = threading.Event()
    loop_box: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loop_box.append(asyncio.get_running_loop())
        bridge.append(VllmBridge(cfg))
        await bridge[0].run(on_ready=ready.set)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(60) or not pub.subscribed.wait(60):
        raise click.ClickException("the bridge did not start")
    time.sleep(0.1)
    stats = bridge[0].stats
    t0 = time.perf_counter()
    cpu0 = cpu_seconds()
    d_cpu0 = cpu_seconds(daemon_pid) if daemon_pid is not None else 0.0
    for p in payloads:
        pub.publish(p)
    with click.progressbar(length=len(payloads), label="batches applied",
                           file=sys.stderr) as bar:
        done = 0
        while stats.last_seq < len(payloads) - 1:
            time.sleep(0.05)
            bar.update(stats.batches - done)
            done = stats.batches
        bar.update(len(payloads) - done)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    d_cpu = cpu_seconds(daemon_pid) - d_cpu0 if daemon_pid is not None else None
    loop_box[0].call_soon_threadsafe(bridge[0].stop)
    thread.join(30)
    pub.close()
    return seconds, {**stats.as_dict(), "cpu_s": cpu, "sarpd_cpu_s": d_cpu}


def id_array(ids: tuple[int, ...] | list[int]) -> IdArray:
    """Bridge ids (uint64) as sarpd's (n, 2) ids: zero-extended, as sarpd reads a uint."""
    out = np.zeros((len(ids), 2), dtype=np.uint64)
    out[:, 0] = np.array(ids, dtype=np.uint64)
    return out


def model_ops(ops: list[Op], holders: bool = True) -> list[WriteOp]:
    """The bridge's requests as the in-process index's write ops (what sarpd decodes
    them to); canary checks (another namespace, a match) are left out."""
    out: list[WriteOp] = []
    for i, op in enumerate(ops, 1):
        if isinstance(op, InsertOp):
            parent = None if op.parent is None else id_array([op.parent])
            out.append(Insert(i, SeqSpec(op.ns, hashes=id_array(op.hashes)), op.meta,
                              parent, add_holder=holders))  # fmt: skip
        elif isinstance(op, RemoveOp):
            out.append(Remove(i, ns=op.ns, ids=id_array(op.ids), meta=op.meta))
        elif isinstance(op, ClearOp):
            out.append(Clear(i, op.ns, op.mask, op.value))
    return out


class RecordingBackend(MemoryBackend):
    """A memory backend that keeps a copy of every write batch (the records)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[WriteBatch] = []

    def write(self, batch: WriteBatch, sync: bool) -> None:
        self.batches.append(WriteBatch(dict(batch.puts), set(batch.deletes)))
        super().write(batch, sync)


def bare_run(payloads: list[bytes], root: Path) -> tuple[float, int, int]:
    """(seconds, new blocks, write batches): sarpd's records for these events as bare synced write
    batches into a fresh RocksDB (module doc)."""
    rec = RecordingBackend()
    index = SarpIndex(rec, IndexConfig(snapshot_interval_s=0.0))
    rec.batches.clear()  # the manifest of a new index: not these events' records
    tr = Translator(0)
    new = 0
    for p in payloads:
        ops = [op for t in tr.translate(decode_batch(p)) for op in t.ops]
        for r in index.write_many(model_ops(ops)):
            new += getattr(r, "new_blocks", 0)
    backend = open_backend("rocksdb", root / "bare", cache_bytes=64 << 20)
    try:
        t0 = time.perf_counter()
        for wb in rec.batches:
            backend.write(wb, True)
        seconds = time.perf_counter() - t0
    finally:
        backend.close()
    return seconds, new, len(rec.batches)


def alone_run(payloads: list[bytes], inflight: int) -> tuple[float, dict[str, Any]]:
    """`run` against `tools.bench.null_sarpd` (a process of its own): the bridge alone."""
    sock_dir = Path(tempfile.mkdtemp(prefix="sarp-null-", dir="/tmp"))
    sock = sock_dir / "null.sock"
    proc = subprocess.Popen([sys.executable, "-m", "tools.bench.null_sarpd", str(sock)],
                            cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException("tools.bench.null_sarpd did not start")
            time.sleep(0.02)
        return run(sock, payloads, inflight)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(sock_dir, ignore_errors=True)


@click.command()
@click.option("--socket", type=click.Path(path_type=Path), default=None,
              help="Use this running sarpd instead of starting one on a temp dir.")
@click.option("--sync", type=click.Choice(["always", "none"]), default="always",
              show_default=True, help="--sync of the sarpd this bench starts.")
@click.option("--batches", type=click.IntRange(1), default=1000, show_default=True,
              help="EventBatches to publish.")
@click.option("--events", type=click.IntRange(1), default=32, show_default=True,
              help="Events per batch.")
@click.option("--blocks", type=click.IntRange(1), default=4, show_default=True,
              help="Blocks per BlockStored.")
@click.option("--remove-every", type=click.IntRange(0), default=5, show_default=True,
              help="Every Nth event is a BlockRemoved of old blocks (0: none).")
@click.option("--inflight", type=click.IntRange(1), default=4096, show_default=True,
              help="Requests in flight from the bridge to sarpd.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default="array", show_default=True,
              help="array_like structs, maps, or vLLM's current schema (msgspec).")
@click.option("--seed", default=1, show_default=True, help="Random seed of the events.")
@click.option("--json", "json_out", type=click.File("w"), default=None,
              help="Also write the figures as one JSON object to this file ('-': stdout; "
                   "the human line then goes to stderr).")
def main(socket: Path | None, sync: str, batches: int, events: int, blocks: int,
         remove_every: int, inflight: int, encoding: str, seed: int,
         json_out: Any) -> None:  # fmt: skip
    """Events/s applied through `sarpctl bridge vllm`'s engine into sarpd."""
    payloads, n_events = make_batches(batches, events, blocks, remove_every, seed, encoding)
    root = Path(tempfile.mkdtemp(prefix="sarp-bridge-bench-"))
    proc = None
    try:
        if socket is None:
            try:
                proc, socket = start_daemon(root, sync=sync)
            except DaemonStartError as exc:
                raise click.ClickException(str(exc)) from exc
        seconds, stats = run(socket, payloads, inflight, proc.pid if proc else None)
        bare_s, bare_new, bare_batches = bare_run(payloads, root)
        alone_s, _ = alone_run(payloads, inflight)
    finally:
        if proc is not None and socket is not None:
            stop_daemon(proc, socket)
        shutil.rmtree(root, ignore_errors=True)
    ev = stats["events"]
    doc = {
        "events_per_s": n_events / seconds,
        "blocks_per_s": stats["blocks_new"] / seconds,
        "bare_blocks_per_s": bare_new / bare_s,
        # the same events into a stand-in for sarpd that answers at once: the bridge alone
        "bridge_alone_events_per_s": n_events / alone_s,
        "events": n_events, "blocks_new": stats["blocks_new"], "seconds": seconds,
        "bare_seconds": bare_s, "bare_write_batches": bare_batches, "batches": batches,
        "events_per_batch": events, "blocks_per_store": blocks,
        "remove_every": remove_every, "encoding": encoding,
        "sync": sync if proc else None, "unknown_parent": stats["unknown_parent"],
        "retries": stats["retries"],
        # CPU per event: the bridge's process (with the publisher's thread), sarpd's
        "bridge_cpu_us_per_event": 1e6 * stats["cpu_s"] / n_events,
        "sarpd_cpu_us_per_event": (None if stats["sarpd_cpu_s"] is None
                                   else 1e6 * stats["sarpd_cpu_s"] / n_events),
    }  # fmt: skip
    if json_out is not None:
        json_out.write(json.dumps(doc) + "\n")
    click.echo(
        f"{n_events} events ({ev['stored']} stored, {ev['removed']} removed) in {batches} "
        f"batches, {blocks} blocks per store, sync {sync if proc else 'of the given sarpd'}: "
        f"{seconds:.2f} s, {n_events / seconds:,.0f} events/s, "
        f"{stats['blocks_new'] / seconds:,.0f} blocks/s; unknown_parent "
        f"{stats['unknown_parent']}, retries {stats['retries']}; bare write batches of "
        f"the same records: {bare_new / bare_s:,.0f} blocks/s",
        err=json_out is not None and getattr(json_out, "name", "") == "<stdout>",
    )


if __name__ == "__main__":
    main()
