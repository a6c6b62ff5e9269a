"""sarp in the fleet benchmark: over sarpd's Unix socket (`--direct`, the default) or
in-process (`--in-process`, SarpIndex itself), each in two layouts:

- `sarp`: ONE shared namespace, protocol 2; a holder is a worker's metadata word
  (`worker << 48`, the vLLM bridge's layout: sarpd.events.mapping.block_meta).
  BlockStored -> `insert` of its hashes with `meta` = the holder and `parent` when
  the blocks follow one; BlockRemoved -> `remove` of the `ids` with `meta` = the
  holder (only that holder is taken off); a query is one `match` of the request's
  hashes with `holders` K, whose answer is each holder's run.
- `sarp-ns-per-worker`: the workaround before holders: a namespace per worker
  (protocol 1, one holder per block), the same inserts and removes in the worker's
  namespace, and a query is one `match` per worker (pipelined; in-process, one
  `match_many` call), each worker's run its matched blocks.

Transport (`--direct`): the driver's own connection (`Link`) carries events and
queries, pipelined: an event's requests are written at its deadline and not waited
for; a query is answered after every request sent before it on the connection (the
protocol's order), so it sees every batch applied before it. A `--bridge` transport
(tools/bench/fleet_bridge.py: a vLLM publisher and the real bridge per engine) is
another `EventSink`.

Crash (`crash`, the kill -9 run): sarpd is killed and started again on the same data
and socket, at once, while the replay goes on. The link notices the lost connection
and keeps every write that was not acknowledged, and every write made while sarpd is
down, in order; once sarpd answers a ping again it connects (hello protocol 2) and
sends them again, in that order, before anything else. That is safe because a
replayed suffix of adds and takes-off of one holder ends in the same state (each
holder's blocks are decided by its last write), with one exception the link keeps out:
an insert after a parent, resent over a state where a later write (applied before the
kill, its answer not yet received) took the parent away, would be refused
(`unknown_parent`) where it once succeeded. So, as the vLLM bridge does
(sarpd.bridge.vllm `_window_end`), a write that changes the presence of a block an
unanswered insert names as its parent waits for every answer first. Queries made while
sarpd is down get no answer (counted). A watcher thread times the restart: spawn ->
first ping answered.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgpack
import numpy as np

from sarpd.config import IndexConfig
from sarpd.core import SarpIndex, open_backend
from sarpd.errors import SarpError
from sarpd.events.mapping import WORKER_SHIFT, block_meta
from sarpd.model import Insert, Match, MatchResult, Remove, SeqSpec
from sarpd.protocol.wire import encode_request, error_from_code
from tools.bench.fleet_indexes import Answer, FleetConfig, Recovery, top
from tools.bench.fleet_model import Batch, Query, Stored, U64s
from tools.bench.sarp_index import as_hashes
from tools.bench.spawn import start_daemon, stop_daemon

NS = "fleet"
WRITES = frozenset({"insert", "remove", "clear"})
CACHE_BYTES = 64 << 20  # in-process: the backend cache sarpd uses by default
Op = tuple[str, dict[str, Any]]


class Down(ConnectionError):
    """sarpd is not there (killed, restarting): the link keeps its writes."""


def holder(worker: int) -> int:
    return block_meta(worker, None)


def id_bin(hashes: U64s) -> bytes:
    """64-bit engine hashes as `hashes`/`ids` bin: 16 bytes LE per id, high half 0."""
    out = np.zeros((len(hashes), 2), dtype="<u8")
    out[:, 0] = hashes
    return out.tobytes()


def sarp_ops(batch: Batch, ns: str, meta: int) -> list[Op]:
    """One engine batch as sarpd requests (module doc)."""
    out: list[Op] = []
    for ev in batch.events:
        ids = id_bin(ev.hashes)
        if isinstance(ev, Stored):
            fields: dict[str, Any] = {"ns": ns, "hashes": ids, "meta": meta}
            if ev.parent is not None:
                fields["parent"] = ev.parent
            out.append(("insert", fields))
        else:
            out.append(("remove", {"ns": ns, "ids": ids, "meta": meta}))
    return out


# ---------------------------------------------------------------- the connection


class PipeConn:
    """Pipelined requests on one blocking connection: `send` writes a request without
    waiting (at most `max_inflight` unanswered), `wait` reads until one's answer."""

    def __init__(self, path: Path, max_inflight: int = 512, timeout: float = 120.0) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as exc:
            sock.close()
            raise Down(f"sarpd at {path}: {exc}") from exc
        self.path = path
        self.sock = sock
        self.max_inflight = max_inflight
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=256 << 20)
        self.pending: dict[int, Op] = {}  # sent (or being sent), unanswered, in order
        self.kept: set[int] = set()  # answers `wait` will ask for
        self.results: dict[int, dict[str, Any] | SarpError] = {}
        self.errors: list[SarpError] = []  # error answers to writes
        self._next = 1

    def send(self, op: str, fields: dict[str, Any], keep: bool = False) -> int:
        rid = self._next
        self._next += 1
        self.pending[rid] = (op, fields)
        if keep:
            self.kept.add(rid)
        while len(self.pending) > self.max_inflight:
            self._read()
        try:
            self.sock.sendall(encode_request(rid, op, fields))
        except TimeoutError:
            raise
        except OSError as exc:
            raise Down(f"sarpd at {self.path}: {exc}") from exc
        return rid

    def wait(self, rid: int) -> dict[str, Any]:
        while rid not in self.results:
            self._read()
        res = self.results.pop(rid)
        self.check()
        if isinstance(res, SarpError):
            raise res
        return res

    def drain(self) -> None:
        while self.pending:
            self._read()
        self.check()

    def check(self) -> None:
        if self.errors:
            raise self.errors[0]

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            raise
        except OSError as exc:
            raise Down(f"sarpd at {self.path}: {exc}") from exc
        if not data:
            raise Down(f"sarpd at {self.path} closed the connection")
        self.unpacker.feed(data)
        for msg in self.unpacker:
            self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id", 0)
        err = None
        if not msg.get("ok"):
            e = msg.get("error") or {}
            err = error_from_code(str(e.get("code")), str(e.get("message")))
            if rid == 0:
                raise err  # a stream error: our framing is wrong, not sarpd gone
        self.pending.pop(rid, None)
        if rid in self.kept:
            self.kept.discard(rid)
            self.results[rid] = msg if err is None else err
        elif err is not None:
            self.errors.append(err)

    def close(self) -> None:
        self.sock.close()


class Link:
    """A connection to sarpd that survives its restarts (module doc, "Crash")."""

    def __init__(self, path: Path, protocol: int = 2, max_inflight: int = 512,
                 retry_s: float = 0.005) -> None:
        self.path = path
        self.protocol = protocol
        self.max_inflight = max_inflight
        self.retry_s = retry_s
        self.conn: PipeConn | None = None
        self.backlog: list[Op] = []  # writes to send again, in order
        self.resent = 0
        self.losses = 0
        self.waits = 0  # writes that waited for every answer first (the parent rule)
        self._parents: set[tuple[str, int]] = set()  # of unanswered inserts: (ns, hash)
        self._last_try = 0.0

    def connect(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._up():
            if time.monotonic() > deadline:
                raise TimeoutError(f"sarpd at {self.path} did not answer in {timeout:.0f} s")
            time.sleep(self.retry_s)

    def _up(self) -> bool:
        if self.conn is not None:
            return True
        now = time.monotonic()
        if now - self._last_try < self.retry_s:
            return False
        self._last_try = now
        try:
            conn = PipeConn(self.path, self.max_inflight)
        except Down:
            return False
        backlog = self.backlog
        try:
            conn.wait(conn.send("ping", {}, keep=True))
            if self.protocol > 1:
                conn.wait(conn.send("hello", {"protocol": self.protocol}, keep=True))
            self._parents.clear()
            for op, fields in backlog:
                self._guard(conn, op, fields)
                conn.send(op, fields)
                self._note(op, fields)
        except (Down, SarpError):  # gone again, or still recovering (unavailable)
            conn.close()
            return False
        self.conn, self.backlog = conn, []
        self.resent += len(backlog)
        return True

    def _lost(self) -> None:
        conn, self.conn = self.conn, None
        assert conn is not None
        self.backlog[:0] = [op for op in conn.pending.values() if op[0] in WRITES]
        conn.close()
        self._parents.clear()
        self.losses += 1

    def _guard(self, conn: PipeConn, op: str, fields: dict[str, Any]) -> None:
        """Wait for every answer on `conn` first when this write changes the presence of
        a block that an unanswered insert names as its parent (module doc, "Crash")."""
        if not self._parents:
            return
        if not conn.pending:
            self._parents.clear()
            return
        key = "ids" if op == "remove" else "hashes" if op == "insert" else ""
        ns = str(fields.get("ns", ""))
        named = {(ns, h) for h in np.frombuffer(fields[key], "<u8")[0::2].tolist()} \
            if key and isinstance(fields.get(key), bytes) else set()
        if op == "clear" or not named.isdisjoint(self._parents):
            conn.drain()
            self._parents.clear()
            self.waits += 1

    def _note(self, op: str, fields: dict[str, Any]) -> None:
        if op == "insert" and fields.get("parent") is not None:
            self._parents.add((str(fields.get("ns", "")), int(fields["parent"])))

    def submit(self, ops: Sequence[Op]) -> None:
        """Writes, pipelined (acknowledged later: `drain`); kept while sarpd is down."""
        if not self._up():
            self.backlog.extend(ops)
            return
        assert self.conn is not None
        for i, (op, fields) in enumerate(ops):
            try:
                self._guard(self.conn, op, fields)
            except Down:  # before ops[i] was sent: it goes with the backlog
                self._lost()
                self.backlog.extend(ops[i:])
                return
            try:
                self.conn.send(op, fields)
            except Down:  # ops[i] was registered as pending: _lost keeps it
                self._lost()
                self.backlog.extend(ops[i + 1:])
                return
            self._note(op, fields)

    def call(self, ops: Sequence[Op]) -> list[dict[str, Any]] | None:
        """Requests answered in order (after every write before them); None if sarpd is
        down (found lost, the link tries once more at once: it may be back)."""
        for attempt in range(2):
            if not self._up():
                return None
            assert self.conn is not None
            try:
                rids = [self.conn.send(op, fields, keep=True) for op, fields in ops]
                return [self.conn.wait(r) for r in rids]
            except Down:
                self._lost()
                self._last_try = 0.0 if attempt == 0 else self._last_try
        return None

    def drain(self, timeout: float = 300.0) -> None:
        """Every write acknowledged; waits for sarpd to come back if it is down."""
        deadline = time.monotonic() + timeout
        while True:
            if self._up():
                assert self.conn is not None
                try:
                    self.conn.drain()
                    return
                except Down:
                    self._lost()
            if time.monotonic() > deadline:
                raise TimeoutError(f"sarpd at {self.path} is still down after {timeout:.0f} s")
            time.sleep(self.retry_s)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ---------------------------------------------------------------- event transports


class EventSink(Protocol):
    """How engine batches reach sarpd. `DirectSink` (`--direct`): requests on the
    driver's own link. `BridgeSink` (`--bridge`, tools/bench/fleet_bridge.py): each
    batch as a vLLM EventBatch on a publisher per engine, a real bridge per engine
    between it and sarpd; its `fence` waits until the bridges applied every batch
    published before a query."""

    def send(self, batch: Batch) -> None: ...

    def fence(self) -> None:
        """Return once every batch sent is applied before a later query on the link."""
        ...

    def drain(self) -> None: ...

    def close(self) -> None: ...


class DirectSink:
    """Batches as sarpd requests on the link (`sarp_ops`); the link's order fences."""

    def __init__(self, link: Link, ns_of: Callable[[int], str]) -> None:
        self.link = link
        self.ns_of = ns_of

    def send(self, batch: Batch) -> None:
        self.link.submit(sarp_ops(batch, self.ns_of(batch.worker), holder(batch.worker)))

    def fence(self) -> None:
        pass  # a query on the same connection is answered after every request before it

    def drain(self) -> None:
        self.link.drain()

    def close(self) -> None:
        pass  # the link is the index's


# ------------------------------------------------------------------- the indexes


def _holders_answer(pairs: Sequence[Sequence[int]] | None) -> Answer:
    return {int(m) >> WORKER_SHIFT: int(b) for m, b in (pairs or ())}


class _Watch:
    """Times a restart: from `t0` (the spawn) to the first answered ping."""

    def __init__(self, sock: Path, t0: float) -> None:
        self.sock = sock
        self.t0 = t0
        self.ready_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sarpd-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = PipeConn(self.sock, timeout=10)
                try:
                    conn.wait(conn.send("ping", {}, keep=True))
                    self.ready_at = time.perf_counter()
                    return
                finally:
                    conn.close()
            except (OSError, SarpError):  # Down is an OSError
                time.sleep(0.002)

    def wait(self, timeout: float = 30.0) -> float | None:
        """The time of the first answered ping, once the watcher saw it (a loaded
        machine may finish the replay before the watcher's thread ran again)."""
        self._thread.join(timeout)
        return self.ready_at

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


class SarpDirect:
    """sarp (or, `per_worker`, sarp-ns-per-worker) in a sarpd of its own on a temp
    data dir, over its socket (module doc); `socket`: use that running sarpd instead
    (not started, stopped or crashed here)."""

    def __init__(self, cfg: FleetConfig, per_worker: bool = False,
                 socket: Path | None = None, bridge: bool = False) -> None:
        self.cfg = cfg
        self.bridge = bridge  # events through a vLLM bridge per engine (fleet_bridge)
        self.per_worker = per_worker
        self.name = "sarp-ns-per-worker" if per_worker else "sarp"
        self.sock = socket
        self._own = socket is None
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dir = Path()
        self._link: Link | None = None
        self._sink: EventSink | None = None
        self._watch: _Watch | None = None

    @property
    def sink(self) -> EventSink:
        assert self._sink is not None, "open() first"
        return self._sink

    @property
    def link(self) -> Link:
        assert self._link is not None, "open() first"
        return self._link

    def open(self, root: Path) -> None:
        if self._own:
            self.data_dir = root / "sarpd"
            self.proc, self.sock = start_daemon(self.data_dir, backend=self.cfg.backend,
                                                sync=self.cfg.sync)
        assert self.sock is not None
        self._link = Link(self.sock, protocol=1 if self.per_worker else 2)
        self.link.connect()
        if self.bridge:
            from tools.bench.fleet_bridge import BridgeSink  # zmq, msgspec: only here

            template = f"{NS}/w{{worker}}" if self.per_worker else NS
            self._sink = BridgeSink(self.sock, self.cfg.workers, template, root,
                                    holders=not self.per_worker)
        else:
            self._sink = DirectSink(self.link, self._ns)

    def _ns(self, worker: int) -> str:
        return f"{NS}/w{worker}" if self.per_worker else NS

    def prepare(self, entries: Sequence[Batch | Query]) -> None:
        pass  # mapping events to requests is sarp's own work (the bridge's, in production)

    def apply(self, batch: Batch) -> None:
        self.sink.send(batch)

    def query(self, q: Query) -> Answer | None:
        self.sink.fence()
        ids = id_bin(q.hashes)
        if not self.per_worker:
            res = self.link.call([("match", {"ns": NS, "hashes": ids,
                                             "holders": self.cfg.holders})])
            return None if res is None else _holders_answer(res[0].get("holders"))
        many = self.link.call([("match", {"ns": self._ns(w), "hashes": ids})
                               for w in range(self.cfg.workers)])
        if many is None:
            return None
        return top({w: int(r["blocks"]) for w, r in enumerate(many)}, self.cfg.holders)

    def drain(self) -> None:
        self.sink.drain()

    def crash(self) -> None:
        if not self._own or self.proc is None:
            raise RuntimeError(f"{self.name}: attached to a sarpd it did not start")
        self.proc.kill()
        self.proc.wait()
        t0 = time.perf_counter()
        self.proc, _ = start_daemon(self.data_dir, backend=self.cfg.backend,
                                    sync=self.cfg.sync, sock=self.sock, wait=False)
        self._watch = _Watch(self.link.path, t0)

    def recovery(self) -> Recovery | None:
        ready = self._watch.wait() if self._watch is not None else None
        if self._watch is None or ready is None:
            return None
        stats = self.link.call([("stats", {})])
        index_s = float(stats[0].get("recovered_in_s", 0.0)) if stats else 0.0
        return Recovery(ready - self._watch.t0, index_s, self.link.resent)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self._sink is not None:
            self._sink.close()
        if self._link is not None:
            self._link.close()
        if self._own and self.proc is not None and self.sock is not None:
            stop_daemon(self.proc, self.sock)
            self.proc = None


class SarpInProcess:
    """sarp (or sarp-ns-per-worker) as a SarpIndex in this process: one `write_many`
    per batch, one `match_many` per query. `crash` closes it without a snapshot (what
    a kill -9 leaves on disk when every write was synced) and opens it again, timing
    the open, the recovery and a first match; the replay waits meanwhile."""

    def __init__(self, cfg: FleetConfig, per_worker: bool = False) -> None:
        self.cfg = cfg
        self.per_worker = per_worker
        self.name = "sarp-ns-per-worker" if per_worker else "sarp"
        self.root = Path()
        self._ix: SarpIndex | None = None
        self._recovery: Recovery | None = None

    @property
    def ix(self) -> SarpIndex:
        assert self._ix is not None, "open() first"
        return self._ix

    def open(self, root: Path) -> None:
        self.root = root
        self._ix = self._open()
        self.ix.recover()

    def _open(self) -> SarpIndex:
        be = open_backend(self.cfg.backend, self.root / self.cfg.backend, cache_bytes=CACHE_BYTES)
        snaps = self.root / "snapshots"
        snaps.mkdir(parents=True, exist_ok=True)
        return SarpIndex(be, IndexConfig(), snaps, sync=self.cfg.sync == "always")

    def _ns(self, worker: int) -> str:
        return f"{NS}/w{worker}" if self.per_worker else NS

    def prepare(self, entries: Sequence[Batch | Query]) -> None:
        pass  # mapping events to requests is sarp's own work (the bridge's, in production)

    def apply(self, batch: Batch) -> None:
        ns, meta = self._ns(batch.worker), holder(batch.worker)
        ops: list[Insert | Remove] = []
        for ev in batch.events:
            if isinstance(ev, Stored):
                parent = None if ev.parent is None else as_hashes(np.array([ev.parent], np.uint64))
                ops.append(Insert(0, SeqSpec(ns, hashes=as_hashes(ev.hashes)), meta=meta,
                                  parent=parent, add_holder=not self.per_worker))
            else:
                ops.append(Remove(0, ns=ns, ids=as_hashes(ev.hashes), meta=meta))
        for r in self.ix.write_many(ops):
            if isinstance(r, SarpError):
                raise r

    def query(self, q: Query) -> Answer:
        h = as_hashes(q.hashes)
        if not self.per_worker:
            r = self.ix.match_many([Match(0, SeqSpec(NS, hashes=h), holders=self.cfg.holders)])[0]
            if isinstance(r, SarpError):
                raise r
            return _holders_answer(r.holders)
        rs = self.ix.match_many([Match(w, SeqSpec(self._ns(w), hashes=h))
                                 for w in range(self.cfg.workers)])
        runs: Answer = {}
        for w, r in enumerate(rs):
            if isinstance(r, SarpError):
                raise r
            assert isinstance(r, MatchResult)
            runs[w] = r.blocks
        return top(runs, self.cfg.holders)

    def drain(self) -> None:
        pass

    def crash(self) -> None:
        self.ix.close()
        t0 = time.perf_counter()
        self._ix = self._open()
        rep = self.ix.recover()
        probe = as_hashes(np.arange(1, 3, dtype=np.uint64))
        self.ix.match_many([Match(0, SeqSpec(NS, hashes=probe))])
        self._recovery = Recovery(time.perf_counter() - t0, rep.seconds, 0)

    def recovery(self) -> Recovery | None:
        return self._recovery

    def close(self) -> None:
        if self._ix is not None:
            self._ix.close()
            self._ix = None
