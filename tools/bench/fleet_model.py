"""The fleet benchmark's engines: N simulated serving engines with vLLM's prefix cache,
replayed from a Mooncake-format trace into one timeline of routing queries and KV
events (tools/bench/fleet.py drives the indexes with it).

Requests. Every trace row is one request (tools/bench/traces.py reads the file and
numbers its sessions: `session_id`, else prefix continuation). Sessions go to engines
round-robin in order of first appearance (`worker = session % N`): a session stays on
one engine, as a sticky router keeps it, and no KV-aware router is needed to place
them. A request's blocks are its whole blocks of `block_tokens` tokens (default 16,
vLLM's default block size; a multiple of 16 dividing the trace's block size): the
trace's coarse ids expanded to 16-token blocks as traces.py does, then `k =
block_tokens / 16` of them folded into one engine block. Each block has a content
hash (`locals`, what Dynamo's radix tree keys on: its `tokens_hash`) and a
prefix-chained id (`hashes`, the engine's block hash: BlockStored/BlockRemoved name
it, and sarp and redis index it).

Engine (`Engine`, vLLM v1's BlockPool): G GPU blocks, a hash -> cached block map and
a free queue. A request is admitted at its arrival, or when an earlier request of the
same engine was admitted later (FIFO), or when enough blocks are free. On admission
its longest cached prefix is a hit: those blocks are touched (their refcount goes up
and a free one leaves the free queue); each further block is taken from the head of
the free queue: first the blocks that never held anything, then the least recently
freed cached block, which is evicted (its hash leaves the map: BlockRemoved); the new
blocks are then cached (BlockStored, its parent the last hit block, or none). The
request holds its blocks for `output_length * tpot_ms` (decode; prefill is taken as
instant), then frees them tail first (vLLM frees in reverse order so that a
sequence's tail is evicted before its head); a freed block stays cached until
evicted. A request longer than G blocks caches its first G. Output blocks are not
modelled: the trace has no ids for them (the next turn's prompt holds them).

Events: one `Batch` (an engine's EventBatch) per admitted request that changed the
cache: a `Removed` of every block its allocation evicted (vLLM sends one
BlockRemoved per block; every index applies a list, so they are coalesced), then a
`Stored` of its new blocks. The `Timeline` merges every engine's batches and every
request's routing `Query` (its block hashes, at its arrival, BEFORE it is served) by
time; at equal times queries come first (as in Dynamo's mooncake_bench), then
batches in the order the engines made them (so each engine's own are in order).

Truth (`HolderMasks`): the timeline replayed through a map block -> bit mask of the
engines caching it, so each query carries the engines' true runs (a worker's run:
the query's blocks from position 0 it caches, to its first miss) at that moment.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tools.bench.api import BLOCK_TOKENS
from tools.bench.chains import U64, chain_segments, mix64, root_state
from tools.bench.traces import Row, SessionDeriver, fine_content, read_rows

U64s = npt.NDArray[np.uint64]
I32s = npt.NDArray[np.int32]

TPOT_MS = 20.0  # decode time per output token
_FLEET_TAG = 0x666C656574  # salts the chain root of the fleet's block ids
_FOLD_SALT = U64(0x5EEDF00DB10C4B1D)
_GOLDEN = U64(0x9E3779B97F4A7C15)
_ROWS_PER_BATCH = 512


@dataclass(frozen=True, slots=True, eq=False)
class FleetRequest:
    """One trace row as a request of one engine."""

    index: int  # arrival order
    t_ms: float
    session: int
    worker: int
    hashes: U64s  # chained block ids, whole blocks of block_tokens
    locals: U64s  # each block's content hash (Dynamo's tokens_hash)
    output_tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class Stored:
    """BlockStored: new blocks after `parent` (None: from position 0), in order."""

    hashes: U64s
    parent: int | None
    locals: U64s


@dataclass(frozen=True, slots=True, eq=False)
class Removed:
    """BlockRemoved: evicted blocks."""

    hashes: U64s


Event = Stored | Removed


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """One EventBatch of one engine, made at `t_ms` (trace time)."""

    worker: int
    request: int  # the request whose admission made it
    t_ms: float
    events: tuple[Event, ...]

    @property
    def blocks(self) -> int:
        return sum(len(e.hashes) for e in self.events)


@dataclass(frozen=True, slots=True, eq=False)
class Query:
    """A request's routing query at its arrival, and the engines' true runs then."""

    request: int
    t_ms: float
    hashes: U64s
    locals: U64s
    truth: I32s  # run of every worker (index = worker id)


Entry = Query | Batch


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    batches: int
    stored_events: int
    removed_events: int
    query_blocks: int
    stored_blocks: int
    removed_blocks: int

    @property
    def event_blocks(self) -> int:
        return self.stored_blocks + self.removed_blocks

    @property
    def block_ops(self) -> int:
        """Dynamo's count: request hashes + hashes in BlockStored and BlockRemoved."""
        return self.query_blocks + self.event_blocks


@dataclass(frozen=True, slots=True, eq=False)
class Timeline:
    workers: int
    gpu_blocks: int
    entries: tuple[Entry, ...]
    totals: Totals

    @property
    def span_ms(self) -> float:
        return self.entries[-1].t_ms - self.entries[0].t_ms if self.entries else 0.0

    def queries(self) -> Iterator[Query]:
        return (e for e in self.entries if isinstance(e, Query))


# ------------------------------------------------------------------------ the engine


class Engine:
    """vLLM's prefix cache of one engine (module doc). `serve` admits one request."""

    __slots__ = ("_seq", "blank", "capacity", "clock", "free", "ref", "running", "tpot_ms",
                 "worker")

    def __init__(self, worker: int, capacity: int, tpot_ms: float = TPOT_MS) -> None:
        if capacity < 1:
            raise ValueError(f"engine {worker}: capacity must be >= 1 block, got {capacity}")
        self.worker = worker
        self.capacity = capacity
        self.tpot_ms = tpot_ms
        self.ref: dict[int, int] = {}  # cached hash -> requests using it (0: in `free`)
        self.free: OrderedDict[int, None] = OrderedDict()  # cached, unused: LRU first
        self.blank = capacity  # free blocks holding nothing (the free queue's head)
        self.running: list[tuple[float, int, tuple[int, ...]]] = []  # (finish, seq, blocks)
        self.clock = 0.0  # admission time of the newest request (FIFO)
        self._seq = itertools.count()

    @property
    def in_use(self) -> int:
        return self.capacity - self.blank - len(self.free)

    def cached(self) -> set[int]:
        return set(self.ref)

    def hits(self, hashes: Sequence[int]) -> int:
        """Length of the longest cached prefix of `hashes`."""
        ref = self.ref
        return next((i for i, h in enumerate(hashes) if h not in ref), len(hashes))

    def release_until(self, t_ms: float) -> None:
        """Finish every running request whose finish time is <= t_ms."""
        while self.running and self.running[0][0] <= t_ms:
            self._finish_next()

    def finish_all(self) -> None:
        while self.running:
            self._finish_next()

    def _finish_next(self) -> None:
        _, _, blocks = heapq.heappop(self.running)
        for h in reversed(blocks):  # tail first: the tail is evicted first
            n = self.ref[h] - 1
            self.ref[h] = n
            if n == 0:
                self.free[h] = None

    def _available(self, hashes: Sequence[int], hits: int) -> int:
        """Blocks a request may allocate once its hits leave the free queue."""
        free_hits = sum(1 for h in hashes[:hits] if self.ref[h] == 0)
        return self.blank + len(self.free) - free_hits

    def serve(self, req: FleetRequest) -> Batch | None:
        """Admit `req` (waiting for blocks if need be), touch its hits, allocate and cache
        the rest; the events this made (None: it hit every block)."""
        hashes = req.hashes[: self.capacity].tolist()
        t = max(req.t_ms, self.clock)
        self.release_until(t)
        k = self.hits(hashes)
        while len(hashes) - k > self._available(hashes, k):
            t = max(t, self.running[0][0])
            self._finish_next()
        self.clock = t
        for h in hashes[:k]:
            if self.ref[h] == 0:
                del self.free[h]
            self.ref[h] += 1
        evicted = self._allocate(len(hashes) - k)
        for h in hashes[k:]:
            self.ref[h] = 1
        finish = t + max(req.output_tokens, 1) * self.tpot_ms
        heapq.heappush(self.running, (finish, next(self._seq), tuple(hashes)))
        events: list[Event] = []
        if evicted:
            events.append(Removed(np.array(evicted, dtype=np.uint64)))
        if k < len(hashes):
            events.append(Stored(req.hashes[k: len(hashes)], hashes[k - 1] if k else None,
                                 req.locals[k: len(hashes)]))
        return Batch(self.worker, req.index, t, tuple(events)) if events else None

    def _allocate(self, n: int) -> list[int]:
        """Take n blocks from the free queue's head; the hashes evicted on the way."""
        blank = min(n, self.blank)
        self.blank -= blank
        evicted = []
        for _ in range(n - blank):
            h, _ = self.free.popitem(last=False)
            del self.ref[h]
            evicted.append(h)
        return evicted


# ------------------------------------------------------------------------- the truth


class HolderMasks:
    """Block -> bit mask of the workers caching it, kept from the events."""

    __slots__ = ("masks", "workers")

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.masks: dict[int, int] = {}

    def apply(self, batch: Batch) -> None:
        bit = 1 << batch.worker
        masks = self.masks
        for ev in batch.events:
            if isinstance(ev, Stored):
                for h in ev.hashes.tolist():
                    masks[h] = masks.get(h, 0) | bit
            else:
                for h in ev.hashes.tolist():
                    m = masks.get(h, 0) & ~bit
                    if m:
                        masks[h] = m
                    else:
                        masks.pop(h, None)

    def runs(self, hashes: Iterable[int]) -> I32s:
        """Every worker's run on a query: its blocks from position 0 to its first miss."""
        out = np.zeros(self.workers, dtype=np.int32)
        alive = (1 << self.workers) - 1
        n = 0
        for h in hashes:
            m = self.masks.get(h, 0)
            dead = alive & ~m
            if dead:
                for w in _bits(dead):
                    out[w] = n
                alive &= m
                if not alive:
                    return out
            n += 1
        for w in _bits(alive):
            out[w] = n
        return out

    def held(self, worker: int) -> set[int]:
        bit = 1 << worker
        return {h for h, m in self.masks.items() if m & bit}


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def ranked(runs: dict[int, int], k: int) -> list[tuple[int, int]]:
    """The k (worker, run) pairs with the longest runs > 0, ties by smaller worker."""
    return sorted(((w, r) for w, r in runs.items() if r > 0), key=lambda x: (-x[1], x[0]))[:k]


# ---------------------------------------------------------------------- the timeline


def build_timeline(requests: Sequence[FleetRequest], workers: int, gpu_blocks: int,
                   tpot_ms: float = TPOT_MS) -> Timeline:
    """Serve every request on its engine and merge queries and batches (module doc)."""
    engines = [Engine(w, gpu_blocks, tpot_ms) for w in range(workers)]
    keyed: list[tuple[float, int, int, FleetRequest | Batch]] = []
    seq = 0
    for r in sorted(requests, key=lambda r: (r.t_ms, r.index)):
        keyed.append((r.t_ms, 0, r.index, r))
        batch = engines[r.worker].serve(r)
        if batch is not None:
            keyed.append((batch.t_ms, 1, seq, batch))
            seq += 1
    keyed.sort(key=lambda k: k[:3])
    truth = HolderMasks(workers)
    entries: list[Entry] = []
    for _, _, _, item in keyed:
        if isinstance(item, Batch):
            truth.apply(item)
            entries.append(item)
        else:
            entries.append(Query(item.index, item.t_ms, item.hashes, item.locals,
                                 truth.runs(item.hashes.tolist())))
    return Timeline(workers, gpu_blocks, tuple(entries), totals_of(entries))


def totals_of(entries: Sequence[Entry]) -> Totals:
    batches = [e for e in entries if isinstance(e, Batch)]
    events = [ev for b in batches for ev in b.events]
    stored = [ev for ev in events if isinstance(ev, Stored)]
    removed = [ev for ev in events if isinstance(ev, Removed)]
    return Totals(
        requests=len(entries) - len(batches), batches=len(batches),
        stored_events=len(stored), removed_events=len(removed),
        query_blocks=sum(len(e.hashes) for e in entries if isinstance(e, Query)),
        stored_blocks=sum(len(e.hashes) for e in stored),
        removed_blocks=sum(len(e.hashes) for e in removed))


# ------------------------------------------------------------------------- the trace


I64s = npt.NDArray[np.int64]


def fold_blocks(content: U64s, n: I64s, k: int) -> tuple[U64s, I64s]:
    """Fold each row's 16-token content hashes (`n` per row, concatenated) k at a time
    into engine blocks (whole ones only): their content hashes and counts per row."""
    if k == 1:
        return content, n
    whole = n // k
    starts = np.cumsum(n) - n
    local = np.arange(len(content), dtype=np.int64) - np.repeat(starts, n)
    c = content[local < np.repeat(whole * k, n)].reshape(-1, k)
    h = np.full(len(c), _FOLD_SALT, dtype=U64)
    for j in range(k):
        h = mix64(h ^ c[:, j]) + _GOLDEN
    return h, whole


def load_requests(path: str | Path, *, workers: int, trace_block_tokens: int = 512,
                  block_tokens: int = BLOCK_TOKENS, limit: int = 0,
                  seed: int = 0) -> list[FleetRequest]:
    """The first `limit` rows (0: all) of a Mooncake-format trace as fleet requests."""
    if block_tokens % BLOCK_TOKENS or trace_block_tokens % block_tokens:
        raise ValueError(f"block_tokens {block_tokens} must be a multiple of {BLOCK_TOKENS} "
                         f"dividing the trace's block size {trace_block_tokens}")
    rows = read_rows(Path(path), trace_block_tokens)
    if limit:
        rows = itertools.islice(rows, limit)
    sessions = SessionDeriver(trace_block_tokens)
    root = root_state(_FLEET_TAG, seed)
    out: list[FleetRequest] = []
    batch: list[Row] = []
    for row in itertools.chain(rows, [None]):
        if row is not None:
            batch.append(row)
        if batch and (row is None or len(batch) >= _ROWS_PER_BATCH):
            out.extend(_requests(batch, sessions, workers, trace_block_tokens,
                                 block_tokens // BLOCK_TOKENS, root, len(out)))
            batch = []
    return out


def _requests(rows: list[Row], sessions: SessionDeriver, workers: int, trace_block_tokens: int,
              k: int, root: int, first: int) -> Iterator[FleetRequest]:
    content, n = fold_blocks(*fine_content(rows, trace_block_tokens), k)
    ids = chain_segments(content, n, root)
    cuts = np.cumsum(n)[:-1]
    for i, (row, h, c) in enumerate(zip(rows, np.split(ids, cuts), np.split(content, cuts),
                                        strict=True)):
        s = sessions.session(row)
        h.setflags(write=False)
        c.setflags(write=False)
        yield FleetRequest(first + i, row.timestamp, s, s % workers, h, c, row.output_length)
