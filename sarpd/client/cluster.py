"""A client over a whole cluster (issue 15): `ClusterClient`, sarpd's operations
(`sarpd.client.ops.Ops`) sent by NATS request/reply to the shards.

    client = await ClusterClient.open("nats://10.0.0.1:4222,nats://10.0.0.2:4222")
    hit = await client.match(tokens=prompt_tokens)

nats-py (the ``cluster`` extra) is loaded only when a cluster is opened.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import msgpack

from sarpd.client.fields import Ids, Result, Tokens, seq_fields
from sarpd.client.ops import ConnectFailed, Ops
from sarpd.cluster import route
from sarpd.errors import SarpError
from sarpd.protocol.wire import encode_request, error_from_code

__all__ = ["ATTEMPT_S", "ClusterClient"]

ATTEMPT_S = 5.0  # a cluster request unanswered this long is sent again (same write id)


class ClusterClient(Ops):
    """sarpd's operations over a whole cluster: each request goes, by NATS
    request/reply, to a replica of the shard that holds its sequence
    (`sarpd.cluster.route`), or to every shard when its block 0 is unknown (answers
    merged). Every match carries `after_seq` with the newest `seq` this client got
    from each shard, so it sees every write whose answer this client already has,
    whichever replica took it (PROTOCOL.md "Cluster mode"). Create with
    ``await ClusterClient.open(urls)`` (or ``Client.cluster(urls)``)."""

    def __init__(self, nc: Any, shards: list[str], block_tokens: int,
                 timeout: float) -> None:
        self._nc, self.shards, self.block_tokens = nc, shards, block_tokens
        self.timeout = self.request_timeout = timeout  # each request, retries included
        self._next_id = 1
        self.newest: dict[str, int] = {}  # shard -> the newest write seq answered

    @classmethod
    async def open(cls, urls: str | Sequence[str], *, timeout: float = 30.0) -> ClusterClient:
        """Connect to the NATS cluster at `urls` (comma-separated, or a list) and read
        its shard map."""
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

    async def send(self, op: str, fields: Mapping[str, Any], timeout: float | None) -> Result:
        """One request to its shard(s), within ``timeout`` (None: `self.timeout`),
        retries included."""
        limit = self.timeout if timeout is None else timeout
        sent = {k: v for k, v in fields.items() if v is not None}
        if op == "match" and self.newest:
            sent["after_seq"] = dict(self.newest)
        shard = route.target(op, sent, self.shards, self.block_tokens)
        targets = [shard] if shard is not None else self.shards
        answers = await asyncio.gather(*(self._one(s, op, sent, limit) for s in targets))
        got = answers[0] if len(answers) == 1 else route.merge(op, list(answers))
        if isinstance(got, SarpError):
            raise got
        return got

    async def _one(self, shard: str, op: str, fields: dict[str, Any],
                   limit: float) -> Result | SarpError:
        """One request to a replica of `shard`, sent again (to whichever replica NATS
        picks) when an attempt goes unanswered: a node or a replica went down with it.
        A write carries one write id in all its attempts, so the log applies it once."""
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        frame = encode_request(rid, op, fields)
        headers = {route.WRITE_ID_HEADER: uuid.uuid4().hex} if op in route.WRITE_OPS else None
        deadline = asyncio.get_running_loop().time() + limit
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
                        f"shard {shard}: no replica answered {op} in {limit:g} s "
                        f"(last attempt: {exc or 'no answer'})"))
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
