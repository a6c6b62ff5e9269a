"""The blocking client: `SyncClient`, `Client`'s (or `ClusterClient`'s) methods on an
event loop of its own.

    with SyncClient("/run/sarpd/sarpd.sock") as client:
        client.insert(tokens=prompt_tokens, meta=worker_slot)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any

from sarpd.client.cluster import ClusterClient
from sarpd.client.conn import Client
from sarpd.client.fields import Ids, Meta, OneId, Result, Tokens
from sarpd.client.ops import REQUEST_TIMEOUT_S, Ops
from sarpd.errors import BadRequest

__all__ = ["SyncClient"]


class SyncClient:
    """A blocking client with the methods of `Ops`, over one sarpd (`Client`) or a
    cluster (`ClusterClient`, from `SyncClient.cluster`), running its own event loop
    in the calling thread (one SyncClient per thread). Usable as a context manager."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 10.0,
                 request_timeout: float | None = REQUEST_TIMEOUT_S) -> None:
        """``timeout``: to connect; ``request_timeout``: per request (`Client.connect`)."""
        self._start(lambda: Client.connect(path, timeout=timeout,
                                           request_timeout=request_timeout))

    @classmethod
    def cluster(cls, urls: str | Sequence[str], *, timeout: float = 30.0) -> SyncClient:
        """A SyncClient over a whole cluster (`ClusterClient.open`)."""
        self = cls.__new__(cls)
        self._start(lambda: ClusterClient.open(urls, timeout=timeout))
        return self

    def _start(self, opener: Callable[[], Coroutine[Any, Any, Ops]]) -> None:
        self._runner = asyncio.Runner()
        try:
            self._client = self._runner.run(opener())
        except BaseException:
            self._runner.close()
            raise
        self._closed = False

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

    def _cluster(self, what: str) -> ClusterClient:
        client = self._client
        if not isinstance(client, ClusterClient):
            raise BadRequest(f"{what}: this client talks to one sarpd, not a cluster")
        return client

    def cluster_status(self) -> Result:
        """`ClusterClient.cluster_status` (a SyncClient made by `SyncClient.cluster`)."""
        return self._runner.run(self._cluster("cluster_status").cluster_status())

    def reshard(self, progress: Callable[[str, int], None] | None = None) -> Result:
        """`ClusterClient.reshard` (a SyncClient made by `SyncClient.cluster`)."""
        return self._runner.run(self._cluster("reshard").reshard(progress))

    def shard_for(self, tokens: Tokens | None = None, hashes: Ids | None = None,
                  ns: str = "") -> str:
        """`ClusterClient.shard_for` (a SyncClient made by `SyncClient.cluster`)."""
        return self._cluster("shard_for").shard_for(tokens, hashes, ns)

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
