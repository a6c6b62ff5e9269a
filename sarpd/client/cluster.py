"""A client over a whole cluster (issue 15): `ClusterClient`, sarpd's operations
(`sarpd.client.ops.Ops`) sent by NATS request/reply to the shards.

    client = await ClusterClient.open("nats://10.0.0.1:4222,nats://10.0.0.2:4222")
    hit = await client.match(tokens=prompt_tokens)

nats-py (the ``cluster`` extra) is loaded only when a cluster is opened.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

import msgpack

from sarpd.client.fields import Ids, Result, Tokens, seq_fields
from sarpd.client.ops import ConnectFailed, Ops
from sarpd.cluster import route
from sarpd.cluster.shardmap import ShardMap
from sarpd.core.shards import MAX_HEAD_DEPTH
from sarpd.errors import Moved, SarpError
from sarpd.protocol.wire import encode_request, error_from_code

__all__ = ["ATTEMPT_S", "ClusterClient"]

ATTEMPT_S = 5.0  # a cluster request unanswered this long is sent again (same write id)
MOVED_PAUSE_S = 0.05  # after `moved`, before the map is read again
T = TypeVar("T")


async def _map_work(work: Callable[[], Awaitable[T]], deadline: float) -> T:
    """A read or write of the shard map's bucket (each idempotent: a placement is
    created once and read back) within the request's `deadline` (loop time), tried
    again after each transient failure (`sarpd.cluster.log.retrying`: a NATS node
    going down, or a quorum coming back, can swallow a request; each attempt waits
    ATTEMPT_S at most, the JetStream context's timeout); past it, `unavailable`."""
    from sarpd.cluster import log

    left = max(0.05, deadline - asyncio.get_running_loop().time())
    return await log.retrying(work, "cluster: the shard map's bucket", left)


@dataclass(frozen=True, slots=True)
class _Targets:
    parts: list[tuple[int, dict[str, Any]]]  # shard index, fields; the answering one first
    whole: bool  # the first part's answer is the request's (else: merge every answer)


class ClusterClient(Ops):
    """sarpd's operations over a whole cluster: each request goes, by NATS
    request/reply, to a replica of the shard(s) its shard map names
    (`sarpd.cluster.route`, `sarpd.cluster.shardmap`). Every match carries `after_seq`
    with the newest `seq` this client got from each shard, so it sees every write whose
    answer this client already has, whichever replica took it (PROTOCOL.md "Cluster
    mode"). Create with ``await ClusterClient.open(urls)`` (or ``Client.cluster``).

    Rule `block0` (a version 1 map): a sequence's requests go to the shard of its
    block 0; a request whose block 0 is unknown goes to every shard (answers merged).
    Rule `heads` (version 2): `route.parts`: a match to one shard; a write whole to its
    region's shard and, for its blocks inside shared heads, to every other shard, all
    parts at once, each with its own write id in its shard's log (a resend is applied
    once per shard), answered when every part is. The part its region's shard takes
    carries `route`; a `moved` answer (a split this client's map lacks) re-reads the map
    and sends the request again. A bucket with no placement yet is placed here, once
    for the whole cluster (sarpd.cluster.mapkv)."""

    def __init__(self, nc: Any, smap: ShardMap, block_tokens: int, timeout: float) -> None:
        self._nc, self.smap, self.block_tokens = nc, smap, block_tokens
        self.timeout = self.request_timeout = timeout  # each request, retries included
        self._next_id = 1
        self.newest: dict[str, int] = {}  # shard -> the newest write seq answered
        self.moved = 0  # `moved` answers (rule heads: this client's map was older)
        self._see_seeds()

    @property
    def shards(self) -> list[str]:
        return list(self.smap.names)

    @classmethod
    async def open(cls, urls: str | Sequence[str], *, timeout: float = 30.0) -> ClusterClient:
        """Connect to the NATS cluster at `urls` (comma-separated, or a list) and read
        its shard map."""
        from sarpd.cluster import log, mapkv  # nats: loaded only for a cluster

        servers = [u for u in (urls.split(",") if isinstance(urls, str) else urls) if u]
        try:
            async with asyncio.timeout(timeout):
                nc = await log.connect(servers, name="sarp-client")
        except TimeoutError as exc:
            raise ConnectFailed(f"no NATS server of {','.join(servers)} answered in "
                                f"{timeout:g} s") from exc
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            smap = await _map_work(
                lambda: mapkv.read_shard_map(nc.jetstream(timeout=ATTEMPT_S)), deadline)
            if smap is None:
                raise ConnectFailed(f"cluster {','.join(servers)}: no shard map (key "
                                    f"{route.SHARD_KEY!r} of bucket {route.SHARD_BUCKET!r})")
            self = cls(nc, smap, 16, timeout)
            self.block_tokens = int((await self.request("hello"))["block_tokens"])
        except BaseException:
            await nc.close()
            raise
        return self

    @property
    def path(self) -> str:
        return ",".join(self.shards)

    def _see_seeds(self) -> None:
        """A split's head reached each other shard at its seed seq: a match sent there
        waits for it (after_seq)."""
        for split in self.smap.splits.values():
            for shard, seq in split.seeds.items():
                self.newest[shard] = max(seq, self.newest.get(shard, 0))

    async def reload_map(self) -> None:
        """Read the shard map and its tables again (after a `moved`)."""
        from sarpd.cluster import mapkv

        smap = await mapkv.read_shard_map(self._nc.jetstream(timeout=ATTEMPT_S))
        if smap is not None:
            self.smap = smap
            self._see_seeds()

    def shard_for(self, tokens: Tokens | None = None, hashes: Ids | None = None,
                  ns: str = "") -> str:
        """The shard a match of this sequence goes to now (under rule heads: as far as
        this client's map knows; an unplaced region says shard 0)."""
        fields = seq_fields(tokens, hashes, ns)
        if self.smap.version == 1:
            shard = route.target("match", fields, self.shards, self.block_tokens)
            assert shard is not None  # a match always has one shard
            return shard
        got = route.parts("match", fields, self.smap, self.block_tokens)
        return self.shards[0 if isinstance(got, int) else got[0][0]]

    async def send(self, op: str, fields: Mapping[str, Any], timeout: float | None) -> Result:
        """One request to its shard(s), within ``timeout`` (None: `self.timeout`),
        retries included."""
        limit = self.timeout if timeout is None else timeout
        deadline = asyncio.get_running_loop().time() + limit
        sent = {k: v for k, v in fields.items() if v is not None}
        wid = uuid.uuid4().hex if op in route.WRITE_OPS else None
        while True:
            if op == "match" and self.newest:
                sent["after_seq"] = dict(self.newest)
            targets = await _map_work(partial(self._targets, op, sent), deadline)
            left = max(0.05, deadline - asyncio.get_running_loop().time())
            answers = await asyncio.gather(*(self._one(self.shards[i], op, f, left, w)
                                             for i, f, w in self._ids(targets, wid)))
            first = answers[0]
            if isinstance(first, Moved) and asyncio.get_running_loop().time() < deadline:
                self.moved += 1
                await asyncio.sleep(MOVED_PAUSE_S)  # the split is recorded after its seeds
                await _map_work(self.reload_map, deadline)
                continue
            if not targets.whole:  # a broadcast: one answer made of every shard's
                first = route.merge(op, answers) if len(answers) > 1 else first
            elif not isinstance(first, SarpError):  # a write's every part, or its error
                first = next((a for a in answers if isinstance(a, SarpError)), first)
            if isinstance(first, SarpError):
                raise first
            return first

    async def _targets(self, op: str, sent: dict[str, Any]) -> _Targets:
        """Where a request goes: each shard index and the fields it gets."""
        if self.smap.version == 1 or op not in route.SEQ_OPS or (
                op == "insert" and sent.get("parent") is not None) or (
                op == "remove" and sent.get("ids") is not None):
            shard = route.target(op, sent, self.shards, self.block_tokens)
            everyone = range(len(self.shards)) if shard is None else [self.shards.index(shard)]
            return _Targets([(i, sent) for i in everyone], False)
        ids = route.seq_ids(sent, self.block_tokens, MAX_HEAD_DEPTH + 1)
        if ids is None:
            return _Targets([(0, sent)], True)
        plan = self.smap.plan(ids)
        while plan.unplaced is not None:
            await self._place(plan.unplaced)
            plan = self.smap.plan(ids)
        got = route.parts_of(op, sent, self.smap, self.block_tokens, ids, plan)
        assert not isinstance(got, int)  # placed above
        if op != "dump" and plan.target is not None:  # the region's shard: it checks it
            got[0] = (got[0][0], {**got[0][1], "route": plan.depth})
        return _Targets(got, True)

    async def _place(self, bucket: int) -> None:
        from sarpd.cluster import mapkv

        shard = await mapkv.record_placement(self._nc.jetstream(timeout=ATTEMPT_S),
                                             bucket, self.smap.least_loaded())
        self.smap = self.smap.with_placement(bucket, shard)

    def _ids(self, targets: _Targets, wid: str | None
             ) -> list[tuple[int, dict[str, Any], str | None]]:
        """Each part with its write id: one per shard and content (a part's id names
        its blocks and route, so a resend after `moved` that sends more is new)."""
        if wid is None or not targets.whole:
            return [(i, f, wid) for i, f in targets.parts]
        return [(i, f, f"{wid}.{len(f.get('tokens') or f.get('hashes') or ())}"
                 f".{f.get('route', '-')}") for i, f in targets.parts]

    async def _one(self, shard: str, op: str, fields: dict[str, Any], limit: float,
                   wid: str | None = None) -> Result | SarpError:
        """One request to a replica of `shard`, sent again (to whichever replica NATS
        picks) when an attempt goes unanswered: a node or a replica went down with it.
        A write carries one write id (`wid`) in all its attempts, so the log applies it
        once."""
        rid = self._next_id
        self._next_id = rid + 1 if rid < 2**64 - 1 else 1
        frame = encode_request(rid, op, fields)
        headers = {route.WRITE_ID_HEADER: wid} if wid is not None else None
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

    async def reshard(self, progress: Callable[[str, int], None] | None = None) -> Result:
        """Move this cluster from rule block0 to rule heads, offline, from its shards'
        checkpoints (`sarpd.cluster.reshard`; `progress(shard, segments read)`). Every
        replica and client must start again afterwards (this one reads the new map)."""
        from dataclasses import asdict

        from sarpd.cluster.reshard import reshard

        report = await reshard(self._nc.jetstream(timeout=self.timeout), progress)
        await self.reload_map()
        return asdict(report)

    async def close(self) -> None:
        await self._nc.close()
