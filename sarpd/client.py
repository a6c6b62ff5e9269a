"""Python client of sarpd (PROTOCOL.md): `Client` (asyncio, pipelined) and `SyncClient`.

    client = await Client.connect("/run/sarpd/sarpd.sock")
    await client.insert(tokens=prompt_tokens, meta=worker_slot)
    hit = await client.match(tokens=prompt_tokens)   # {"blocks", "tokens", "meta": [...]}

Any number of requests may be in flight at once (``asyncio.gather`` them); responses
are matched to requests by id. Every method returns the result fields of the
response as a dict (without ``id`` and ``ok``); ``match`` decodes ``meta`` to a list
of ints and ``ids`` to a list of 16-byte ids. An error response raises the
`SarpError` subclass of its code. A lost connection fails every request in flight,
and every later one, with `ConnectionLost`.

Tokens go out as ``bin`` of little-endian uint32; ids given as bytes or an (n, 2)
uint64 array go out as ``bin`` of 16 bytes per id, a 1-D array as a list of uints,
and a list as given (ints or 16-byte ids).
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import msgpack

from sarpd.cluster import route
from sarpd.errors import BadRequest, SarpError
from sarpd.protocol.fields import (
    Ids,
    Meta,
    OneId,
    Result,
    Tokens,
    bool_arg,
    decode_match,
    ids_field,
    meta_field,
    one_id_field,
    seq_fields,
    uint_arg,
)
from sarpd.protocol.requests import parse_report, show
from sarpd.protocol.wire import encode_request, error_from_code

__all__ = ["REQUEST_TIMEOUT_S", "Client", "ClusterClient", "ConnectFailed", "ConnectionLost",
           "RequestTimeout", "SarpConnectionError", "SyncClient"]


MAX_RESPONSE_BYTES = 256 * 1024 * 1024
# How long a request may go unanswered before `RequestTimeout`. A match or an insert
# takes milliseconds, and tens of ms queued behind a full batch under load; a sync
# insert waits for an fsync (tens of ms on a slow disk). 10 s is far past any of that,
# yet short enough that a stuck daemon is reported before an operator gives up.
# `check` and `snapshot` read or write the whole index: they wait without a limit by
# default, once a `ping` within this timeout has shown that sarpd answers.
REQUEST_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 1.0  # close: how long unsent bytes may take before they are dropped
ATTEMPT_S = 5.0  # a cluster request unanswered this long is sent again (same write id)


class SarpConnectionError(ConnectionError):
    """The client has no usable connection to sarpd."""


class ConnectFailed(SarpConnectionError):
    """Could not connect (the message names the socket path and the reason)."""


class ConnectionLost(SarpConnectionError):
    """The connection went away with requests in flight, or before a request."""


class RequestTimeout(SarpConnectionError):
    """sarpd did not answer a request in time (the message names the socket, the op and
    the timeout). The connection stays usable: the late answer, if it comes, is dropped
    (answers are matched by request id, never handed to a later request)."""


def _timeout_arg(name: str, v: float | None) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise ValueError(f"{name}: {show(v)} is not a number of seconds > 0 (None: no limit)")
    return float(v)


class _Conn(asyncio.Protocol):
    """The connection state: pending futures by request id, response unpacker."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[Result]] = {}
        self.lost: str | None = None  # why the connection is gone
        self.server_error: SarpError | None = None  # an id-0 error before the close
        self.closed = asyncio.get_running_loop().create_future()
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_RESPONSE_BYTES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._unpacker.feed(data)
            for msg in self._unpacker:
                self._dispatch(msg)
        except Exception as exc:
            self.abort(f"bad response from sarpd ({exc or 'not a response map'})")

    def _dispatch(self, msg: object) -> None:
        if not isinstance(msg, dict) or type(msg.get("id")) is not int:
            raise ValueError(f"expected a response map with an id, got {msg!r:.80}")
        rid, ok = msg["id"], msg.get("ok")
        if ok is True:
            outcome: Result | SarpError = msg
        else:
            error = msg.get("error")
            if not isinstance(error, dict):
                raise ValueError(f"response {rid}: ok is {ok!r} and no error map")
            outcome = error_from_code(str(error.get("code")), str(error.get("message")))
        fut = self.pending.pop(rid, None)
        if fut is None:
            if rid == 0 and isinstance(outcome, SarpError):  # a stream error: close follows
                self.server_error = outcome
            return  # else: its caller was cancelled
        if fut.done():
            return
        if isinstance(outcome, SarpError):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def abort(self, reason: str) -> None:
        self.lost = self.lost or reason
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.server_error is not None:
            err = self.server_error
            reason = f"closed by sarpd after a stream error ({err.code}: {err.message})"
        elif isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror
        elif exc is not None:
            reason = str(exc) or "the transport failed"
        else:
            reason = "closed by sarpd"
        self.lost = self.lost or reason
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self.lost_error())
        self._wake_writers(self.lost_error())
        if not self.closed.done():
            self.closed.set_result(None)

    def lost_error(self) -> ConnectionLost:
        err = ConnectionLost(f"connection to sarpd at {self.path} lost: {self.lost}")
        err.__cause__ = self.server_error
        return err

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers(None)

    def _wake_writers(self, exc: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if w.done():
                continue
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)

    async def drain(self) -> None:
        if self._paused and self.lost is None:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter


class Client:
    """A pipelined asyncio connection to sarpd. Create with ``await Client.connect()``."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._next_id = 1  # 0 is what the server uses for stream errors
        self.request_timeout: float | None = REQUEST_TIMEOUT_S  # None: no limit

    @property
    def path(self) -> str:
        return self._conn.path

    @classmethod
    async def cluster(cls, urls: str | Sequence[str], *, timeout: float = 30.0,
                      ) -> ClusterClient:
        """A client over a whole cluster (NATS URLs; `ClusterClient`)."""
        return await ClusterClient.open(urls, timeout=timeout)

    @classmethod
    async def connect(cls, path: str | os.PathLike[str], *, timeout: float = 10.0,
                      request_timeout: float | None = REQUEST_TIMEOUT_S) -> Client:
        """Connect to the sarpd socket at ``path``; `ConnectFailed` says why not.
        ``timeout``: for the connection; ``request_timeout``: how long each request may
        go unanswered before `RequestTimeout` (None: no limit)."""
        spath = os.fspath(path)
        request_timeout = _timeout_arg("request_timeout", request_timeout)
        loop = asyncio.get_running_loop()
        try:
            transport, conn = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _Conn(spath), spath), timeout
            )
        except FileNotFoundError as exc:
            msg = f"sarpd socket {spath} does not exist (is sarpd running with --socket {spath}?)"
            raise ConnectFailed(msg) from exc
        except ConnectionRefusedError as exc:
            raise ConnectFailed(f"nothing listens on sarpd socket {spath} (stale?)") from exc
        except PermissionError as exc:
            msg = f"no permission to connect to sarpd socket {spath} (check its group)"
            raise ConnectFailed(msg) from exc
        except TimeoutError as exc:
            raise ConnectFailed(
                f"connecting to sarpd socket {spath}: no answer in {timeout}s"
            ) from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to sarpd socket {spath}: {exc}") from exc
        if conn.transport is None:  # uvloop calls connection_made a little later
            conn.transport = transport
        client = cls(conn)
        client.request_timeout = request_timeout
        return client

    async def request(self, op: str, **fields: Any) -> Result:
        """Send one request (fields whose value is None are left out) and wait for its
        response, at most `request_timeout` seconds (then `RequestTimeout`). Returns the
        result fields; raises the SarpError of an error response."""
        return await self._send(op, fields, self.request_timeout)

    async def _send(self, op: str, fields: dict[str, Any], timeout: float | None) -> Result:
        conn = self._conn
        if conn.lost is not None or conn.transport is None:
            raise conn.lost_error()
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        frame = encode_request(rid, op, fields)
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = fut
        try:
            conn.transport.write(frame)
            async with asyncio.timeout(timeout):
                await conn.drain()
                msg = await fut
        except TimeoutError as exc:
            raise RequestTimeout(
                f"sarpd at {conn.path} did not answer {op} within {timeout:g} s (the request "
                "timeout): it is stuck, overloaded, or not sarpd") from exc
        finally:
            conn.pending.pop(rid, None)  # a late answer finds no request: dropped
        msg.pop("id", None)
        msg.pop("ok", None)
        return msg

    async def hello(self, protocol: int | None = None) -> Result:
        """Server facts; with ``protocol=2`` this connection speaks protocol 2 from now
        on (an insert by another holder adds it to blocks already indexed; PROTOCOL.md
        "Holders"): the answer says ``protocol`` and ``holders``."""
        if protocol is None:
            return await self.request("hello")
        return await self.request("hello", protocol=uint_arg("protocol", protocol))

    async def ping(self) -> Result:
        return await self.request("ping")

    async def stats(self) -> Result:
        return await self.request("stats")

    async def snapshot(self, timeout: float | None = None) -> Result:
        """Write a snapshot now. Waits without a limit by default (after a `ping` within
        the request timeout shows sarpd answers); ``timeout`` sets one."""
        return await self._admin("snapshot", {}, timeout)

    async def check(self, fix: bool = False, timeout: float | None = None) -> Result:
        """Verify (``fix``: repair) every segment: as long as the index is large, so
        without a limit by default, like `snapshot`; ``timeout`` sets one."""
        return await self._admin("check", {"fix": bool_arg("fix", fix)}, timeout)

    async def _admin(self, op: str, fields: dict[str, Any], timeout: float | None) -> Result:
        timeout = _timeout_arg("timeout", timeout)
        if timeout is None:
            await self.ping()  # a daemon that answers nothing fails here, in time
        return await self._send(op, fields, timeout)

    async def report(self, source: str, counters: Mapping[str, float]) -> Result:
        """Report this client's own counters (the `report` extension op): sarpd shows
        the newest report of each source in `stats` and its metrics."""
        parse_report(0, {"source": source, "counters": counters})  # the server's rules
        return await self.request("report", source=source, counters=dict(counters))

    async def dump(
        self, tokens: Tokens | None = None, hashes: Ids | None = None, ns: str = ""
    ) -> Result:
        """Routing entries and segments of one sequence (the `dump` extension op)."""
        return await self.request("dump", **seq_fields(tokens, hashes, ns))

    async def match(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        ns: str = "",
        with_ids: bool = False,
        holders: int = 0,
    ) -> Result:
        """The longest indexed prefix: ``blocks``, ``tokens``, ``meta`` (list of int)
        and, with ``with_ids``, ``ids`` (list of 16-byte ids); with ``holders=K``,
        ``holders``: up to K ``[meta, blocks]`` pairs, longest run first."""
        fields = seq_fields(tokens, hashes, ns)
        if bool_arg("with_ids", with_ids):
            fields["with_ids"] = True
        if uint_arg("holders", holders):
            fields["holders"] = int(holders)
        return decode_match(await self.request("match", **fields))

    async def insert(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        meta: Meta = 0,
        ns: str = "",
        parent: OneId | None = None,
    ) -> Result:
        """Index a sequence (after ``parent`` when given): ``blocks``, ``new_blocks``,
        ``matched_blocks``. ``meta``: one uint for all blocks, or one per block."""
        fields = seq_fields(tokens, hashes, ns)
        fields["meta"] = meta_field(meta)
        if parent is not None:
            fields["parent"] = one_id_field(parent, "parent")
        return await self.request("insert", **fields)

    async def remove(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        start: int = 0,
        ns: str = "",
        ids: Ids | None = None,
        meta: int | None = None,
    ) -> Result:
        """Remove blocks ``start``.. of a sequence, or the bare ``ids``: ``removed``
        (blocks left with no holder). ``meta``: take only that holder off."""
        fields = seq_fields(tokens, hashes, ns)
        if uint_arg("from", start):
            fields["from"] = int(start)
        if ids is not None:
            fields["ids"] = ids_field(ids, "ids")
        if meta is not None:
            fields["meta"] = uint_arg("meta", meta)
        return await self.request("remove", **fields)

    async def clear(self, ns: str, mask: int = 0, value: int = 0) -> Result:
        """Take off every holder in ``ns`` whose ``meta & mask == value``: ``removed``
        (blocks left with no holder)."""
        seq_fields(None, None, ns)  # the same check of ns
        return await self.request("clear", ns=ns, mask=uint_arg("mask", mask),
                                  value=uint_arg("value", value))

    async def close(self) -> None:
        """Close the connection; requests still in flight fail with ConnectionLost."""
        conn = self._conn
        if conn.transport is not None and not conn.closed.done():
            conn.lost = conn.lost or "closed by the client"
            conn.transport.close()
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(conn.closed)
            except TimeoutError:  # sarpd reads nothing: drop the bytes it did not take
                conn.transport.abort()
        await conn.closed

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


# ------------------------------------------------------------------ a whole cluster


class ClusterClient(Client):
    """`Client`'s methods over a whole cluster (issue 15): each request goes, by NATS
    request/reply, to a replica of the shard that holds its sequence
    (`sarpd.cluster.route`), or to every shard when its block 0 is unknown (answers
    merged). Every match carries `after_seq` with the newest `seq` this client got
    from each shard, so it sees every write whose answer this client already has,
    whichever replica took it (PROTOCOL.md "Cluster mode")."""

    def __init__(self, nc: Any, shards: list[str], block_tokens: int,
                 timeout: float) -> None:
        self._nc, self.shards, self.block_tokens = nc, shards, block_tokens
        self.timeout = self.request_timeout = timeout
        self._next_id = 1
        self.newest: dict[str, int] = {}  # shard -> the newest write seq answered

    @classmethod
    async def open(cls, urls: str | Sequence[str], *, timeout: float = 30.0) -> ClusterClient:
        """Connect to the NATS cluster at `urls` (comma-separated, or a list) and read
        its shard map."""
        import json

        from sarpd.cluster import log  # nats: loaded only for a cluster

        servers = [u for u in (urls.split(",") if isinstance(urls, str) else urls) if u]
        try:
            async with asyncio.timeout(timeout):
                nc = await log.connect(servers, name="sarp-client")
        except TimeoutError as exc:
            raise ConnectFailed(f"no NATS server of {','.join(servers)} answered in "
                                f"{timeout:g} s") from exc
        try:
            kv = await nc.jetstream(timeout=timeout).key_value(route.SHARD_BUCKET)
            entry = await kv.get(route.SHARD_KEY)
            names = route.check_map(json.loads(entry.value or b"null"))
            self = cls(nc, names, 16, timeout)
            self.block_tokens = int((await self.request("hello"))["block_tokens"])
        except BaseException:
            await nc.close()
            raise
        return self

    @property
    def path(self) -> str:
        return ",".join(self.shards)

    def shard_for(self, tokens: Tokens | None = None, hashes: Ids | None = None,
                  ns: str = "") -> str:
        """The shard that holds this sequence (the one its requests go to)."""
        shard = route.target("match", seq_fields(tokens, hashes, ns), self.shards,
                             self.block_tokens)
        assert shard is not None  # a match always has one shard
        return shard

    async def _send(self, op: str, fields: dict[str, Any], timeout: float | None) -> Result:
        """One request to its shard(s); `self.timeout` bounds it (retries included)."""
        fields = {k: v for k, v in fields.items() if v is not None}
        if op == "match" and self.newest:
            fields["after_seq"] = dict(self.newest)
        shard = route.target(op, fields, self.shards, self.block_tokens)
        targets = [shard] if shard is not None else self.shards
        answers = await asyncio.gather(*(self._one(s, op, fields) for s in targets))
        got = answers[0] if len(answers) == 1 else route.merge(op, list(answers))
        if isinstance(got, SarpError):
            raise got
        return got

    async def _one(self, shard: str, op: str, fields: dict[str, Any]) -> Result | SarpError:
        """One request to a replica of `shard`, sent again (to whichever replica NATS
        picks) when an attempt goes unanswered: a node or a replica went down with it.
        A write carries one write id in all its attempts, so the log applies it once."""
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        frame = encode_request(rid, op, fields)
        headers = {route.WRITE_ID_HEADER: uuid.uuid4().hex} if op in route.WRITE_OPS else None
        deadline = asyncio.get_running_loop().time() + self.timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                msg = await self._nc.request(route.request_subject(shard), frame,
                                             timeout=max(0.05, min(ATTEMPT_S, left)),
                                             headers=headers)
                break
            except Exception as exc:  # unanswered: try again until the deadline
                if left <= ATTEMPT_S:
                    return error_from_code("unavailable", (
                        f"shard {shard}: no replica answered {op} in {self.timeout:g} s: "
                        f"{type(exc).__name__}: {exc}"))
                await asyncio.sleep(0.05)
        resp = msgpack.unpackb(msg.data, raw=False)
        if resp.get("ok") is not True:
            error = resp.get("error") or {}
            return error_from_code(str(error.get("code")), str(error.get("message")))
        seq = resp.get("seq")
        if isinstance(seq, int):
            self.newest[shard] = max(seq, self.newest.get(shard, 0))
        resp.pop("id", None)
        resp.pop("ok", None)
        return cast(Result, resp)

    async def cluster_status(self) -> Result:
        """Per shard: the log's range and leader, the newest checkpoint, each
        replica's applied sequence, lag and report age
        (`sarpd.cluster.node.read_status`)."""
        from sarpd.cluster.node import read_status

        return await read_status(self._nc.jetstream(timeout=self.timeout))

    async def close(self) -> None:
        await self._nc.close()


# ----------------------------------------------------------------------- sync wrapper


class SyncClient:
    """A blocking client with the methods of `Client`, running its own event loop in
    the calling thread (one SyncClient per thread). Usable as a context manager."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 10.0,
                 request_timeout: float | None = REQUEST_TIMEOUT_S) -> None:
        """``timeout``: to connect; ``request_timeout``: per request (`Client.connect`)."""
        self._runner = asyncio.Runner()
        try:
            self._client = self._runner.run(
                Client.connect(path, timeout=timeout, request_timeout=request_timeout))
        except BaseException:
            self._runner.close()
            raise
        self._closed = False

    @classmethod
    def cluster(cls, urls: str | Sequence[str], *, timeout: float = 30.0) -> SyncClient:
        """A SyncClient over a whole cluster (`ClusterClient`)."""
        self = cls.__new__(cls)
        self._runner = asyncio.Runner()
        try:
            self._client = self._runner.run(ClusterClient.open(urls, timeout=timeout))
        except BaseException:
            self._runner.close()
            raise
        self._closed = False
        return self

    @property
    def path(self) -> str:
        return self._client.path

    def request(self, op: str, **fields: Any) -> Result:
        return self._runner.run(self._client.request(op, **fields))

    def hello(self, protocol: int | None = None) -> Result:
        return self._runner.run(self._client.hello(protocol))

    def ping(self) -> Result:
        return self._runner.run(self._client.ping())

    def stats(self) -> Result:
        return self._runner.run(self._client.stats())

    def snapshot(self, timeout: float | None = None) -> Result:
        return self._runner.run(self._client.snapshot(timeout))

    def check(self, fix: bool = False, timeout: float | None = None) -> Result:
        return self._runner.run(self._client.check(fix, timeout))

    def dump(
        self, tokens: Tokens | None = None, hashes: Ids | None = None, ns: str = ""
    ) -> Result:
        return self._runner.run(self._client.dump(tokens, hashes, ns))

    def report(self, source: str, counters: Mapping[str, float]) -> Result:
        return self._runner.run(self._client.report(source, counters))

    def match(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        ns: str = "",
        with_ids: bool = False,
        holders: int = 0,
    ) -> Result:
        return self._runner.run(self._client.match(tokens, hashes, ns, with_ids, holders))

    def insert(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        meta: Meta = 0,
        ns: str = "",
        parent: OneId | None = None,
    ) -> Result:
        return self._runner.run(self._client.insert(tokens, hashes, meta, ns, parent))

    def remove(
        self,
        tokens: Tokens | None = None,
        hashes: Ids | None = None,
        start: int = 0,
        ns: str = "",
        ids: Ids | None = None,
        meta: int | None = None,
    ) -> Result:
        return self._runner.run(self._client.remove(tokens, hashes, start, ns, ids, meta))

    def clear(self, ns: str, mask: int = 0, value: int = 0) -> Result:
        return self._runner.run(self._client.clear(ns, mask, value))

    def cluster_status(self) -> Result:
        """`ClusterClient.cluster_status` (a SyncClient made by `SyncClient.cluster`)."""
        client = self._client
        if not isinstance(client, ClusterClient):
            raise BadRequest("cluster_status: this client talks to one sarpd, not a cluster")
        return self._runner.run(client.cluster_status())

    def shard_for(self, tokens: Tokens | None = None, hashes: Ids | None = None,
                  ns: str = "") -> str:
        """`ClusterClient.shard_for` (a SyncClient made by `SyncClient.cluster`)."""
        client = self._client
        if not isinstance(client, ClusterClient):
            raise BadRequest("shard_for: this client talks to one sarpd, not a cluster")
        return client.shard_for(tokens, hashes, ns)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
