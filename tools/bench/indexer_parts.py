"""The indexer benchmark's parts (tools.bench.indexer_api): its workload (engines'
conversations on shared system prompts, as vLLM's KV events, and what each engine
holds); its HTTP client (pre-encoded requests on keep-alive connections, answers
read by Content-Length: a raw asyncio protocol, so that the client takes little CPU
from the servers it measures; `Http` for one-at-a-time calls, by http.client); the
two indexers as processes (spawned, killed, their RSS), the markers a poller waits
for, and the query load's clients."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench import vllm_schema as vs
from tools.bench.spawn import start_daemon
from tools.bench.vllm_publisher import Publisher

BLOCK = 16
UP_TIMEOUT_S = 60.0
DRAIN_S = 30.0  # how long markers are awaited after the last publish
POLL_S = 0.002
MODEL = "bench"
VOCAB = 50_000  # content tokens are below it; marker tokens above
PROMPTS = 4
MAX_OWN = 96  # a conversation's own blocks at most (with its prompt: <= 128 blocks)
FILL_BATCH = 4  # conversations per engine batch in the fill
MASK64 = (1 << 64) - 1
Answer = tuple[int, Any]  # (HTTP status, parsed JSON body)


# ---------------------------------------------------------------------- the workload

def chain(parent: int, tokens: Sequence[int]) -> list[int]:
    """Block hashes of `tokens` after the block hashed `parent`: each hashes its
    parent's and its own tokens (blake2b, 64 bits), as vLLM chains its block hashes."""
    out = []
    for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
        data = parent.to_bytes(8, "little") + np.asarray(tokens[i:i + BLOCK], "<u4").tobytes()
        parent = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        out.append(parent)
    return out


@dataclass
class Conversation:
    engine: int
    prompt: int
    tokens: list[int] = field(default_factory=list)  # its own tokens, every turn so far
    hashes: list[int] = field(default_factory=list)  # their blocks' engine hashes
    held: int = 0  # leading own blocks the engine holds (evictions take the tail)
    extra: list[int] = field(default_factory=list)  # a new turn's tokens, for queries


class Workload:
    """Engines' KV events (vllm_schema structs) and the engines' state they leave
    (sans-I/O). Each engine draws from a generator of its own: what it publishes does
    not depend on how batches of different engines interleave."""

    def __init__(self, engines: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.engines = engines
        self.prompt_tokens = [_tokens(rng, int(rng.integers(8, 33))) for _ in range(PROMPTS)]
        self.prompt_hashes = [chain(seed & MASK64, t) for t in self.prompt_tokens]
        self.rngs = [np.random.default_rng([seed, e + 1]) for e in range(engines)]
        self.prompts_held: list[set[int]] = [set() for _ in range(engines)]
        self.convs: list[Conversation] = []
        self.mine: list[list[Conversation]] = [[] for _ in range(engines)]
        self.touched: list[Conversation] = []  # each batch's conversation, in order
        self.markers = 0

    def fill(self, sequences: int) -> list[list[list[vs.KVCacheEvent]]]:
        """The first turns of `sequences` conversations (dealt round-robin over the
        engines): per engine, its batches, `FILL_BATCH` conversations each."""
        out: list[list[list[vs.KVCacheEvent]]] = [[] for _ in range(self.engines)]
        for i in range(sequences):
            e = i % self.engines
            if (i // self.engines) % FILL_BATCH == 0:
                out[e].append([])
            out[e][-1] += self.new_conversation(e)
        return out

    def new_conversation(self, engine: int) -> list[vs.KVCacheEvent]:
        rng = self.rngs[engine]
        p = int(rng.integers(PROMPTS))
        events: list[vs.KVCacheEvent] = []
        if p not in self.prompts_held[engine]:  # the engine computes the prompt once
            self.prompts_held[engine].add(p)
            events.append(vs.block_stored(self.prompt_hashes[p], None, self.prompt_tokens[p],
                                          BLOCK))
        c = Conversation(engine, p)
        self.convs.append(c)
        self.mine[engine].append(c)
        return events + self._turn(c, int(rng.integers(4, 17)))

    def _turn(self, c: Conversation, blocks: int) -> list[vs.KVCacheEvent]:
        """A next turn of `blocks` new blocks; the engine stores them after the
        conversation's blocks it had evicted (the turn's prompt holds those too)."""
        rng = self.rngs[c.engine]
        new = _tokens(rng, blocks)
        c.hashes += chain(c.hashes[-1] if c.hashes else self.prompt_hashes[c.prompt][-1], new)
        c.tokens += new
        c.extra = _tokens(rng, 1) + _tokens(rng, 1)[:5]  # the next user message's start
        first, c.held = c.held, len(c.hashes)
        self.touched.append(c)
        parent = c.hashes[first - 1] if first else self.prompt_hashes[c.prompt][-1]
        return [vs.block_stored(c.hashes[first:], parent, c.tokens[first * BLOCK:], BLOCK)]

    def step(self, engine: int) -> list[vs.KVCacheEvent]:
        """One batch of the steady phase: a next turn (45 %), a tail eviction (40 %),
        or a new conversation (the rest, and when the draw finds nothing to do)."""
        rng = self.rngs[engine]
        r = float(rng.random())
        mine = self.mine[engine]
        if mine and r < 0.85:
            c = mine[int(rng.integers(len(mine)))]
            if r < 0.45 and len(c.hashes) < MAX_OWN:
                return self._turn(c, int(rng.integers(2, 9)))
            if r >= 0.45 and c.held:
                k = int(rng.integers(1, min(c.held, 8) + 1))
                c.held -= k
                self.touched.append(c)
                return [vs.block_removed(c.hashes[c.held:c.held + k])]
        return self.new_conversation(engine)

    def marker(self) -> tuple[vs.BlockStored, list[int]]:
        """A store of one block of tokens no other block has, and those tokens."""
        self.markers += 1
        tokens = list(range(VOCAB + BLOCK * self.markers, VOCAB + BLOCK * (self.markers + 1)))
        return vs.block_stored(chain(0, tokens), None, tokens, BLOCK), tokens

    def recent(self, n: int) -> list[Conversation]:
        """The `n` conversations the engines changed last (newest first)."""
        out: dict[int, Conversation] = {}
        for c in reversed(self.touched):
            if len(out) == n:
                break
            out.setdefault(id(c), c)
        return list(out.values())

    def query_tokens(self, c: Conversation) -> list[int]:
        """A router's question for the conversation's next turn: its prompt, every
        turn so far, the new message (not cached anywhere)."""
        return self.prompt_tokens[c.prompt] + c.tokens + c.extra

    def expected(self, c: Conversation) -> dict[str, Any]:
        """The answer to `query_tokens(c)` the engines' state calls for (docs/HTTP.md:
        tokens; everything on the device tier, dp rank 0)."""
        reach = {}
        for e in range(self.engines):
            if c.prompt in self.prompts_held[e]:
                own = c.held if e == c.engine else 0
                reach[str(instance_id(e))] = BLOCK * (len(self.prompt_hashes[c.prompt]) + own)
        return {"scores": {i: {"0": n} for i, n in reach.items()}, "frequencies": [],
                "instances": {i: {"longest_matched": n, "gpu": n, "dp": {"0": n}, "cpu": n,
                                  "disk": n} for i, n in reach.items()}}

    def blocks_held(self) -> int:
        """(engine, block) pairs the engines hold (markers left out)."""
        prompts = sum(len(self.prompt_hashes[p]) for held in self.prompts_held for p in held)
        return prompts + sum(c.held for c in self.convs)


def _tokens(rng: np.random.Generator, blocks: int) -> list[int]:
    return [int(t) for t in rng.integers(1, VOCAB, blocks * BLOCK)]


def instance_id(engine: int) -> int:
    return engine + 1


def query_doc(tokens: Sequence[int]) -> dict[str, Any]:
    return {"token_ids": list(tokens), "model_name": MODEL}


# ---------------------------------------------------------------------- HTTP clients

def request_bytes(port: int, path: str, doc: Any) -> bytes:
    """A whole HTTP/1.1 POST of `doc` as JSON, ready to write."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def parse_answer(buf: bytearray) -> tuple[int, bytes] | None:
    """The first whole answer in `buf` (taken out of it), or None if it is not all in."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is None:
        raise ConnectionError(f"an answer without Content-Length: {lines[0]!r}")
    total = end + 4 + length
    if len(buf) < total:
        return None
    status, body = int(lines[0].split(b" ", 2)[1]), bytes(buf[end + 4:total])
    del buf[:total]
    return status, body


class HttpConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time: a pre-encoded
    request out, (status, body) in."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        try:
            got = parse_answer(self.buf)
        except ConnectionError as exc:
            self.waiter.set_exception(exc)
            return
        if got is not None:
            self.waiter.set_result(got)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"the server closed the connection "
                                                      f"({exc})"))

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(port: int) -> HttpConn:
    conn = HttpConn()
    await asyncio.get_running_loop().create_connection(lambda: conn, "127.0.0.1", port)
    return conn


class Http:
    """A blocking keep-alive JSON client of one server, for the control requests and
    the restart's probes; any failure closes the connection and raises ConnectionError
    (the next request opens a new one)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, doc: Any = None) -> Answer:
        data = None if doc is None else json.dumps(doc, separators=(",", ":")).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            text = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ConnectionError(f"{method} {path} on port {self.port}: {exc}") from exc
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text.decode(errors="replace")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ---------------------------------------------------------------------- the indexers

@dataclass
class Indexer:
    """One indexer process: how to spawn it (the same way every time), its port."""

    name: str
    port: int
    launch: Callable[[], subprocess.Popen[bytes]]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> float:
        """Start the process; the perf_counter() just before."""
        t0 = time.perf_counter()
        self.proc = self.launch()
        return t0

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def rss(self) -> tuple[int, int]:
        """VmRSS and VmHWM (its peak) of the process, bytes."""
        assert self.proc is not None
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def wait_up(self, timeout: float = UP_TIMEOUT_S) -> None:
        """Until GET /health answers 200 (RuntimeError if the process exits)."""
        http_ = Http(self.port, timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: "
                                       f"{self.log_tail()}")
                with contextlib.suppress(ConnectionError):
                    if http_.request("GET", "/health")[0] == 200:
                        return
                time.sleep(0.05)
        finally:
            http_.close()
        raise RuntimeError(f"{self.name}: no /health in {timeout:g} s: {self.log_tail()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sarp_indexer(base: Path) -> Indexer:
    """sarpd on `base`/data (rocksdb, sync always), its socket and log in `base`."""
    port = free_port()
    sock = base / "sarpd.sock"

    def launch() -> subprocess.Popen[bytes]:
        proc, _ = start_daemon(base / "data", sync="always", sock=sock, wait=False,
                               extra=["--http-port", str(port)])
        return proc

    return Indexer("sarp", port, launch, base / "sarpd.log")


def dynamo_indexer(base: Path, threads: int) -> Indexer:
    """`python -m dynamo.indexer` from an empty working directory (a `dynamo/` folder
    there would shadow the wheel), without PYTHONPATH (nor this checkout on it)."""
    port = free_port()
    cwd = base / "dynamo-cwd"
    cwd.mkdir()
    log = base / "dynamo.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_COLOR"] = "1"
    argv = [sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads",
            str(threads)]

    def launch() -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    return Indexer("dynamo", port, launch, log)


def register(ixs: Sequence[Indexer], pubs: Sequence[Publisher], first: int = 0) -> None:
    """Each engine on each indexer (instance `instance_id(e)`, engines numbered from
    `first`, with its replay endpoint), each subscription seen by the publisher before
    the next registration."""
    for e, pub in enumerate(pubs, first):
        for ix in ixs:
            pub.subscribed.clear()
            http_ = Http(ix.port)
            status, body = http_.request("POST", "/register", {
                "instance_id": instance_id(e), "endpoint": pub.endpoint,
                "replay_endpoint": pub.replay_endpoint, "model_name": MODEL,
                "block_size": BLOCK})
            http_.close()
            if status != 201:
                raise RuntimeError(f"{ix.name}: /register answered {status}: {body}")
            if not pub.subscribed.wait(30):
                raise RuntimeError(f"{ix.name} never subscribed to engine {e}")
    time.sleep(0.05)  # the last subscription reaches the XPUB's filter


# ---------------------------------------------------------------------- markers

@dataclass
class Marker:
    engine: int
    tokens: list[int]
    published: float  # perf_counter() at publish()
    seen: dict[str, float] = field(default_factory=dict)  # index -> perf_counter()


async def watch(ix: Indexer, markers: list[Marker], done: asyncio.Event) -> None:
    """Ask `ix` for the markers (appended to `markers` as they are published) until
    each one's engine shows in the answer; stop once `done` is set and every marker was
    seen, or `DRAIN_S` after `done`. An engine's batches are applied in order, so only
    its oldest unseen marker is asked for (then its next ones, as long as they show):
    the probing does not grow with the lag it measures. Each engine has a prober of
    its own (a connection, one query in flight), as each engine's router would: a
    marker's lag is its own, not also the answers to other engines' markers pending
    at the same time (the fleet's last batches are one marker per engine, published
    together; asked in turn over one connection, `watch_serial`, the sixteenth
    waited for fifteen answers first)."""
    pending: dict[int, list[Marker]] = {}  # by engine, oldest first
    probers: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    taken = 0
    drain_end = None
    try:
        while True:
            for m in markers[taken:]:
                if m.engine not in pending:
                    pending[m.engine] = []
                    probers.append(asyncio.ensure_future(_probe(ix, pending[m.engine], stop)))
                pending[m.engine].append(m)
            taken = len(markers)
            failed = next((t for t in probers if t.done() and t.exception()), None)
            if failed is not None:
                failed.result()  # raises: the watch fails as a prober did
            if done.is_set():
                drain_end = drain_end or time.perf_counter() + DRAIN_S
                left = any(pending.values())
                if (not left and taken == len(markers)) or time.perf_counter() > drain_end:
                    return
            await asyncio.sleep(POLL_S)
    finally:
        stop.set()
        await asyncio.gather(*probers)


async def _probe(ix: Indexer, queue: list[Marker], stop: asyncio.Event) -> None:
    """One engine's prober (`watch`): its oldest unseen marker, every POLL_S."""
    conn = await connect(ix.port)
    try:
        while not stop.is_set():
            await _ask(ix, conn, queue)
            await asyncio.sleep(POLL_S)
    finally:
        conn.close()


async def _ask(ix: Indexer, conn: HttpConn, queue: list[Marker]) -> None:
    """Ask for one engine's oldest unseen marker, then its next ones while they show
    (an engine's batches apply in order); each seen one leaves `queue`."""
    while queue:
        m = queue[0]
        status, body = await conn.send(request_bytes(ix.port, "/query", query_doc(m.tokens)))
        if status != 200 or str(instance_id(m.engine)) not in json.loads(body)["instances"]:
            return
        m.seen[ix.name] = time.perf_counter()
        queue.pop(0)


async def watch_serial(ix: Indexer, markers: list[Marker], done: asyncio.Event) -> None:
    """Ask `ix` for the markers (appended to `markers` as they are published) until
    each one's engine shows in the answer; stop once `done` is set and every marker was
    seen, or `DRAIN_S` after `done`. An engine's batches are applied in order, so only
    its oldest unseen marker is asked for in a round (then its next ones, as long as
    they show): the probing does not grow with the lag it measures. One connection
    asks for every engine's in turn (the second session's method, `--watch serial`):
    markers pending at once wait for each other's answers too."""
    conn = await connect(ix.port)
    pending: dict[int, list[Marker]] = {}  # by engine, oldest first
    taken = 0
    drain_end = None
    try:
        while True:
            for m in markers[taken:]:
                pending.setdefault(m.engine, []).append(m)
            taken = len(markers)
            for queue in pending.values():
                await _ask(ix, conn, queue)
            left = any(pending.values())
            if done.is_set():
                drain_end = drain_end or time.perf_counter() + DRAIN_S
                if (not left and taken == len(markers)) or time.perf_counter() > drain_end:
                    return
            await asyncio.sleep(POLL_S)
    finally:
        conn.close()


Watch = Callable[[Indexer, list[Marker], asyncio.Event], Awaitable[None]]
WATCHES: dict[str, Watch] = {"per-engine": watch, "serial": watch_serial}  # --watch


# ---------------------------------------------------------------------- measurements

def pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if len(xs) else None


@dataclass
class Load:
    lat_us: list[float] = field(default_factory=list)
    errors: int = 0
    empty: int = 0
    seconds: float = 0.0


async def drive(conns: Sequence[HttpConn], requests: Sequence[bytes], seconds: float,
                out: Load, seed: int) -> None:
    """Each of `conns` sends one random request of `requests` after the other, for
    `seconds`; into `out`."""
    async def client(k: int, end: float) -> None:
        rng = random.Random(seed * 1000 + k)
        while time.perf_counter() < end:
            raw = requests[rng.randrange(len(requests))]
            t0 = time.perf_counter()
            status, body = await conns[k].send(raw)
            out.lat_us.append((time.perf_counter() - t0) * 1e6)
            if status != 200:
                out.errors += 1
            elif b'"instances":{}' in body:
                out.empty += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k, t0 + seconds) for k in range(len(conns))))
    out.seconds += time.perf_counter() - t0
