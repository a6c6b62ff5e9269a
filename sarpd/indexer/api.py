"""The indexer API's requests and answers, as Dynamo's standalone indexer shapes them
(sans-I/O: JSON bytes in, typed requests out; reach in, JSON-ready answers out).

Requests are decoded by msgspec into the structs below (unknown fields ignored, as
serde does): a body that is not JSON is `BadRequest` (HTTP 400), JSON that is not the
request's shape is `FieldError` (HTTP 422, the message names the field: "Object
missing required field `model_name`", "Expected `int` >= 0 - at `$.token_ids[3]`"),
and a request over a limit is `TooLarge` (HTTP 413) naming the limit.

    POST /register       {instance_id, endpoint, model_name, block_size, routing_group?,
                          dp_rank?, replay_endpoint?, additional_salt?|additionalsalt?,
                          tenant_id? (ignored)}                 -> 201 {"status": "ok"}
    POST /unregister     {instance_id, model_name, routing_group?, dp_rank?}
                                                                 -> 200 {"status": "ok"}
    POST /query          {token_ids, model_name, routing_group?, lora_name?, cache_salt?}
    POST /query_by_hash  {block_hashes (int64), model_name, routing_group?, cache_salt: null}
                         -> {"scores": {inst: {rank: tokens}}, "frequencies": [],
                             "instances": {inst: {"longest_matched", "gpu", "dp": {rank:
                             tokens}, "cpu", "disk"}}}
    GET  /workers?model_name=&routing_group=  -> [{instance_id, source, status, model_name,
                          routing_group, block_size, endpoints: {rank: ep}, listeners:
                          {rank: {endpoint, status, last_error?}}}]

Counts are tokens (blocks x block size). docs/HTTP.md is the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from sarpd.errors import BadRequest, TooLarge
from sarpd.events.mapping import TIER_SHIFT, WORKER_SHIFT
from sarpd.indexer.ingest import DEVICE, DISK, HOST

__all__ = [
    "DEFAULT_GROUP",
    "MAX_HOLDERS",
    "MAX_NAME_BYTES",
    "FieldError",
    "Listed",
    "Peer",
    "Query",
    "QueryByHash",
    "Reach",
    "Register",
    "Unregister",
    "answer",
    "decode",
    "device_answer",
    "dump",
    "reach",
    "workers_answer",
]

T = TypeVar("T", "Register", "Unregister", "Query", "QueryByHash", "Peer")
DEFAULT_GROUP = "default"
MAX_NAME_BYTES = 1024  # model_name, routing_group, lora_name, cache_salt, endpoints
MAX_HOLDERS = 1024  # a match's `holders: K` (sarpd's max_match_holders)

U64 = Annotated[int, msgspec.Meta(ge=0)]  # < 2**64 checked by `decode` (msgspec: int64 bounds)
U32 = Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]
I64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Size = Annotated[int, msgspec.Meta(ge=1, lt=1 << 32)]


class FieldError(BadRequest):
    """JSON that is not the request's shape (HTTP 422, Dynamo's status for it)."""


class Register(msgspec.Struct, frozen=True):
    instance_id: U64
    endpoint: str
    model_name: str
    block_size: Size
    routing_group: str = DEFAULT_GROUP
    dp_rank: U32 = 0
    replay_endpoint: str | None = None
    additional_salt: str | None = None  # Mooncake RFC #1403; parsed, not applied (as Dynamo)
    additionalsalt: str | None = None
    tenant_id: str | None = None  # ignored (as Dynamo)


class Peer(msgspec.Struct, frozen=True):
    url: str


class Unregister(msgspec.Struct, frozen=True):
    instance_id: U64
    model_name: str
    routing_group: str = DEFAULT_GROUP
    dp_rank: U32 | None = None  # accepted and ignored: every rank goes (as Dynamo)
    tenant_id: str | None = None


class _Pair(msgspec.Struct, frozen=True, kw_only=True):
    """What every query names: the indexer (`tenant_id`: accepted, ignored)."""

    model_name: str
    routing_group: str = DEFAULT_GROUP
    cache_salt: str | None = None
    tenant_id: str | None = None


class Query(_Pair, frozen=True, kw_only=True):
    token_ids: list[U32]
    lora_name: str | None = None


class QueryByHash(_Pair, frozen=True, kw_only=True):
    block_hashes: list[I64]  # `cache_salt` refused (`decode`)


_NAMES = ("model_name", "routing_group", "lora_name", "cache_salt", "endpoint",
          "replay_endpoint", "url")


def decode(body: bytes, kind: type[T], max_items: int) -> T:
    """`body` as request `kind`; `max_items`: the most token ids / hashes it may carry."""
    try:
        req: T = _decoder(kind).decode(body)
    except msgspec.ValidationError as exc:
        raise FieldError(f"body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise BadRequest(f"body: {exc}") from exc
    if isinstance(req, Register | Unregister) and req.instance_id >= 1 << 64:
        raise FieldError(f"instance_id: {req.instance_id} is not below 2**64 (a u64)")
    for name in _NAMES:
        value = getattr(req, name, None)
        if isinstance(value, str):
            _check_name(name, value)
    items = getattr(req, "token_ids", None) or getattr(req, "block_hashes", None) or ()
    if len(items) > max_items:
        what = "token_ids" if isinstance(req, Query) else "block_hashes"
        raise TooLarge(f"{what}: {len(items)} items exceeds the limit ({max_items})")
    if isinstance(req, QueryByHash) and req.cache_salt is not None:
        raise BadRequest("cache_salt is not accepted by /query_by_hash; block_hashes must "
                         "already include the intended cache salt")
    return req


@functools.cache
def _decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    return msgspec.json.Decoder(kind)


def _check_name(field: str, value: str) -> None:
    n = len(value.encode())
    if n > MAX_NAME_BYTES:
        raise TooLarge(f"{field}: {n} bytes exceeds the limit ({MAX_NAME_BYTES})")
    if "\0" in value:
        raise FieldError(f"{field}: contains a NUL character")


@dataclass(frozen=True, slots=True)
class Reach:
    """One instance's reach in blocks: per dp rank on the device tier, and cumulative
    through the host-pinned and then the disk tier (the longest of its ranks' walks)."""

    dp: Mapping[int, int]
    cpu: int
    disk: int

    @property
    def gpu(self) -> int:
        return max(self.dp.values(), default=0)


def _extend(at: int, runs: Sequence[tuple[int, int]]) -> int:
    """Where a walk that reached block `at` ends on one tier: the end of the run of the
    tier that holds block `at` (each run (start, blocks)), else `at`."""
    for start, n in runs:
        if start <= at < start + n:
            return start + n
    return at


def reach(spans: Iterable[tuple[int, int, int]], ranks: Mapping[int, tuple[int, int]]
          ) -> dict[int, Reach]:
    """Each instance's reach from a match's `spans` (holder, start, blocks); `ranks`:
    worker slot -> (instance id, dp rank). Per rank (Dynamo's walk): the device run
    from block 0, then the host-pinned run that holds the next block, then the disk
    run that holds the block after that; an instance takes the longest of its ranks,
    and lists each rank that reached anything with its device run."""
    runs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for meta, start, n in spans:
        slot, tier = meta >> WORKER_SHIFT, (meta >> TIER_SHIFT) & 0xFF
        runs.setdefault((slot, tier), []).append((start, n))
    out: dict[int, tuple[dict[int, int], int, int]] = {}
    for slot in {slot for slot, _ in runs}:
        who = ranks.get(slot)
        if who is None:
            continue  # a worker unregistered since: its blocks are being cleared
        device = runs.get((slot, DEVICE), [])
        g = next((n for start, n in device if start == 0), 0)
        c = _extend(g, runs.get((slot, HOST), []))
        d = _extend(c, runs.get((slot, DISK), []))
        if not d:
            continue
        dp, cpu, disk = out.setdefault(who[0], ({}, 0, 0))
        dp[who[1]] = g
        out[who[0]] = (dp, max(cpu, c), max(disk, d))
    return {inst: Reach(dp, cpu, disk) for inst, (dp, cpu, disk) in out.items()}


def answer(reach: Mapping[int, Reach], block_size: int) -> dict[str, Any]:
    """A /query answer from each instance's reach (`reach`: instances that reached
    something); `scores` lists the ranks with a device match, of the instances with one."""
    scores: dict[str, dict[str, int]] = {}
    instances: dict[str, dict[str, Any]] = {}
    for inst, r in sorted(reach.items()):
        gpu, cpu, disk = r.gpu, r.cpu, r.disk
        dp = {str(rank): n * block_size for rank, n in sorted(r.dp.items())}
        if gpu:
            scores[str(inst)] = {k: v for k, v in dp.items() if v}
        instances[str(inst)] = {"longest_matched": disk * block_size, "gpu": gpu * block_size,
                                "dp": dp, "cpu": cpu * block_size, "disk": disk * block_size}
    return {"scores": scores, "frequencies": [], "instances": instances}


def device_answer(holders: Iterable[tuple[int, int]], ranks: Mapping[int, tuple[int, int]],
                  block_size: int) -> dict[str, Any]:
    """`answer(reach(...))` of a match whose holders are all device-tier workers, from
    their runs from block 0 (`holders`: (meta, blocks)): the same answer, without the
    walk (the query path of a pair whose workers hold nothing on a lower tier)."""
    best: dict[int, dict[int, int]] = {}
    for meta, n in holders:
        who = ranks.get(meta >> WORKER_SHIFT)
        if who is not None and n:
            best.setdefault(who[0], {})[who[1]] = n
    scores: dict[str, dict[str, int]] = {}
    instances: dict[str, dict[str, Any]] = {}
    for inst in sorted(best):
        dp = {str(rank): n * block_size for rank, n in sorted(best[inst].items())}
        top = max(dp.values())
        scores[str(inst)] = dp
        instances[str(inst)] = {"longest_matched": top, "gpu": top, "dp": dp, "cpu": top,
                                "disk": top}
    return {"scores": scores, "frequencies": [], "instances": instances}


@dataclass(frozen=True, slots=True)
class Listed:
    """A registered worker as /workers lists it (per rank)."""

    instance_id: int
    model: str
    group: str
    block_size: int
    dp_rank: int
    endpoint: str
    status: str  # pending, active, paused, failed
    last_error: str | None = None


_STATUS_ORDER = ("failed", "pending", "active", "paused")  # the aggregate: the first present


def workers_answer(rows: Iterable[Listed]) -> list[dict[str, Any]]:
    """/workers: one entry per (instance, model, group), ranks merged."""
    out: dict[tuple[int, str, str], dict[str, Any]] = {}
    for w in rows:
        e = out.setdefault((w.instance_id, w.model, w.group), {
            "instance_id": w.instance_id, "source": "zmq", "status": w.status,
            "model_name": w.model, "routing_group": w.group, "block_size": w.block_size,
            "endpoints": {}, "listeners": {}})
        e["endpoints"][str(w.dp_rank)] = w.endpoint
        listener: dict[str, Any] = {"endpoint": w.endpoint, "status": w.status}
        if w.last_error is not None:
            listener["last_error"] = w.last_error
        e["listeners"][str(w.dp_rank)] = listener
        states = {v["status"] for v in e["listeners"].values()}
        e["status"] = next(s for s in _STATUS_ORDER if s in states)
    return list(out.values())


_TIER_NAMES = {DEVICE: "device", HOST: "host_pinned", DISK: "disk"}
# a worker's blocks: engine hash -> `sarpd.indexer.ingest.Entry`
Blocks = Mapping[int, tuple[bytes, int, int, int | None, int, int]]


def dump(block_sizes: Mapping[tuple[str, str], int],
         workers: Iterable[tuple[str, str, int, int, Blocks]]) -> dict[str, Any]:
    """/dump as Dynamo's indexer shapes it, from each worker's (model, group, instance,
    rank, blocks): per pair ``"model:group"``, its block size and one stored event per
    block and tier, parents first (by position), so that an indexer loading it (Dynamo's,
    started with ``--peers`` at sarpd) stores every one."""
    rows: dict[tuple[str, str], list[tuple[int, int, dict[str, Any]]]] = {}
    for model, group, instance, rank, blocks in workers:
        out = rows.setdefault((model, group), [])
        for h, (_, tiers, local, parent, pos, _) in blocks.items():
            for tier, name in _TIER_NAMES.items():
                if tiers & 1 << tier:
                    out.append((pos, tier, {
                        "worker_id": instance, "storage_tier": name,
                        "residency_domain": "worker",
                        "event": {"event_id": 0, "data": {"stored": {
                            "parent_hash": parent, "start_position": None,
                            "blocks": [{"block_hash": h, "tokens_hash": local,
                                        "mm_extra_info": None}]}},
                            "dp_rank": rank}}))
    doc: dict[str, Any] = {}
    for (model, group), size in block_sizes.items():
        events = sorted(rows.get((model, group), []), key=lambda r: (r[0], r[1]))
        counters = dict.fromkeys(_TIER_NAMES, 0)
        for _, tier, ev in events:
            ev["event"]["event_id"] = counters[tier]
            counters[tier] += 1
        doc[f"{model}:{group}"] = {"block_size": size, "events": [ev for *_, ev in events]}
    return doc
