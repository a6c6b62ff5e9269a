"""The indexer API over HTTP (docs/HTTP.md): Dynamo's standalone KV indexer's endpoints,
served on `http_host:http_port` (sarpd.daemon.api_http) over sarp's index.

    GET  /health        200, empty (liveness, as Dynamo's)
    POST /register      a worker's ZMQ endpoint: a listener inside sarpd applies its events
    POST /unregister    every rank of an instance off; its blocks cleared
    GET  /workers       registered workers, their listeners' status
    POST /query         token ids -> per-instance reach (sarpd.indexer.api)
    POST /query_by_hash Dynamo's per-block hashes -> the same answer
    GET  /dump          every block as Dynamo's stored events (a Dynamo indexer started
                        with --peers at sarpd loads it)
    POST /register_peer, /deregister_peer, GET /peers   the peer list (kept; sarpd
                        itself recovers from its own disk)
    GET  /metrics, /healthz, /readyz   as on `metrics_port` (sarpd.daemon.http)

Requests go through the server's batcher like a socket's (`LocalConn`): a query is one
`match` with `spans`, a listener's batch its inserts and removals. Registrations, each
listener's watermark and the engine-hash maps are kept in `indexer.sqlite` beside the
index (sarpd.daemon.indexer_state), saved as soon as a batch is applied: after a
restart every registered worker is subscribed again and replayed from where it
stopped. Errors are JSON ``{"error": ...}``
with Dynamo's statuses (400 body, 404 unknown, 409 conflict, 413 over a limit, 422 a
field, 503 not ready).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import parse_qs

import msgspec
import numpy as np
import zmq.asyncio

from sarpd import model
from sarpd.daemon.api_http import Handler, Reply, Request, json_error
from sarpd.daemon.http import Readiness, exposition, readiness_answer
from sarpd.daemon.indexer_state import IndexerStore, weight
from sarpd.daemon.listeners import Listener
from sarpd.daemon.local import LocalConn
from sarpd.daemon.server import Server
from sarpd.errors import BadRequest, Busy, Conflict, NotFound, SarpError, TooLarge, Unavailable
from sarpd.events.endpoints import check_endpoint
from sarpd.events.sequence import Stream
from sarpd.indexer import api, hashing
from sarpd.indexer.ingest import Ingest, Logged
from sarpd.indexer.workers import Worker, namespace

__all__ = ["IndexerApi"]

log = logging.getLogger("sarpd.daemon.indexer_api")
REPORT_INTERVAL_S = 1.0  # the listeners' counters to `stats` and /metrics
_STATUS = {BadRequest: 400, api.FieldError: 422, NotFound: 404, Conflict: 409, TooLarge: 413,
           Unavailable: 503, Busy: 503}
_ENCODE = msgspec.json.Encoder().encode  # compact JSON (~5x json.dumps)
MAX_BODY_FLOOR = 1 << 20  # bytes of a request body at least (aiohttp's default)


def _status(exc: SarpError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def _json(body: object, status: int = 200) -> Reply:
    return Reply(status, _ENCODE(body))


def _yielding(rows: Iterator[Logged], every: int = 4096) -> Iterator[Logged]:
    """`rows`, letting the loop's thread take the GIL every `every` of them: the maps are
    read on a thread while the first queries after a restart are answered, and a
    thread that never waits holds the GIL for its whole switch interval (5 ms) each
    time the loop wants it."""
    for i, row in enumerate(rows):
        if i % every == 0:
            time.sleep(0)
        yield row


def _text(status: int, text: str) -> tuple[int, bytes, bytes]:
    return status, text.encode(), b"text/plain; charset=utf-8"


def _guard(fn: Callable[[Request], Reply | Awaitable[Reply]]) -> Handler:
    """A handler whose `SarpError`s, raised now or later, answer with their status."""
    def handle(req: Request) -> Reply | Awaitable[Reply]:
        try:
            out = fn(req)
        except SarpError as exc:
            return json_error(_status(exc), exc.message)
        return out if isinstance(out, Reply) else _guarded(out)
    return handle


async def _guarded(aw: Awaitable[Reply]) -> Reply:
    try:
        return await aw
    except SarpError as exc:
        return json_error(_status(exc), exc.message)


class IndexerApi:
    def __init__(self, server: Server) -> None:
        cfg = server.config
        self.server = server
        self.store = IndexerStore(cfg.data_dir)
        self.registry = self.store.load_registry(cfg.index.block_tokens)
        self.ingest = Ingest(self.registry)
        self.loaded = False  # the engine maps, read by `start` (queries need none of it)
        self.watermarks = self.store.watermarks()  # by the listener's worker slot
        self.forgotten: set[int] = set()
        self.max_items = cfg.index.max_sequence_tokens
        self.conn = LocalConn(server, "indexer-api")
        self.listeners: dict[tuple[str, str, int, int], Listener] = {}
        self.ctx: zmq.asyncio.Context | None = None
        self.ready = False
        self._flusher: asyncio.Task[None] | None = None
        self._dirty = asyncio.Event()  # a batch applied since the last save
        self._ranks: tuple[int, dict[int, tuple[int, int]],
                           dict[tuple[str, str], list[int]]] = (-1, {}, {})

    # -- lifecycle -----------------------------------------------------------------
    def routes(self, readiness: Readiness) -> dict[tuple[str, str], Handler]:
        """Every endpoint of the port: the API's, and sarpd's own three."""
        scrape = exposition(self.server.metrics)
        own: dict[tuple[str, str], Callable[[Request], Reply | Awaitable[Reply]]] = {
            ("GET", "/health"): self.health, ("POST", "/register"): self.register,
            ("POST", "/unregister"): self.unregister, ("GET", "/workers"): self.workers,
            ("POST", "/query"): self.query, ("POST", "/query_by_hash"): self.query_by_hash,
            ("GET", "/dump"): self.dump, ("POST", "/register_peer"): self.register_peer,
            ("POST", "/deregister_peer"): self.deregister_peer, ("GET", "/peers"): self.peers,
        }
        out = {k: _guard(fn) for k, fn in own.items()}
        out["GET", "/metrics"] = lambda req: Reply(200, *scrape(
            req.headers.get(b"accept", b"").decode("latin-1")))
        out["GET", "/healthz"] = lambda req: Reply(*_text(200, "ok\n"))
        out["GET", "/readyz"] = lambda req: Reply(
            *_text(*readiness_answer(readiness)))
        return out

    def max_body(self) -> int:
        """The largest request body taken: a query of `max_sequence_tokens` items."""
        return max(MAX_BODY_FLOOR, 24 * self.max_items + 65536)

    async def start(self) -> None:
        """Once the index serves: read the engine maps (on a thread: queries are
        answered meanwhile), then subscribe every registered worker again."""
        self.ctx = zmq.asyncio.Context()
        await asyncio.to_thread(self.ingest.load, _yielding(self.store.engine_rows()))
        self.loaded = self.ready = True
        for w in list(self.registry.workers.values()):
            if w.endpoint is not None:
                self._listen(w)
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        log.info("indexer API: %d workers of %d indexers subscribed", len(self.listeners),
                 len(self.registry.pairs))

    async def stop(self) -> None:
        self.ready = False
        for lst in list(self.listeners.values()):
            await lst.stop()
        self.listeners.clear()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self.flush()
        self.store.close()
        if self.ctx is not None:
            self.ctx.term()

    def _listen(self, w: Worker) -> None:
        assert self.ctx is not None
        lst = Listener(w, self.ingest, LocalConn(self.server, f"listener {w.instance_id}"),
                       self.ctx, Stream(self.watermarks.get(w.slot)), self._applied)
        self.listeners[w.key] = lst
        lst.start()

    def _applied(self, w: Worker, seq: int) -> None:
        self.watermarks[w.slot] = seq
        self._dirty.set()

    async def flush(self) -> None:
        """The engine maps' changes and the watermarks, to disk together; the whole maps
        instead once the store's log is long enough (`IndexerStore.compact_due`)."""
        if not self.loaded:  # nothing changed yet, and a snapshot would be partial
            return
        changes, self.ingest.journal[:] = self.ingest.journal[:], []
        marks, gone = dict(self.watermarks), set(self.forgotten)
        self.forgotten.clear()
        maps = self.ingest.maps
        snapshot = None
        if self.store.compact_due(weight(changes), sum(len(m.blocks) for m in maps.values())):
            snapshot = [(slot, dict(m.blocks)) for slot, m in maps.items()]  # C copies
        if changes or marks or gone:
            await asyncio.to_thread(self.store.flush, changes, marks, gone, snapshot)

    async def _flush_loop(self) -> None:
        """Save as soon as a batch was applied (what accumulates meanwhile goes in the
        next save: a group commit), so that a restart replays almost nothing twice (a
        replay passes through the older states of what it applies again); report the
        counters about once a second."""
        reported = 0.0
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_INTERVAL_S):
                    await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.flush()
                if loop.time() - reported >= REPORT_INTERVAL_S:
                    self._report()
                    reported = loop.time()
            except Exception:  # logged; the next save tries again
                log.exception("indexer API: saving the listeners' state failed")
                await asyncio.sleep(REPORT_INTERVAL_S)

    def counters(self) -> dict[str, float]:
        """The listeners' counters summed, their statuses, the events skipped by reason:
        in `stats` and /metrics as the ``indexer`` source's report."""
        out: dict[str, float] = {"indexers": len(self.registry.pairs),
                                 "workers": len(self.registry.workers),
                                 "engine_map_blocks": sum(len(m.blocks)
                                                          for m in self.ingest.maps.values())}
        for lst in self.listeners.values():
            out[f"listeners_{lst.status}"] = out.get(f"listeners_{lst.status}", 0) + 1
            for k, v in lst.counts.items():
                out[k] = out.get(k, 0) + v
        for k, v in self.ingest.skipped.items():
            out[f"skipped_{k}"] = v
        return out

    def _report(self) -> None:
        service = self.server.service
        if service is not None:
            service.reports.record(model.Report(0, "indexer", self.counters()))

    # -- handlers ------------------------------------------------------------------
    def health(self, request: Request) -> Reply:
        return Reply(200, b"", b"text/plain")

    async def register(self, request: Request) -> Reply:
        req = api.decode(request.body, api.Register, 0)
        check_endpoint(req.endpoint, "endpoint", BadRequest)
        if req.replay_endpoint is not None:
            check_endpoint(req.replay_endpoint, "replay_endpoint", BadRequest)
        w = self.registry.register(req.model_name, req.routing_group, req.instance_id,
                                   req.dp_rank, req.block_size, req.endpoint,
                                   req.replay_endpoint)
        await asyncio.to_thread(self.store.save_registry, self.registry)
        if self.ready:
            self._listen(w)
        return _json({"status": "ok"}, 201)

    async def unregister(self, request: Request) -> Reply:
        req = api.decode(request.body, api.Unregister, 0)
        if not self.ready:  # its blocks could not be cleared now: nothing changes
            raise Unavailable(f"unregister: the index is not serving ({self.server.status}); "
                              "retry later")
        gone = self.registry.unregister(req.model_name, req.routing_group, req.instance_id)
        for w in gone:
            lst = self.listeners.pop(w.key, None)
            if lst is not None:
                await lst.stop()
        clears = [self.ingest.clear(w, self.conn.next_id) for w in gone]
        await asyncio.gather(*(self.conn.submit(c) for c in clears))
        slots = {w.slot for w in gone}
        for s in slots:
            self.watermarks.pop(s, None)
            self.ingest.maps.pop(s, None)
        self.forgotten |= slots
        self.registry.release(slots)
        await asyncio.to_thread(self.store.save_registry, self.registry)
        return _json({"status": "ok"})

    def workers(self, request: Request) -> Reply:
        q = {k: v[-1] for k, v in parse_qs(request.query).items()}
        rows = []
        for w in self.registry.listed(q.get("model_name"), q.get("routing_group")):
            lst = self.listeners.get(w.key)
            assert w.endpoint is not None
            rows.append(api.Listed(
                w.instance_id, w.model, w.group, self.registry.require(w.model, w.group),
                w.dp_rank, w.endpoint, lst.status if lst else "pending",
                lst.last_error if lst else None))
        return _json(api.workers_answer(rows))

    def query(self, request: Request) -> Reply | Awaitable[Reply]:
        req = api.decode(request.body, api.Query, self.max_items)
        size = self.registry.require(req.model_name, req.routing_group)
        # array.array: ~3x faster than np.array on a list of ints (checked u32 by decode)
        tokens = np.frombuffer(array.array("I", req.token_ids), dtype=np.uint32)
        seed = hashing.seed_of(req.lora_name, req.cache_salt)
        return self._answer(req.model_name, req.routing_group, size,
                            hashing.local_hashes(tokens, size, seed))

    def query_by_hash(self, request: Request) -> Reply | Awaitable[Reply]:
        req = api.decode(request.body, api.QueryByHash, self.max_items)
        size = self.registry.require(req.model_name, req.routing_group)
        return self._answer(req.model_name, req.routing_group, size,
                            hashing.unsigned(req.block_hashes))

    def _answer(self, model_name: str, group: str, size: int,
                local: np.ndarray[Any, np.dtype[np.uint64]]) -> Reply | Awaitable[Reply]:
        """The reply now when the worker is idle (`Server.answer_now`), else an
        awaitable of it (through the batcher without its window)."""
        if not len(local):
            return _json(api.answer({}, size))
        ns = namespace(model_name, group)
        ids = hashing.chain(hashing.root(ns), local)
        ranks, slots = self._slot_ranks(model_name, group)
        maps = self.ingest.maps
        seq = model.SeqSpec(ns=ns, hashes=ids)
        device = self.loaded and len(slots) <= api.MAX_HOLDERS and not any(
            s in maps and maps[s].lower for s in slots)
        # device blocks only: every rank's run from block 0 (the native kernel's);
        # else a walk over lower tiers: every holder's runs
        match = (model.Match(self.conn.next_id(), seq=seq, holders=max(1, len(slots)))
                 if device else model.Match(self.conn.next_id(), seq=seq, spans=True))
        res = self.server.answer_now(match)
        if isinstance(res, SarpError):
            raise res
        if isinstance(res, model.MatchResult):
            return self._reply(res.holders or [], res.spans or [], device, ranks, size)
        return self._answer_later(match, device, ranks, size)

    async def _answer_later(self, match: model.Match, device: bool,
                            ranks: dict[int, tuple[int, int]], size: int) -> Reply:
        resp = await self.conn.request(match, now=True)
        return self._reply([(m, r) for m, r in resp.get("holders") or ()],
                           [(m, a, n) for m, a, n in resp.get("spans") or ()],
                           device, ranks, size)

    @staticmethod
    def _reply(holders: list[tuple[int, int]], spans: list[tuple[int, int, int]],
               device: bool, ranks: dict[int, tuple[int, int]], size: int) -> Reply:
        if device:
            return _json(api.device_answer(holders, ranks, size))
        return _json(api.answer(api.reach(spans, ranks), size))

    async def dump(self, request: Request) -> Reply:
        """Every indexer's blocks as Dynamo's stored events (a peer recovers from it);
        built on a thread from a copy of the maps."""
        if not self.loaded:
            raise Unavailable("dump: the engine maps are still being read; retry later")
        reg = self.registry
        workers = [(w.model, w.group, w.instance_id, w.dp_rank,
                    dict(self.ingest.maps[w.slot].blocks))
                   for w in reg.workers.values() if w.slot in self.ingest.maps]
        sizes = dict(reg.pairs)

        def build() -> bytes:
            return _ENCODE(api.dump(sizes, workers))

        return Reply(200, await asyncio.to_thread(build))

    async def register_peer(self, request: Request) -> Reply:
        self.registry.add_peer(api.decode(request.body, api.Peer, 0).url)
        await asyncio.to_thread(self.store.save_registry, self.registry)
        return _json({"status": "ok"}, 201)

    async def deregister_peer(self, request: Request) -> Reply:
        self.registry.remove_peer(api.decode(request.body, api.Peer, 0).url)
        await asyncio.to_thread(self.store.save_registry, self.registry)
        return _json({"status": "ok"})

    def peers(self, request: Request) -> Reply:
        return _json(self.registry.peers)

    def _slot_ranks(self, model_name: str, group: str
                    ) -> tuple[dict[int, tuple[int, int]], list[int]]:
        """worker slot -> (instance, rank), and the slots of one pair's workers."""
        version, ranks, pairs = self._ranks
        if version != self.registry.version:
            ranks, pairs = {}, {}
            for w in self.registry.workers.values():
                ranks[w.slot] = (w.instance_id, w.dp_rank)
                pairs.setdefault((w.model, w.group), []).append(w.slot)
            self._ranks = (self.registry.version, ranks, pairs)
        return ranks, pairs.get((model_name, group), [])
