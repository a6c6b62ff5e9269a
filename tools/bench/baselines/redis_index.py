"""The `redis` baseline: per-block entries in a real redis-server (see
tools/bench/redis_server.py), the in-memory index a user would pick."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import redis
from redis.exceptions import NoScriptError, ResponseError

from tools.bench.api import Ids, RecoveryResult
from tools.bench.baselines._common import (
    U64,
    Baseline,
    BaselineError,
    be_keys,
    first_absent,
    first_miss,
    salted,
)
from tools.bench.redis_server import RedisServer, RedisServerError

# SET NX per key in one command: first insert wins per block, one AOF write (fsync'd
# before the reply under appendfsync always), one round trip.
_SETNX_MANY = """
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[i], 'NX') end
return #KEYS
"""


def resp_command(head: list[bytes], *columns: U64) -> bytes:
    """A RESP command: `head` arguments, then for each row i every column's value i as
    an 8-byte argument (ids big-endian, metas little-endian, as stored), packed with
    numpy: redis-py packs one argument at a time, ~60 % of an MGET's time here."""
    n = len(columns[0]) if columns else 0
    out = [b"*%d\r\n" % (len(head) + n * len(columns))]
    out += [b"$%d\r\n%s\r\n" % (len(h), h) for h in head]
    if n:
        buf = np.empty((n, 14 * len(columns)), dtype=np.uint8)
        for j, col in enumerate(columns):
            c = 14 * j
            buf[:, c: c + 4] = np.frombuffer(b"$8\r\n", dtype=np.uint8)
            order = ">u8" if j == 0 else "<u8"
            buf[:, c + 4: c + 12] = col.astype(order).view(np.uint8).reshape(n, 8)
            buf[:, c + 12: c + 14] = np.frombuffer(b"\r\n", dtype=np.uint8)
        # all of column 0 (the keys), then all of column 1, ...
        cols = buf.reshape(n, len(columns), 14).transpose(1, 0, 2)
        out.append(np.ascontiguousarray(cols).tobytes())
    return b"".join(out)


class RedisBlockHash(Baseline):
    """Redis: a real `redis-server` (Debian's, started by the harness on a private
    Unix socket, hiredis reply parser in redis-py) holding one string key per block:
    key = salted block id (8 B big-endian), value = metadata (8 B). Persistence: AOF
    with `appendfsync always` for sync runs (`everysec` otherwise) plus RDB save points.
    Commands are packed with numpy (RESP) and sent on redis-py's connection, replies
    parsed by hiredis. Match: ONE MGET of every id of every prompt of the batch; per
    prompt the first nil ends the match. Insert: the first block not yet indexed per
    sequence, found in two or three MGETs of up to 64 evenly spaced positions (presence
    is prefix-closed), then the blocks from there on (first occurrence in the batch)
    in ONE Lua call doing SET NX per key (first insert wins; one AOF append and
    fsync). flush(): BGREWRITEAOF, waiting until it is done (a compact RDB-preamble
    AOF for the restart). Recovery: a real restart (SIGTERM =
    SHUTDOWN, then a new redis-server on the same files), timed from the spawn until
    the first match's MGET is answered (not LOADING): recovery_s and recovery_spawn_s
    alike (a C server has no interpreter start to leave out). memory_bytes: INFO
    used_memory (everything Redis allocated: its whole footprint); reads: the keys
    of its MGETs; disk_bytes: the AOF files plus dump.rdb. The run's
    backend and cache size do not apply."""

    name = "redis"

    def __init__(self, *, sync: bool = False) -> None:
        super().__init__(sync=sync)
        self._server: RedisServer | None = None
        self.start_s = 0.0
        self.reads = 0  # keys read by MGET (reads_per_match)

    @property
    def server(self) -> RedisServer:
        if self._server is None:
            raise BaselineError(f"{self.name}: not open")
        return self._server

    def _open_state(self) -> None:
        self._server = RedisServer(self.data_dir / "redis", sync=self.sync)
        try:
            self.start_s = self._server.start()
        except BaseException:
            self._server.close()
            self._server = None
            raise
        self._sha = self._load_script()

    def _load_script(self) -> bytes:
        return str(self.server.client().script_load(_SETNX_MANY)).encode()

    def _close_state(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    @property
    def _client(self) -> redis.Redis:
        return self.server.client()

    def _call(self, packed: bytes) -> Any:
        """Send one pre-packed command on a pooled connection and read its reply."""
        pool = self._client.connection_pool
        conn: Any = pool.get_connection()
        try:
            conn.send_packed_command([packed])
            reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _mget(self, ids: U64) -> list[bytes | None]:
        if not len(ids):
            return []
        self.reads += len(ids)
        return cast("list[bytes | None]", self._call(resp_command([b"MGET"], ids)))

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        ids = [salted(p, n) for p, n in zip(prompts, ns, strict=True)]
        values = self._mget(np.concatenate(ids) if ids else np.zeros(0, np.uint64))
        out: list[U64] = []
        off = 0
        for p in prompts:
            vs = values[off: off + len(p)]
            off += len(p)
            hits = cast("list[bytes]", vs[: first_miss(vs)])
            out.append(np.frombuffer(b"".join(hits), dtype="<u8").astype(np.uint64))
        return out

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        if not len(seqs) == len(ns) == len(metas):
            raise ValueError(f"{self.name}: insert_many got {len(seqs)} sequences, "
                             f"{len(ns)} namespaces and {len(metas)} meta arrays")
        ids: list[U64] = []
        for i, (s, n, m) in enumerate(zip(seqs, ns, metas, strict=True)):
            if len(s) != len(m):
                raise ValueError(f"{self.name}: sequence {i}: {len(s)} ids but {len(m)} metas")
            ids.append(salted(s, n))
        firsts = first_absent(ids, lambda q: [v is not None for v in self._mget(q)])
        puts: dict[int, int] = {}
        for q, m, k0 in zip(ids, metas, firsts, strict=True):
            if k0 < len(q):
                for k, mb in zip(q[k0:].tolist(), m[k0:].tolist(), strict=True):
                    puts.setdefault(k, mb)  # the first occurrence in the batch wins
        if puts:
            keys = np.fromiter(puts, dtype=np.uint64, count=len(puts))
            vals = np.fromiter(puts.values(), dtype=np.uint64, count=len(puts))
            head = [b"EVALSHA", self._sha, str(len(puts)).encode()]
            try:
                self._call(resp_command(head, keys, vals))
            except NoScriptError:  # the server restarted: load the script again
                self._sha = self._load_script()
                head[1] = self._sha
                self._call(resp_command(head, keys, vals))
        self.remember_probe(seqs, ns)

    def flush(self) -> None:
        """BGREWRITEAOF and wait for it (after any automatic rewrite already running):
        everything durable, the AOF compacted."""
        try:
            self.server.rewrite_aof()
        except RedisServerError as exc:
            raise BaselineError(f"{self.name}: {exc}") from exc

    def recover(self) -> RecoveryResult:
        ids, ns = self._probe
        expected = self.match_many([ids], [ns])[0]
        keys = be_keys(salted(ids, ns))
        r = self.server.restart(lambda c: c.mget(keys) if keys else c.ping())
        self._sha = self._load_script()
        got = self.match_many([ids], [ns])[0]
        if not np.array_equal(got, expected):
            raise BaselineError(f"{self.name}: the probe matched {len(got)} blocks after the "
                                f"restart, {len(expected)} before")
        n_keys = int(self._client.dbsize())
        return RecoveryResult(  # no interpreter to leave out: both times are the restart's
            seconds=r.first_s, spawn_s=r.first_s,
            detail=(f"redis-server restart: PING answered (data loaded) after {r.ready_s:.3f} "
                    f"s, first MGET ({len(keys)} keys) after {r.first_s:.3f} s; {n_keys} keys, "
                    f"AOF+RDB {self.server.disk_bytes()} B"))

    def memory_bytes(self) -> int:
        return int(self._client.info("memory")["used_memory"])

    def backend_reads(self) -> int:
        return self.reads

    def disk_bytes(self) -> int:
        return self.server.disk_bytes()
