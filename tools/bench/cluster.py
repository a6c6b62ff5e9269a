"""The cluster benchmark (issue 15): replicas and shards against one sarpd, same run.

    python -m tools.bench.cluster --json -
    python -m tools.bench.cluster --configs 1x1,1x3,2x2 --seconds 5 --catch-up 1000000

For each configuration SHARDSxREPLICAS (a local cluster, tools.cluster.local: 3 NATS
nodes, the shard's stream with 3 copies fsync'd before each acknowledgement, the
replicas with sync always), and for a single sarpd on its socket (sync always):

1. **fill**: `--sequences` sequences of 4-12 blocks on 4 shared prompts, inserted
   through the cluster client (one write at a time: the write latency to the
   acknowledgement, `write_us_p50` / `write_us_p99`);
2. **lag**: every 20 writes of the fill, each replica's `stats` gives its `lag_seqs`
   (entries of the log it has not applied): `lag_seq_p50` / `lag_seq_p99` over
   samples and replicas. Then `--sequences` / 4 more writes, one at a time, each
   followed by a match with `after_seq` at the write's seq on every replica of its
   shard, on the replica's own socket: `lag_ms_p50` / `lag_ms_p99` are the times
   from the acknowledgement to those answers (the write visible there; a match's
   round trip included), over writes and replicas. These probes run in a pass of
   their own, so that they do not load the fill's write timings;
3. **matches**: `--clients` concurrent matchers, each its own cluster client, match
   random filled sequences for `--seconds`: `match_rps`, `match_us_p99`. Every answer
   is checked against what was filled (a wrong answer fails the run).

`--catch-up BLOCKS[,BLOCKS]`: one shard, one replica, filled with BLOCKS blocks (writes
of 64 blocks, 8 in flight), then a new replica joins: once from an empty data
directory that replays the whole log, and once from a published checkpoint
(`catch_up_s`, `catch_up_from_checkpoint_s`: from its spawn to its first answer).
The 10M case (about 15 minutes here, most of it the fill) is a documented long run,
not CI.

`--skew W[,W]` (`--scale K`): how a workload's requests spread over 2, 4 and 8
shards under the heads rule (sarpd/cluster/shardmap.py), run over real indexes in one
process (tools/bench/shard_sim.py): per shard count, each shard's share of the
requests (`shares`, `max_share`), the shards' summed `new_blocks` over a single
index's (`write_amplification`), the splits made, and what block 0 alone (the
version 1 rule) gave (`block0_max_share`).

On this machine every process shares 2 cores, so more replicas do not add CPU: the
figures say what the cluster's path costs (NATS, the log, the forwarding), and
`per_core` divides each rate by the 2 cores. On real hosts each replica has its own
cores: reads scale with replicas per shard and with shards, writes with shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import click
import numpy as np

from sarpd.client import Client, ClusterClient, Ops
from sarpd.cluster import checkpoints, log
from sarpd.ctl.common import write_json
from sarpd.errors import SarpError, Unavailable
from tools.bench.spawn import start_daemon, stop_daemon
from tools.cluster.local import LocalCluster, ReplicaProc, local_sarp_cluster

BT = 16
CORES = 2
PROMPTS = 4
CATCH_UP_TIMEOUT_S = 3600.0  # a whole-log replay of 10M blocks (about a minute here)
PUBLISH_TIMEOUT_S = 3600.0  # the first checkpoint of a 10M-block replica (tar + upload)


def sequences(n: int, seed: int) -> list[list[int]]:
    """n sequences of 4-12 blocks, each on one of PROMPTS shared 2-block prompts."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 2**32, 2 * BT).tolist() for _ in range(PROMPTS)]
    return [prompts[i % PROMPTS] + rng.integers(0, 2**32, int(rng.integers(2, 11)) * BT)
            .tolist() for i in range(n)]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


@dataclass
class Measured:
    write_us: list[float]
    match_us: list[float]
    matches: int
    seconds: float
    lag: list[int] = field(default_factory=list)  # lag_seqs samples
    lag_ms: list[float] = field(default_factory=list)  # per write and replica


class Probes:
    """Replication lag as a reader sees it, from each replica's own socket."""

    def __init__(self, sockets: dict[str, list[Path]]) -> None:
        self.sockets = sockets  # shard -> its replicas' sockets
        self.clients: dict[str, list[Client]] = {}
        self.visible_ms: list[float] = []
        self.lag_seqs: list[int] = []

    async def open(self) -> None:
        for shard, socks in self.sockets.items():
            self.clients[shard] = [await Client.connect(s) for s in socks]

    async def visible(self, shard: str, seq: int, tokens: list[int]) -> None:
        """A write to `shard` was acknowledged with `seq` just now: time its arrival
        on every replica of the shard."""
        acked = time.perf_counter()

        async def seen(c: Client) -> None:
            await c.request("match", tokens=tokens[:BT], after_seq={shard: seq},
                            after_seq_wait_ms=60_000)
            self.visible_ms.append((time.perf_counter() - acked) * 1e3)

        await asyncio.gather(*(seen(c) for c in self.clients[shard]))

    async def sample(self) -> None:
        for clients in self.clients.values():
            for c in clients:
                self.lag_seqs.append(int((await c.stats())["cluster"]["lag_seqs"]))

    async def close(self) -> None:
        for clients in self.clients.values():
            for c in clients:
                await c.close()


async def _fill(c: Ops, seqs: list[list[int]], probes: Probes | None = None,
                ) -> list[float]:
    lat: list[float] = []
    for i, s in enumerate(seqs):
        t0 = time.perf_counter()
        await c.insert(tokens=s, meta=i + 1)
        lat.append((time.perf_counter() - t0) * 1e6)
        if probes is not None and i % 20 == 0:
            await probes.sample()
    return lat


async def _lag(c: ClusterClient, seqs: list[list[int]], probes: Probes) -> None:
    """One write at a time, each timed to its arrival on every replica of its shard."""
    for s in seqs:
        got = await c.insert(tokens=s, meta=1)
        await probes.visible(c.shard_for(tokens=s), int(got["seq"]), s)


async def _matchers(make: Any, seqs: list[list[int]], clients: int,
                    seconds: float) -> tuple[list[float], int, float]:
    """`clients` concurrent matchers for `seconds`; answers checked."""
    lat: list[float] = []
    want = {i: len(s) // BT for i, s in enumerate(seqs)}

    async def one(k: int) -> int:
        c = await make()
        rng = random.Random(k)
        n = 0
        try:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                i = rng.randrange(len(seqs))
                t0 = time.perf_counter()
                got = await c.match(tokens=seqs[i])
                lat.append((time.perf_counter() - t0) * 1e6)
                if got["blocks"] != want[i]:
                    raise AssertionError(f"sequence {i}: {got['blocks']} blocks, "
                                         f"expected {want[i]}")
                n += 1
        finally:
            await c.close()
        return n

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(k) for k in range(clients)))
    return lat, sum(counts), time.perf_counter() - t0


def run_cluster(base: Path, shards: int, replicas: int, n: int, clients: int,
                seconds: float) -> dict[str, Any]:
    lc = LocalCluster(base / f"{shards}x{replicas}", 3, replicas, shards)
    lc.start()
    try:
        assert lc.nats is not None
        urls = lc.nats.urls
        seqs = sequences(n, seed=shards * 10 + replicas)

        async def go() -> Measured:
            socks: dict[str, list[Path]] = {}
            for p in lc.procs:
                socks.setdefault(p.shard, []).append(p.socket)
            probes = Probes(socks)
            await probes.open()
            c = await ClusterClient.open(urls)
            try:
                wlat = await _fill(c, seqs, probes)
                await _lag(c, sequences(max(1, n // 4), seed=1000 + shards * 10 + replicas),
                           probes)
            finally:
                await c.close()
                await probes.close()
            mlat, count, secs = await _matchers(lambda: ClusterClient.open(urls), seqs,
                                                clients, seconds)
            return Measured(wlat, mlat, count, secs, probes.lag_seqs, probes.visible_ms)

        m = asyncio.run(go())
    finally:
        lc.stop()
    return _result(m, shards, replicas)


def run_single(base: Path, n: int, clients: int, seconds: float) -> dict[str, Any]:
    proc, sock = start_daemon(base / "single", sync="always")
    try:
        seqs = sequences(n, seed=0)

        async def go() -> Measured:
            c = await Client.connect(sock)
            try:
                wlat = await _fill(c, seqs)
            finally:
                await c.close()
            mlat, count, secs = await _matchers(lambda: Client.connect(sock), seqs, clients,
                                                seconds)
            return Measured(wlat, mlat, count, secs)

        m = asyncio.run(go())
    finally:
        stop_daemon(proc, sock)
    return _result(m, 0, 0)


def _result(m: Measured, shards: int, replicas: int) -> dict[str, Any]:
    rps = m.matches / m.seconds if m.seconds else 0.0
    return {"shards": shards, "replicas": replicas, "match_rps": rps,
            "match_rps_per_core": rps / CORES, "match_us_p50": pct(m.match_us, 50),
            "match_us_p99": pct(m.match_us, 99), "write_us_p50": pct(m.write_us, 50),
            "write_us_p99": pct(m.write_us, 99), "writes": len(m.write_us),
            "lag_seq_p50": pct([float(x) for x in m.lag], 50),
            "lag_seq_p99": pct([float(x) for x in m.lag], 99),
            "lag_ms_p50": pct(m.lag_ms, 50), "lag_ms_p99": pct(m.lag_ms, 99)}


def catch_up(base: Path, blocks: int) -> dict[str, Any]:
    """Fill one shard with `blocks` blocks, then time a new replica's start (spawn to
    its first answer): first with no checkpoint anywhere (it replays the whole log),
    then from a checkpoint the first replica publishes once restarted with
    checkpoints on."""
    off, on = base / "no-checkpoints.toml", base / "checkpoints.toml"
    off.write_text("[cluster]\ncheckpoint_interval_s = 0\n")
    on.write_text("[cluster]\ncheckpoint_interval_s = 1.0\n")
    lc = LocalCluster(base / f"catchup-{blocks}", 3, 1, 1, config=off)
    lc.start()
    try:
        assert lc.nats is not None
        urls = lc.nats.urls
        fill_s = asyncio.run(_fill_blocks(urls, blocks))
        out: dict[str, Any] = {"blocks": blocks, "fill_s": fill_s}
        out["catch_up_s"] = _join(lc, "whole-log")
        lc.config = on  # the first replica restarts publishing checkpoints
        lc.kill(0)
        lc.restart(0)
        asyncio.run(_published(urls, "s0", PUBLISH_TIMEOUT_S))
        out["catch_up_from_checkpoint_s"] = _join(lc, "from-checkpoint")
        return out
    finally:
        lc.stop()


async def _published(urls: list[str], shard: str, timeout_s: float) -> None:
    """Return once `shard` has a published checkpoint."""
    nc = await log.connect(urls)
    try:
        js = nc.jetstream(timeout=5)
        deadline = time.monotonic() + timeout_s
        while True:
            # the store is being created; a JetStream call slow on a loaded host: ask again
            with contextlib.suppress(Unavailable, TimeoutError):
                if await checkpoints.newest(js, shard) is not None:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint was published in {timeout_s:g} s")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def _fill_blocks(urls: list[str], blocks: int) -> float:
    c = await ClusterClient.open(urls, timeout=120)
    rng = np.random.default_rng(blocks)
    sem = asyncio.Semaphore(8)
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        async with sem:
            await c.insert(tokens=rng.integers(0, 2**32, 64 * BT).tolist(), meta=i)

    try:
        await asyncio.gather(*(one(i) for i in range(blocks // 64)))
    finally:
        await c.close()
    return time.perf_counter() - t0


def _join(lc: LocalCluster, name: str) -> float:
    """A new replica of shard s0 on an empty data directory: seconds to serving."""
    first = lc.procs[0]
    lc.procs.append(ReplicaProc("s0", name, lc.directory / name,
                                first.socket.with_name(f"{name}.sock"),
                                lc.directory / f"{name}.log"))
    t0 = time.perf_counter()
    lc.restart(len(lc.procs) - 1, timeout_s=CATCH_UP_TIMEOUT_S)
    return time.perf_counter() - t0


def skew(workload: str, counts: tuple[int, ...] = (2, 4, 8), scale: int = 1,
         single: str = "index") -> dict[str, Any]:
    """How `workload`'s requests spread over 2, 4 and 8 shards, and what the shards
    write: the heads rule over real indexes in one process (`tools.bench.shard_sim`;
    each request counted on the shard it is sent to), its summed `new_blocks` over a
    single index's (`write_amplification`), and block 0's share under the version 1
    rule (`block0_max_share`)."""
    from sarpd.cluster.route import first_block
    from sarpd.core import shard_of
    from tools.bench.shard_sim import SimCluster, distinct_blocks, replay, single_index
    from tools.bench.workloads import get_workload

    heads = [first_block({"ns": t.ns, "hashes": [int(t.prompt[0])]}, BT)
             for t in get_workload(workload, scale).turns() if len(t.prompt)]
    if single == "index":
        requests, single_new = replay(None, single_index(), get_workload(workload, scale))
    else:  # the same count without the index (tools.bench.shard_sim.distinct_blocks)
        requests, single_new = distinct_blocks(get_workload(workload, scale))
    out: dict[str, Any] = {"workload": workload, "scale": scale, "rule": "heads",
                           "single": single,
                           "requests": requests, "single_new_blocks": single_new}
    for n in counts:
        before = [0] * n
        for head in heads:
            assert head is not None  # one block given
            before[shard_of(head, n) or 0] += 1
        sim = SimCluster(n)
        replay(sim, None, get_workload(workload, scale))
        shares = [c / requests for c in sim.requests]
        out[str(n)] = {"shares": shares, "max_share": max(shares),
                       "write_amplification": sum(sim.new_blocks) / max(1, single_new),
                       "new_blocks": sim.new_blocks, "splits": len(sim.smap.splits),
                       "block0_max_share": max(before) / max(1, len(heads))}
    return out


EXACT_FIELDS = ("blocks", "meta", "matched_blocks", "removed")  # what a router reads


def exact(base: Path, workload: str, counts: tuple[int, ...] = (2, 4), scale: int = 1,
          ) -> list[dict[str, Any]]:
    """`workload`'s requests (`tools.bench.shard_sim.requests`: match each prompt,
    insert each sequence) through a single sarpd and through a cluster of the heads
    rule per shard count (real processes: 1 NATS node, one replica per shard), every
    answer compared (`EXACT_FIELDS`: a match's blocks and metas, an insert's blocks
    and matched blocks; an error's code). One row per shard count."""
    from tools.bench.shard_sim import requests
    from tools.bench.workloads import get_workload
    reqs = list(requests(get_workload(workload, scale)))
    proc, sock = start_daemon(base / f"exact-single-{_slug(workload)}", sync="always")
    try:
        want = asyncio.run(_answers(lambda: Client.connect(sock), reqs))
    finally:
        stop_daemon(proc, sock)
    rows = []
    for n in counts:
        with local_sarp_cluster(base / f"exact-{_slug(workload)}-{n}", nats_nodes=1,
                                replicas=1, shards=n, rule="heads") as lc:
            assert lc.nats is not None
            urls = lc.nats.urls
            got = asyncio.run(_answers(partial(ClusterClient.open, urls), reqs))
            status = asyncio.run(_status(urls))
        differ = [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b]
        rows.append({"workload": workload, "shards": n, "answers": len(got),
                     "answers_differ": len(differ), "first_differ": differ[0] if differ else None,
                     "splits": status["splits"], "placements": status["placements"]})
    return rows


async def _answers(opener: Any, reqs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    c = await opener()
    out = []
    try:
        for op, fields in reqs:
            try:
                got = await c.request(op, **fields)
                out.append({k: got[k] for k in EXACT_FIELDS if k in got})
            except SarpError as exc:
                out.append({"error": exc.code})
    finally:
        await c.close()
    return out


async def _status(urls: list[str]) -> dict[str, Any]:
    c = await ClusterClient.open(urls)
    try:
        return await c.cluster_status()
    finally:
        await c.close()


def _slug(workload: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in workload)[-40:]


@click.command()
@click.option("--configs", default="1x1,1x2,1x3,2x1,2x2,2x3", show_default=True,
              help="Comma-separated SHARDSxREPLICAS configurations.")
@click.option("--sequences", "n", default=400, show_default=True,
              help="Sequences filled per configuration (one write each).")
@click.option("--clients", default=8, show_default=True, help="Concurrent matchers.")
@click.option("--seconds", default=5.0, show_default=True, help="Matching time per run.")
@click.option("--catch-up", "catch_up_blocks", default="",
              help="Comma-separated history sizes (blocks) for the new-replica catch-up "
              "runs, e.g. 1000000 (10000000 is a long run).")
@click.option("--skew", "skew_workloads", default="",
              help="Comma-separated workloads (or trace:FILE@B) whose spread over 2, 4 and "
              "8 shards is reported.")
@click.option("--scale", default=1, show_default=True,
              help="Workload scale for --skew and --exact (sessions grow with it: agent has "
              "6 at 1).")
@click.option("--single", "single_count", type=click.Choice(["index", "distinct"]),
              default="index",
              show_default=True, help="--skew's single-index figure: a real index's "
              "new_blocks, or its count without one (the distinct blocks inserted: the "
              "same for these insert-only replays, and linear in time).")
@click.option("--exact", "exact_workloads", default="",
              help="Comma-separated workloads (or trace:FILE@B) run through a single sarpd "
              "and through clusters of the heads rule (--shards), every answer compared.")
@click.option("--shards", "exact_shards", default="2,4", show_default=True,
              help="Comma-separated shard counts for --exact.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Where the clusters live (default: a temp directory).")
@click.option("--json", "json_out", metavar="FILE|-", default=None,
              help="Write the results as one JSON object to FILE, or stdout with '-'.")
def main(configs: str, n: int, clients: int, seconds: float, catch_up_blocks: str,
         skew_workloads: str, scale: int, single_count: str, exact_workloads: str,
         exact_shards: str,
         directory: Path | None, json_out: str | None) -> None:
    """Match throughput and p99 against replicas and shards, write latency and
    replication lag, and a new replica's catch-up time, against a single sarpd in the
    same run. See the module docstring for what each figure means here."""
    import tempfile

    base = directory or Path(tempfile.mkdtemp(prefix="sarp-bench-cluster-"))
    results = [run_single(base, n, clients, seconds)]
    click.echo(_line(results[0]), err=True)
    for spec in (c for c in configs.split(",") if c):
        shards, replicas = (int(x) for x in spec.split("x"))
        results.append(run_cluster(base, shards, replicas, n, clients, seconds))
        click.echo(_line(results[-1]), err=True)
    catch = [catch_up(base, int(b)) for b in catch_up_blocks.split(",") if b]
    spread = [skew(w, scale=scale, single=single_count)
              for w in skew_workloads.split(",") if w]
    counts = tuple(int(x) for x in exact_shards.split(",") if x)
    same = [row for w in exact_workloads.split(",") if w
            for row in exact(base, w, counts, scale)]
    for row in same:
        click.echo(f"{row['workload']}: {row['shards']} shards, {row['answers']} answers, "
                   f"{row['answers_differ']} differ from a single sarpd "
                   f"({row['splits']} splits)", err=True)
    for sk in spread:
        click.echo(f"{sk['workload']}: max shard share " + ", ".join(
            f"{k} shards {v['max_share']:.3f} (block 0: {v['block0_max_share']:.2f}, "
            f"written {v['write_amplification']:.3f}x)" for k, v in sk.items()
            if k.isdigit()), err=True)
    for c in catch:
        click.echo(json.dumps(c), err=True)
    single = results[0]
    doc = {"benchmark": "cluster", "cores": CORES, "sequences": n, "clients": clients,
           "seconds": seconds, "results": results, "catch_up": catch, "skew": spread,
           "exact": same,
           "vs_single": [{"shards": r["shards"], "replicas": r["replicas"],
                          "match_rps_x": r["match_rps"] / single["match_rps"],
                          "write_us_p50_x": r["write_us_p50"] / single["write_us_p50"]}
                         for r in results[1:]]}
    write_json(doc, json_out)


def _line(r: dict[str, Any]) -> str:
    what = "single sarpd" if not r["shards"] else f"{r['shards']}x{r['replicas']}"
    return (f"{what:>12}: match {r['match_rps']:8,.0f}/s p99 {r['match_us_p99']:8,.0f} us; "
            f"write p50 {r['write_us_p50']:7,.0f} us p99 {r['write_us_p99']:7,.0f} us; "
            f"lag p99 {r['lag_seq_p99']:.0f} seqs, {r['lag_ms_p99']:.1f} ms")


if __name__ == "__main__":
    main()
