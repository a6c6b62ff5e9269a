"""The fleet benchmark's indexes: what every one implements (`FleetIndex`), and the
two peers that are not sarp: Dynamo's radix tree and an llm-d-style Redis index.
sarp's own (over its socket and in-process) are in tools/bench/fleet_sarp.py.

An index applies one engine `Batch` (EventBatch) per `apply` call and answers a
`Query` with every holder's run: {worker: blocks held from position 0 on}, the
`holders` (K) longest, ties by smaller worker id (what sarp's `match ... holders K`
answers; the peers' answers are cut to the same K).

- `dynamo-radix`: the `ai-dynamo-runtime` wheel's `RadixTree` (the `peers` extra),
  in-process. Events go in as the JSON its `apply_event(worker, bytes)` parses:
  BlockStored -> `stored` (parent_hash, blocks of block_hash (our chained id) and
  tokens_hash (the block's content hash)), BlockRemoved -> `removed`; a query is
  `find_matches(content hashes)`, whose `scores` are each worker's matched depth.
  It is timed on its own calls: the JSON of every event and the list of every query's
  hashes are built by `prepare`, before the clock (in Dynamo's indexer the events
  arrive in Rust; building them in Python is this bench's cost, not the tree's).
- `redis-llmd`: a real redis-server (tools/bench/redis_server.py), as llm-d's
  KV-cache index keeps it there: one key per block hash (8 bytes, big-endian) holding
  a hash of pods (`HSET key <worker> 1` on BlockStored, `HDEL key <worker>` on
  BlockRemoved: Redis drops an emptied hash); a query pipelines `HKEYS` of all its
  keys in one round trip and walks them: a pod's run is the consecutive blocks from
  0 it holds, and the walk stops at the first block no pod holds. Commands are packed
  with numpy (RESP) on a plain Unix socket and replies parsed by hiredis.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import hiredis
import numpy as np

from tools.bench.fleet_model import Batch, Event, Query, Stored, U64s, ranked
from tools.bench.redis_server import RedisServer

Answer = dict[int, int]  # worker -> run (> 0)
Sync = Literal["none", "always"]
DYNAMO_MISSING = ("ai-dynamo-runtime is not installed (pip install 'sarp[peers]', "
                  "or the wheel): dynamo-radix skipped")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """What every index of a run shares."""

    workers: int
    holders: int  # K: holders answered per query
    sync: Sync = "none"  # sarp's --sync; redis: appendfsync always / everysec
    backend: str = "rocksdb"


@dataclass(frozen=True, slots=True)
class Recovery:
    """A kill -9 and restart of the index mid-replay."""

    ready_s: float  # restart (spawn) -> the first answered ping
    index_s: float  # the index's own recovery (sarpd's recovered_in_s)
    resent: int  # requests sent again after the restart (unacknowledged at the kill,
    #             or made while it was down)


class FleetIndex(Protocol):
    name: str

    def open(self, root: Path) -> None:
        """Start empty under `root` (a fresh directory of its own)."""
        ...

    def prepare(self, entries: Sequence[Batch | Query]) -> None:
        """Before the clock: build the input each entry will be given to the index in
        (a binding's argument form, not the index's own work); most need nothing."""
        ...

    def apply(self, batch: Batch) -> None:
        """Apply one engine's EventBatch (it may be acknowledged later: `drain`)."""
        ...

    def query(self, q: Query) -> Answer | None:
        """Every holder's run (the K longest), after every batch applied before it;
        None when the index could not answer (down)."""
        ...

    def drain(self) -> None:
        """Return once every batch applied so far is acknowledged."""
        ...

    def close(self) -> None: ...


class Crashable(Protocol):
    """An index that can be killed -9 and restarted on its data mid-replay."""

    def crash(self) -> None:
        """Kill the index's process and start it again on the same data (at once: the
        replay goes on while it recovers)."""
        ...

    def recovery(self) -> Recovery | None:
        """The last crash's recovery, once it is back (None before)."""
        ...


def top(answer: Answer, k: int) -> Answer:
    return dict(ranked(answer, k))


def dynamo_available() -> bool:
    try:
        return importlib.util.find_spec("dynamo._core") is not None
    except ModuleNotFoundError:
        return False


# ------------------------------------------------------------------------- dynamo


def dynamo_json(event_id: int, ev: Event) -> bytes:
    """One event as the JSON `RadixTree.apply_event` takes."""
    if isinstance(ev, Stored):
        blocks = ",".join(f'{{"block_hash":{h},"tokens_hash":{t}}}' for h, t in
                          zip(ev.hashes.tolist(), ev.locals.tolist(), strict=True))
        parent = "null" if ev.parent is None else str(ev.parent)
        return (f'{{"event_id":{event_id},"data":{{"stored":{{"parent_hash":{parent},'
                f'"blocks":[{blocks}]}}}}}}').encode()
    ids = ",".join(map(str, ev.hashes.tolist()))
    return f'{{"event_id":{event_id},"data":{{"removed":{{"block_hashes":[{ids}]}}}}}}'.encode()


class DynamoRadix:
    """Dynamo's RadixTree, in-process (module doc)."""

    name = "dynamo-radix"

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self._tree: Any = None
        self._events: dict[int, list[bytes]] = {}  # id(batch) -> its events' JSON
        self._hashes: dict[int, list[int]] = {}  # id(query) -> its content hashes
        self._event_ids = [0] * cfg.workers  # per worker: the last event id given

    def open(self, root: Path) -> None:
        from dynamo._core import RadixTree

        self._tree = RadixTree()

    def prepare(self, entries: Sequence[Batch | Query]) -> None:
        for e in entries:
            if isinstance(e, Query):
                self._hashes[id(e)] = e.locals.tolist()
            else:
                self._events[id(e)] = self._json(e)

    def _json(self, batch: Batch) -> list[bytes]:
        first = self._event_ids[batch.worker] + 1
        self._event_ids[batch.worker] += len(batch.events)
        return [dynamo_json(first + i, ev) for i, ev in enumerate(batch.events)]

    def apply(self, batch: Batch) -> None:
        w, tree = batch.worker, self._tree
        for js in self._events.pop(id(batch), None) or self._json(batch):
            tree.apply_event(w, js)

    def query(self, q: Query) -> Answer:
        hashes = self._hashes.get(id(q))  # a query may be asked again (the tests do)
        scores: dict[Any, int] = self._tree.find_matches(
            q.locals.tolist() if hashes is None else hashes).scores
        runs = {(k[0] if isinstance(k, tuple) else int(k)): int(v) for k, v in scores.items()}
        return top(runs, self.cfg.holders)

    def drain(self) -> None:
        pass

    def close(self) -> None:
        self._tree = None
        self._events.clear()
        self._hashes.clear()


# -------------------------------------------------------------------------- redis


def resp_fixed(prefix: bytes, keys: U64s, suffix: bytes) -> bytes:
    """One RESP command per key: `prefix`, the key (8 bytes big-endian), `suffix`."""
    n, p = len(keys), len(prefix)
    buf = np.empty((n, p + 8 + len(suffix)), dtype=np.uint8)
    buf[:, :p] = np.frombuffer(prefix, dtype=np.uint8)
    buf[:, p: p + 8] = keys.astype(">u8").view(np.uint8).reshape(n, 8)
    buf[:, p + 8:] = np.frombuffer(suffix, dtype=np.uint8)
    return buf.tobytes()


def _bulk(s: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(s), s)


class RespPipe:
    """Pipelined RESP on one blocking Unix socket; replies parsed by hiredis."""

    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.reader = hiredis.Reader()

    def call(self, packed: bytes, n: int) -> list[Any]:
        """Send `n` packed commands, return their `n` replies (an error reply raises)."""
        self.sock.sendall(packed)
        out: list[Any] = []
        while len(out) < n:
            reply = self.reader.gets()
            if reply is False:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("redis-server closed the connection")
                self.reader.feed(data)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise reply
            out.append(reply)
        return out

    def close(self) -> None:
        self.sock.close()


class RedisLlmd:
    """llm-d-style index in a real redis-server (module doc)."""

    name = "redis-llmd"

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self._server: RedisServer | None = None
        self._pipe: RespPipe | None = None
        self._hset = [(_bulk(b"%d" % w) + _bulk(b"1")) for w in range(cfg.workers)]
        self._hdel = [_bulk(b"%d" % w) for w in range(cfg.workers)]

    def open(self, root: Path) -> None:
        self._server = RedisServer(root / "redis", sync=self.cfg.sync == "always")
        self._server.start()
        self._pipe = RespPipe(self._server.socket_path)

    @property
    def pipe(self) -> RespPipe:
        assert self._pipe is not None, "open() first"
        return self._pipe

    def prepare(self, entries: Sequence[Batch | Query]) -> None:
        pass  # commands are packed per call: packing is the client's work, as in llm-d

    def apply(self, batch: Batch) -> None:
        w = batch.worker
        parts: list[bytes] = []
        n = 0
        for ev in batch.events:
            if isinstance(ev, Stored):
                parts.append(resp_fixed(b"*4\r\n$4\r\nHSET\r\n$8\r\n", ev.hashes,
                                        b"\r\n" + self._hset[w]))
            else:
                parts.append(resp_fixed(b"*3\r\n$4\r\nHDEL\r\n$8\r\n", ev.hashes,
                                        b"\r\n" + self._hdel[w]))
            n += len(ev.hashes)
        if n:
            self.pipe.call(b"".join(parts), n)

    def query(self, q: Query) -> Answer:
        if not len(q.hashes):
            return {}
        replies = self.pipe.call(resp_fixed(b"*2\r\n$5\r\nHKEYS\r\n$8\r\n", q.hashes, b"\r\n"),
                                 len(q.hashes))
        return top(pod_runs(replies), self.cfg.holders)

    def drain(self) -> None:
        pass

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self._server is not None:
            self._server.close()
            self._server = None


def pod_runs(replies: Sequence[list[bytes]]) -> Answer:
    """Each pod's run over the per-block pod lists of a query: the walk stops once no
    pod holds every block so far (at the latest, at the first block no pod holds)."""
    alive: set[bytes] | None = None
    runs: dict[bytes, int] = {}
    for i, pods in enumerate(replies):
        alive = set(pods) if alive is None else alive.intersection(pods)
        if not alive:
            break
        for p in alive:
            runs[p] = i + 1
    return {int(p): r for p, r in runs.items()}
