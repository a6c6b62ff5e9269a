"""One log entry: the bytes of one write (insert, remove, clear), or of a split of a
shared head (issue 27), in a shard's stream.

Layout (one msgpack map, nothing around it; the stream message's payload):

    {"v": 1,            entry format version (uint; only 1 exists)
     "p": 1 | 2,        the protocol the write was sent under (PROTOCOL.md "Holders":
                        under 2 an insert adds its meta as one more holder)
     "op": "insert" | "remove" | "clear",
     ...the op's fields exactly as PROTOCOL.md's request map has them, in their
     binary forms: "ns" (str), "tokens" (bin, uint32 LE) or "hashes" (bin, 16 B per
     id), "meta" (uint, or bin of uint64 LE), "parent" (bin, 16 B), "from" (uint),
     "ids" (bin, 16 B per id), "mask", "value" (uint), "route" (uint: the request's
     claim, on the part of a write its region's shard takes whole, rule heads)}

    {"v": 1, "p": 1, "op": "split",   the shard splits a shared head it holds
     "ns" (str), "hashes" (bin, 16 B per id: the head's ids, external, from block 0;
     1..MAX_HEAD_DEPTH of them)}      (sarpd.cluster.replica applies it)

No request id: a log entry is not an answer to anyone. Decoding hands the map (with
id 0) to `sarpd.protocol.requests.parse_message`, the one request validation, so an
entry means exactly what the same request means on a socket and is checked against the
same limits; `encode` decodes what it built before returning it, so a write the
replicas would refuse never enters the log. Errors are `BadRequest` (`TooLarge` for a
size limit) naming the field and the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from sarpd.core.shards import MAX_HEAD_DEPTH
from sarpd.errors import BadRequest, TooLarge
from sarpd.model import Clear, IdArray, Insert, Remove, SeqSpec, ids_to_bytes
from sarpd.protocol.requests import (
    NEWEST_PROTOCOL,
    BadMessage,
    Limits,
    parse_message,
    too_deep,
)

ENTRY_VERSION = 1
WRITE_OPS = ("insert", "remove", "clear")
Write = Insert | Remove | Clear
_HEADER = ("v", "p")


@dataclass(frozen=True, slots=True, eq=False)
class SplitHead:
    """A split entry: the shard splits the head `ids` ((d, 2) external ids) of `ns`."""

    ns: str
    ids: IdArray


Entry = Write | SplitHead


def encode_split(ns: str, ids: IdArray) -> bytes:
    """A split entry's bytes (`ids`: the head's external ids, block 0 first)."""
    if not 1 <= len(ids) <= MAX_HEAD_DEPTH:
        raise BadRequest(f"split hashes: {len(ids)} ids is outside 1..{MAX_HEAD_DEPTH}")
    raw: bytes = msgpack.packb({"v": ENTRY_VERSION, "p": 1, "op": "split", "ns": ns,
                                "hashes": ids_to_bytes(ids)}, use_bin_type=True)
    return raw


def encode(req: Write, limits: Limits) -> bytes:
    """A typed write -> its entry bytes (checked by decoding them under `limits`)."""
    if isinstance(req, Insert):
        fields = _insert_fields(req)
    elif isinstance(req, Remove):
        fields = _remove_fields(req)
    elif isinstance(req, Clear):
        fields = {"op": "clear", "ns": req.ns, "mask": req.mask, "value": req.value}
    else:
        raise BadRequest(f"entry op: {type(req).__name__} is not a write ({', '.join(WRITE_OPS)})")
    protocol = 2 if isinstance(req, Insert) and req.add_holder else 1
    raw: bytes = msgpack.packb({"v": ENTRY_VERSION, "p": protocol, **fields}, use_bin_type=True)
    decode(raw, limits)
    return raw


def _seq_fields(seq: SeqSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"ns": seq.ns}
    if seq.tokens is not None:
        out["tokens"] = np.ascontiguousarray(seq.tokens, dtype="<u4").tobytes()
    if seq.hashes is not None:
        out["hashes"] = ids_to_bytes(seq.hashes)
    return out


def _insert_fields(req: Insert) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "insert", **_seq_fields(req.seq)}
    if isinstance(req.meta, int):
        out["meta"] = req.meta
    else:
        out["meta"] = np.ascontiguousarray(req.meta, dtype="<u8").tobytes()
    if req.parent is not None:
        out["parent"] = ids_to_bytes(req.parent)
    if req.route is not None:
        out["route"] = req.route
    return out


def _remove_fields(req: Remove) -> dict[str, Any]:
    if req.seq is not None:
        out: dict[str, Any] = {"op": "remove", **_seq_fields(req.seq), "from": req.start}
    elif req.ids is not None:
        out = {"op": "remove", "ns": req.ns, "ids": ids_to_bytes(req.ids)}
    else:
        raise BadRequest("entry remove: needs seq or ids")
    if req.meta is not None:
        out["meta"] = req.meta
    if req.route is not None:
        out["route"] = req.route
    return out


def decode(raw: bytes, limits: Limits) -> Entry:
    """Entry bytes -> the typed write (or split) they hold, validated as a request under
    `limits`."""
    if len(raw) > limits.max_frame_size:
        raise TooLarge(f"entry: {len(raw):,} bytes exceeds max_frame_size "
                       f"({limits.max_frame_size:,})")
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True,
                              max_map_len=limits.max_map_len,
                              max_str_len=limits.max_str_bytes)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.UnpackException) as exc:
        raise BadRequest(f"entry: not one msgpack value ({exc})") from exc
    if not isinstance(obj, dict) or not all(type(k) is str for k in obj):
        raise BadRequest("entry: expected a map with str keys")
    deep = too_deep(obj, limits.max_depth)
    if deep is not None:
        raise deep.error
    protocol = _header(obj)
    op = obj.get("op")
    if op == "split":
        return _split(obj)
    if op not in WRITE_OPS:
        raise BadRequest(f"entry op: {op!r} is not a write ({', '.join(WRITE_OPS)})")
    fields = {k: v for k, v in obj.items() if k not in _HEADER}
    fields["id"] = 0
    req = parse_message(fields, limits, protocol)
    if isinstance(req, BadMessage):
        raise req.error
    assert isinstance(req, Insert | Remove | Clear)  # op is a write: parse gave its type
    return req


def _split(obj: dict[str, Any]) -> SplitHead:
    ns, hashes = obj.get("ns"), obj.get("hashes")
    if not isinstance(ns, str):
        raise BadRequest(f"entry split ns: {str(ns)[:60]!r} is not a str")
    if not isinstance(hashes, bytes) or len(hashes) % 16 or not \
            1 <= len(hashes) // 16 <= MAX_HEAD_DEPTH:
        raise BadRequest(f"entry split hashes: not a bin of 1..{MAX_HEAD_DEPTH} 16-byte ids")
    ids = np.frombuffer(hashes, dtype="<u8").astype(np.uint64).reshape(-1, 2)
    return SplitHead(ns, ids)


def _header(obj: dict[str, Any]) -> int:
    v, p = obj.get("v"), obj.get("p")
    if v != ENTRY_VERSION or type(v) is not int:
        raise BadRequest(f"entry v: {v!r} is not a known entry version ({ENTRY_VERSION})")
    if type(p) is not int or not 1 <= p <= NEWEST_PROTOCOL:
        raise BadRequest(f"entry p: {p!r} is not a protocol version (1..{NEWEST_PROTOCOL})")
    return p
