"""The operations of sarpd (PROTOCOL.md), over any transport: `Ops`.

`Ops` turns each operation's Python arguments into request fields, checked before
anything is sent (`sarpd.client.fields`), and decodes what comes back. It sends
nothing itself: its one abstract method, `Ops.send`, takes a request to sarpd and
returns its answer. `sarpd.client.Client` sends on one Unix socket,
`sarpd.client.ClusterClient` to the shards of a cluster (NATS); `SyncClient` wraps
either.

The connection errors every transport raises (`SarpConnectionError` and its
subclasses) and the default request timeout live here too.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from sarpd.client.fields import (
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

__all__ = ["REQUEST_TIMEOUT_S", "ConnectFailed", "ConnectionLost", "Ops", "RequestTimeout",
           "SarpConnectionError", "timeout_arg"]

# How long a request may go unanswered before `RequestTimeout`. A match or an insert
# takes milliseconds, and tens of ms queued behind a full batch under load; a sync
# insert waits for an fsync (tens of ms on a slow disk). 10 s is far past any of that,
# yet short enough that a stuck daemon is reported before an operator gives up.
# `check` and `snapshot` read or write the whole index: they wait without a limit by
# default, once a `ping` within this timeout has shown that sarpd answers.
REQUEST_TIMEOUT_S = 10.0


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


def timeout_arg(name: str, v: float | None) -> float | None:
    """A timeout in seconds (> 0, finite), or None for no limit; else a ValueError."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
        raise ValueError(f"{name}: {show(v)} is not a number of seconds > 0 (None: no limit)")
    return float(v)


class Ops(ABC):
    """sarpd's operations as methods, over the transport of a subclass (`send`).

    Every method returns the result fields of the response as a dict (without ``id``
    and ``ok``); ``match`` decodes ``meta`` to a list of ints and ``ids`` to a list of
    16-byte ids. An error response raises the `SarpError` subclass of its code."""

    request_timeout: float | None = REQUEST_TIMEOUT_S  # None: no limit

    @property
    @abstractmethod
    def path(self) -> str:
        """Where the requests go (a socket path, or a cluster's shards)."""

    @abstractmethod
    async def send(self, op: str, fields: Mapping[str, Any], timeout: float | None) -> Result:
        """Send one request and return its result fields (raise the SarpError of an
        error response, `RequestTimeout` past ``timeout`` seconds; None: no limit)."""

    @abstractmethod
    async def close(self) -> None:
        """Let go of the transport; requests still in flight fail."""

    async def request(self, op: str, **fields: Any) -> Result:
        """Send one request (fields whose value is None are left out) and wait for its
        response, at most `request_timeout` seconds (then `RequestTimeout`). Returns the
        result fields; raises the SarpError of an error response."""
        return await self.send(op, fields, self.request_timeout)

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
        timeout = timeout_arg("timeout", timeout)
        if timeout is None:
            await self.ping()  # a daemon that answers nothing fails here, in time
        return await self.send(op, fields, timeout)

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
