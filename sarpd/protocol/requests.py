"""The one typed decode of a request (PROTOCOL.md): a frame, or a value already
decoded, -> a typed request of `sarpd.model`, or a `BadMessage` naming the field, the
value and the rule. No sockets, no asyncio. Layout, top to bottom:

- `Limits` (the decoder's limits, documented in `sarpd.protocol.wire`), `BadMessage`;
- `read_frame`: msgspec reads a frame whose fields have their wire types (typed, in C;
  a list of 64-bit ids straight into numpy) into the map of its fields, or says no
  (None) when the frame has another shape (unknown or repeated fields, a value of
  another type, bad UTF-8...) or may pass a frame budget: the framing then builds it
  under its budgets (`wire`), so every limit is checked where it always was;
- `parse_message`: that map -> a typed request, every rule in one place (`_OPS`, one
  function per op; field rules below it), in a fixed order, so a message with several
  bad fields names the same one whatever its key order;
- the field rules the client also applies (`show`, `check_uint`, `uint_array`, ...).
"""

from __future__ import annotations

import logging
import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec
import numpy as np

from sarpd.core.ids import check_sequence_tokens
from sarpd.errors import BadRequest, ConfigError, Internal, SarpError, TooLarge, UnknownOp
from sarpd.model import (
    AFTER_SEQ_WAIT_MS,
    Check,
    Clear,
    Dump,
    Hello,
    IdArray,
    Insert,
    Match,
    Ping,
    Remove,
    Report,
    Request,
    SeqSpec,
    Snapshot,
    Stats,
    U32Array,
    U64Array,
    ids_from_bytes,
)

if TYPE_CHECKING:
    from sarpd.config import ServerConfig

__all__ = ["IDS_RULE", "ID_RULE", "META_RULE", "NEWEST_PROTOCOL", "TOKENS_RULE", "BadMessage",
           "Limits", "OddMap", "check_uint", "first_bad", "id_items", "negotiate",
           "parse_message", "parse_report", "read_frame", "show", "too_deep", "uint_array",
           "utf8_len"]

log = logging.getLogger(__name__)
U64_MAX = 2**64 - 1
U32_LIMIT = 2**32
NEWEST_PROTOCOL = 2  # what `hello` can negotiate (PROTOCOL.md "Holders")


@dataclass(frozen=True, slots=True)
class Limits:
    """Decoder limits (see `sarpd.protocol.wire`). ``max_ids=0`` derives the default.
    A limit that is not an int >= 1 is a ConfigError (they come from the config)."""

    max_frame_size: int = 64 * 1024 * 1024
    max_sequence_tokens: int = 1_048_576
    block_tokens: int = 16
    max_ns_bytes: int = 1024
    max_ids: int = 0
    max_map_len: int = 1024
    max_containers: int = 4096
    max_str_bytes: int = 65_536
    max_depth: int = 8
    max_match_holders: int = 1024  # `holders: K` of a match (PROTOCOL.md "Holders")

    def __post_init__(self) -> None:
        for f in fields(self):  # max_ids after the two it derives from
            if f.name == "max_ids" and self.max_ids == 0:
                object.__setattr__(self, "max_ids", self.max_sequence_tokens // self.block_tokens)
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Limits.{f.name}: {value!r} must be an int >= 1")

    @property
    def max_items(self) -> int:
        return 2 * max(self.max_sequence_tokens, self.max_ids)

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Limits:
        return cls(max_frame_size=cfg.max_frame_size,
                   max_sequence_tokens=cfg.index.max_sequence_tokens,
                   block_tokens=cfg.index.block_tokens)


@dataclass(frozen=True, slots=True)
class BadMessage:
    """A message that is not a valid request: answer ``error`` under ``id``, keep going."""

    id: int
    error: SarpError


class OddMap:
    """A map whose keys are not all strings (never a valid request or field): what the
    framing builds for such a map, so that no dict with odd keys is ever made."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


def too_deep(obj: object, limit: int) -> BadMessage | None:
    """A `BadMessage` if maps and arrays nest deeper than `limit` (iterative: no
    recursion however deep the message)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            rid = obj.get("id") if isinstance(obj, dict) else None
            rid = rid if type(rid) is int and 0 <= rid <= U64_MAX else 0
            return BadMessage(
                rid, TooLarge(f"request: nesting depth over {limit} exceeds max_depth ({limit})"))
        kids = (o if isinstance(o, list) else list(o.values()) if isinstance(o, dict)
                else [x for pair in o.pairs for x in pair] if isinstance(o, OddMap) else [])
        stack.extend((c, d + 1) for c in kids if isinstance(c, list | dict | OddMap))
    return None


# ------------------------------------------------------------------ the typed read

_Fields = TypedDict("_Fields", {  # every field of every op, as the wire may carry it
    "id": int | None, "op": str | None, "ns": str | None, "tokens": bytes | list[int] | None,
    "hashes": msgspec.Raw, "ids": msgspec.Raw, "meta": int | bytes | list[int] | None,
    "parent": int | bytes | None, "with_ids": bool | None, "holders": int | None,
    "from": int | None, "mask": int | None, "value": int | None, "fix": bool | None,
    "protocol": int | None, "after_seq": dict[str, int] | None,
    "after_seq_wait_ms": int | None, "source": str | None,
    "counters": dict[str, int | float] | None}, total=False)
_READER = msgspec.msgpack.Decoder(_Fields)
_ANY_IDS = msgspec.msgpack.Decoder(bytes | list[int | bytes] | None)
_UINT64 = b"\xcf"  # msgpack's uint 64 marker (then 8 bytes big-endian)


class _ReadIds:
    """Ids `read_frame` already put in numpy (at most max_ids of them)."""

    __slots__ = ("ids",)

    def __init__(self, ids: IdArray) -> None:
        self.ids = ids


def _pairs(frame: bytes | memoryview) -> int:
    """The pairs of the map `frame` holds (-1: not a map)."""
    head = frame[0] if len(frame) else 0
    if 0x80 <= head <= 0x8F:
        return head & 0x0F
    size = 2 if head == 0xDE else 4 if head == 0xDF else 0
    return int.from_bytes(frame[1 : 1 + size], "big") if size else -1


def read_frame(frame: bytes | memoryview, limits: Limits) -> dict[str, Any] | None:
    """The fields of the request map `frame`, typed by msgspec, or None: another shape,
    or one that may pass a frame budget (the caller then builds it under them).
    Within the budgets by construction: at most 2 levels, 1 + one container per field."""
    n = _pairs(frame)
    if not 0 <= n <= min(limits.max_map_len, 32):
        return None
    try:
        d: dict[str, Any] = _READER.decode(frame)  # type: ignore[assignment]
        for name in ("hashes", "ids"):
            if name in d:
                d[name] = _read_ids(bytes(d[name]), limits)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if len(d) != n:  # an unknown or a repeated key
        return None
    items, containers = n, 1
    for v in d.values():
        if isinstance(v, _ReadIds):
            items, containers = items + len(v.ids), containers + 1
        elif isinstance(v, list | dict):
            containers += 1
            items += len(v)
            if isinstance(v, dict) and (len(v) > limits.max_map_len or not all(
                    len(k) <= limits.max_str_bytes // 4 for k in v)):
                return None
    sizes = [len(v) for v in (d.get("op"), d.get("ns"), d.get("source")) if type(v) is str]
    if items > limits.max_items or containers > min(limits.max_containers, limits.max_depth) \
            or any(size > limits.max_str_bytes // 4 for size in sizes):
        return None
    return d


def _read_ids(raw: bytes, limits: Limits) -> object:
    """hashes / ids from their raw msgpack bytes: an array of uint64s each encoded as
    ``0xcf`` + 8 bytes big-endian (how msgpack writes every uint >= 2**32, so every
    64-bit engine hash but one in 2**32) in one numpy view, any other form as a value."""
    head = raw[0]
    n, start = ((head & 0x0F, 1) if 0x90 <= head <= 0x9F else
                (int.from_bytes(raw[1:3], "big"), 3) if head == 0xDC else
                (int.from_bytes(raw[1:5], "big"), 5) if head == 0xDD else (-1, -1))
    if 0 < n <= limits.max_ids and len(raw) == start + 9 * n and raw[start::9] == _UINT64 * n:
        out = np.zeros((n, 2), dtype=np.uint64)
        out[:, 0] = np.ndarray((n,), ">u8", raw, start + 1, (9,))  # the values, in place
        return _ReadIds(out)
    return _ANY_IDS.decode(raw)


# ------------------------------------------------------------------ requests


def negotiate(requested: int) -> int:
    """The protocol a connection speaks after a `hello` asking for `requested`."""
    return max(1, min(requested, NEWEST_PROTOCOL))


def parse_message(obj: object, limits: Limits, protocol: int = 1) -> Request | BadMessage:
    """One decoded value -> a typed request, or a `BadMessage`. `protocol`: what the
    connection negotiated (`negotiate`); it changes what an insert means."""
    if isinstance(obj, OddMap):
        return BadMessage(0, BadRequest("request: map keys must be strings"))
    if not isinstance(obj, dict):
        return BadMessage(0, BadRequest(f"request: expected a map, got {_kind(obj)}"))
    rid = obj.get("id")
    if type(rid) is not int or not 0 <= rid <= U64_MAX:
        what = "missing" if rid is None else f"{show(rid)} is not a uint64"
        return BadMessage(0, BadRequest(f"id: {what}"))
    try:
        op = obj.get("op")
        if op is None:
            raise BadRequest("op: missing")
        if type(op) is not str:
            raise BadRequest(f"op: {show(op)} is not a str (an op name)")
        parse = _OPS.get(op)
        if parse is None:
            raise UnknownOp(f"op: unknown op {show(op)} (known: {', '.join(sorted(_OPS))})")
        return parse(rid, obj, limits, protocol)
    except SarpError as exc:
        return BadMessage(rid, exc)
    except Exception:  # the one guard of validation: a bug costs one answer, not
        # the connection's other pipelined requests (execution's guard is the service's)
        log.exception("validating request %d failed", rid)
        return BadMessage(rid, Internal("request: validation failed (a bug in sarpd; the "
                                        "sarpd log has the details)"))


_Op = Callable[[int, dict[str, Any], Limits, int], Request]


def _op_hello(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    asked = d.get("protocol")
    if asked is None:
        return Hello(rid)
    if type(asked) is not int or asked < 1:
        raise BadRequest(f"protocol: {show(asked)} is not a uint >= 1 (a protocol version)")
    return Hello(rid, protocol=asked)


def _op_match(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    _refuse(d, "match", "parent")
    k = _uint(d, "holders")
    if d.get("holders") is not None and k == 0:
        raise BadRequest("holders: 0 asks for no holder (1..max_match_holders, or leave it out)")
    if k > limits.max_match_holders:
        raise TooLarge(f"holders: {k:,} exceeds max_match_holders ({limits.max_match_holders:,})")
    wait = AFTER_SEQ_WAIT_MS if d.get("after_seq_wait_ms") is None else _wait_ms(d)
    return Match(rid, seq=_need_seq(d, limits, "match"), with_ids=_bool(d, "with_ids"),
                 holders=k, after_seq=_after_seq(d), after_seq_wait_ms=wait)


MAX_AFTER_SEQ_SHARDS = 1024  # sarpd.core.shards.MAX_SHARDS
MAX_SHARD_NAME_BYTES = 64
MAX_AFTER_SEQ_WAIT_MS = 60_000


def _after_seq(d: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """`after_seq`: shard name -> uint (the newest write sequence the client got)."""
    v = d.get("after_seq")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise BadRequest(f"after_seq: {show(v)} is not a map of shard name -> uint64")
    if len(v) > MAX_AFTER_SEQ_SHARDS:
        raise TooLarge(f"after_seq: {len(v):,} shards exceeds {MAX_AFTER_SEQ_SHARDS:,}")
    out = []
    for shard, seq in v.items():
        if not isinstance(shard, str) or not 0 < utf8_len("after_seq", shard) <= \
                MAX_SHARD_NAME_BYTES:
            raise BadRequest(f"after_seq: shard name {show(shard)} is not a str of "
                             f"1..{MAX_SHARD_NAME_BYTES} bytes")
        out.append((shard, check_uint(f"after_seq[{show(shard)}]", seq)))
    return tuple(out)


def _wait_ms(d: dict[str, Any]) -> int:
    w = _uint(d, "after_seq_wait_ms")
    if w > MAX_AFTER_SEQ_WAIT_MS:
        raise BadRequest(f"after_seq_wait_ms: {w:,} exceeds {MAX_AFTER_SEQ_WAIT_MS:,}")
    return w


def _op_insert(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    seq = _need_seq(d, limits, "insert")
    meta_v = d.get("meta")
    if meta_v is None:
        raise BadRequest("meta: missing (one uint for all blocks, or one per block)")
    blocks = len(seq.tokens) // limits.block_tokens if seq.tokens is not None \
        else len(seq.hashes) if seq.hashes is not None else 0
    meta = _meta(meta_v, blocks, limits)
    parent_v = d.get("parent")
    parent = None if parent_v is None else _one_id(parent_v, "parent")
    return Insert(rid, seq=seq, meta=meta, parent=parent, add_holder=protocol >= 2)


def _op_remove(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    _refuse(d, "remove", "parent")
    seq = _seq(d, limits, "remove", required=False)
    ids_v = d.get("ids")
    holder = None if d.get("meta") is None else _uint(d, "meta")
    if seq is not None and ids_v is not None:
        raise BadRequest("remove: give either tokens/hashes (with from) or ids, not both")
    if ids_v is not None:
        if d.get("from") is not None:
            raise BadRequest("from: only with tokens or hashes, not with ids")
        return Remove(rid, ns=_ns(d, limits), ids=_ids(ids_v, "ids", limits), meta=holder)
    if seq is None:
        raise BadRequest("remove: needs tokens or hashes (with optional from), or ns and ids")
    return Remove(rid, seq=seq, start=_uint(d, "from"), ns=seq.ns, meta=holder)


def _op_clear(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    for name in ("tokens", "hashes", "ids", "parent"):
        _refuse(d, "clear", name, hint="; clear takes ns, mask and value (use remove)")
    if d.get("ns") is None:
        raise BadRequest("ns: missing (clear needs the namespace to clear)")
    mask, value = _uint(d, "mask"), _uint(d, "value")
    if value & ~mask:
        raise BadRequest(f"value: {value:#x} has bits outside mask {mask:#x} (would match nothing)")
    return Clear(rid, ns=_ns(d, limits), mask=mask, value=value)


def _op_dump(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    _refuse(d, "dump", "parent")
    return Dump(rid, seq=_need_seq(d, limits, "dump"))


_OPS: dict[str, _Op] = {  # field-less ops ignore every field
    "hello": _op_hello, "match": _op_match, "insert": _op_insert, "remove": _op_remove,
    "clear": _op_clear, "dump": _op_dump,
    "ping": lambda rid, d, limits, protocol: Ping(rid),
    "stats": lambda rid, d, limits, protocol: Stats(rid),
    "snapshot": lambda rid, d, limits, protocol: Snapshot(rid),
    "check": lambda rid, d, limits, protocol: Check(rid, fix=_bool(d, "fix")),
    "report": lambda rid, d, limits, protocol: parse_report(rid, d),
}


# ------------------------------------------------------------------ field rules

_KIND_NAMES: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str",
                                bytes: "bin", list: "array", dict: "map", type(None): "nil",
                                OddMap: "map"}


def _kind(v: object) -> str:
    """What a value is, in the protocol's words (never a Python or numpy type name)."""
    v = _plain_value(v)
    kind = _KIND_NAMES.get(type(v))
    if kind is not None:
        return kind
    if isinstance(v, bytes | bytearray | memoryview):
        return "bin"
    if isinstance(v, tuple | set | frozenset):
        return "array"
    return "ext" if type(v).__name__ in ("ExtType", "Timestamp", "Ext") else "value"


_repr = reprlib.Repr()  # bounded in depth and length, so any decoded value is safe to show
_repr.maxlevel = 3
_repr.maxstring = _repr.maxother = _repr.maxlong = 40


def _plain_value(v: object) -> object:
    """A numpy scalar or array -> its Python value (so no dtype is ever shown)."""
    return v.item() if isinstance(v, np.generic) else \
        v.tolist() if isinstance(v, np.ndarray) else v


def show(v: object, width: int = 60) -> str:
    """`v` for an error message: a bounded repr (strings and ints cut at 40 chars), numpy
    values as their Python values, other objects by what they are (never a type name)."""
    v = _plain_value(v)
    if isinstance(v, bool | int | float | str | bytes | list | tuple | dict | set | type(None)):
        text = _repr.repr(v)
    else:
        text = f"a {_kind(v)}" if _kind(v) != "value" else "a value of another kind"
    return text if len(text) <= width else f"{text[: width - 3]}..."


def first_bad(items: Sequence[Any], name: str, limit: int, what: str) -> BadRequest:
    """The error naming the first item of `items` that is not an int in 0..limit-1:
    ``tokens[2]: 99999999999999999999999 is not a uint32``."""
    for i, v in enumerate(items):
        if type(v) is not int or not 0 <= v < limit:
            return BadRequest(f"{name}[{i}]: {show(v)} is not a {what}")
    return BadRequest(f"{name}: a value is not a {what}")  # pragma: no cover


def uint_array(items: list[Any], name: str, limit: int, what: str) -> U64Array:
    """A list of ints in 0..limit-1 (limit <= 2**64) as a uint64 array, or the
    `first_bad` error (bools, floats, strings, None, nested lists are refused)."""
    if not set(map(type, items)) <= {int}:
        raise first_bad(items, name, limit, what)
    try:
        arr = np.array(items, dtype=np.uint64)
    except OverflowError as exc:  # a negative int, or one of 2**64 or more
        raise first_bad(items, name, limit, what) from exc
    if limit <= U64_MAX and arr.size and int(arr.max()) >= limit:
        raise first_bad(items, name, limit, what)
    return arr


def utf8_len(name: str, v: str) -> int:
    """The UTF-8 length of `v` (a str the decoder kept with its bad bytes escaped), or
    a BadRequest naming `name` when it is not valid UTF-8."""
    try:
        return len(v.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{name}: {show(v)} is not valid UTF-8") from exc


def check_uint(name: str, v: object, limit: int = U64_MAX + 1, what: str = "uint64") -> int:
    """`v` if it is an int in 0..limit-1 (not a bool), else a BadRequest naming `name`."""
    if type(v) is not int or not 0 <= v < limit:
        raise BadRequest(f"{name}: {show(v)} is not a {what}")
    return v


def _refuse(d: dict[str, Any], op: str, name: str, hint: str = "") -> None:
    if d.get(name) is not None:
        raise BadRequest(f"{name}: not allowed in {op}{hint}")


def _bool(d: dict[str, Any], name: str) -> bool:
    v = d.get(name)
    if v is not None and type(v) is not bool:
        raise BadRequest(f"{name}: {show(v)} is not a bool (true or false)")
    return bool(v)


def _uint(d: dict[str, Any], name: str) -> int:
    """An optional uint64 field (default 0)."""
    v = d.get(name)
    return 0 if v is None else check_uint(name, v)


def _ns(d: dict[str, Any], limits: Limits) -> str:
    v = d.get("ns")
    if v is None:
        return ""
    if type(v) is not str:
        raise BadRequest(f"ns: {show(v)} is not a str (a namespace name)")
    n = utf8_len("ns", v)
    if n > limits.max_ns_bytes:
        raise BadRequest(f"ns: {n} bytes exceeds max_ns_bytes ({limits.max_ns_bytes})")
    return v


def _seq(d: dict[str, Any], limits: Limits, op: str, *, required: bool) -> SeqSpec | None:
    tokens, hashes = d.get("tokens"), d.get("hashes")
    if tokens is not None and hashes is not None:
        raise BadRequest(f"tokens, hashes: {op} takes one of them, not both")
    if tokens is None and hashes is None:
        if required:
            raise BadRequest(f"tokens, hashes: missing ({op} needs one of them)")
        return None
    ns = _ns(d, limits)
    if tokens is not None:
        return SeqSpec(ns=ns, tokens=_tokens(tokens, limits))
    return SeqSpec(ns=ns, hashes=_ids(hashes, "hashes", limits))


def _need_seq(d: dict[str, Any], limits: Limits, op: str) -> SeqSpec:
    seq = _seq(d, limits, op, required=True)
    assert seq is not None
    return seq


TOKENS_RULE = "an array of uint32 token ids or a bin (uint32 LE per token)"
IDS_RULE = "a bin of 16-byte ids or an array of ids (each a uint64 or a 16-byte bin)"
ID_RULE = "uint64 or a 16-byte bin"
META_RULE = "a uint64, an array of uint64 (one per block) or a bin (uint64 LE per block)"


def _tokens(v: object, limits: Limits) -> U32Array:
    if isinstance(v, bytes):
        if len(v) % 4:
            raise BadRequest(
                f"tokens: bin of {len(v)} bytes is not a multiple of 4 (uint32 LE per token)")
        check_sequence_tokens(len(v) // 4, limits.max_sequence_tokens)  # the core's rule
        return np.frombuffer(v, dtype="<u4").astype(np.uint32)
    if not isinstance(v, list):
        raise BadRequest(f"tokens: {show(v)} is not {TOKENS_RULE}")
    check_sequence_tokens(len(v), limits.max_sequence_tokens)
    return uint_array(v, "tokens", U32_LIMIT, "uint32").astype(np.uint32)


def _check_ids_len(n: int, name: str, limits: Limits) -> None:
    if n > limits.max_ids:
        raise TooLarge(f"{name}: {n} ids exceeds max_ids ({limits.max_ids})")


def _ids(v: object, name: str, limits: Limits) -> IdArray:
    """hashes / ids: bin of 16 B per id, or a list of 16-byte bins / uints < 2**64."""
    if isinstance(v, _ReadIds):
        return v.ids
    if isinstance(v, bytes):
        if len(v) % 16:
            raise BadRequest(f"{name}: bin of {len(v)} bytes is not a multiple of 16 (id size)")
        _check_ids_len(len(v) // 16, name, limits)
        return ids_from_bytes(v)
    if not isinstance(v, list):
        raise BadRequest(f"{name}: {show(v)} is not {IDS_RULE}")
    _check_ids_len(len(v), name, limits)
    return id_items(v, name)


def id_items(v: list[Any], name: str) -> IdArray:
    """A list of ids (each a uint64, zero-extended, or a 16-byte bin) -> (n, 2) ids."""
    types = set(map(type, v))
    if types == {bytes} and set(map(len, v)) == {16}:
        return ids_from_bytes(b"".join(v))
    out = np.zeros((len(v), 2), dtype=np.uint64)
    if types <= {int}:
        out[:, 0] = uint_array(v, name, U64_MAX + 1, ID_RULE)
        return out
    for i, item in enumerate(v):
        out[i] = _one_id(item, f"{name}[{i}]")[0]
    return out


def _one_id(v: object, name: str) -> IdArray:
    if isinstance(v, bytes):
        if len(v) != 16:
            raise BadRequest(f"{name}: bin of {len(v)} bytes is not an id (an id takes 16)")
        return ids_from_bytes(v)
    return np.array([[check_uint(name, v, what=ID_RULE), 0]], dtype=np.uint64)


def _meta(v: object, blocks: int, limits: Limits) -> U64Array | int:
    if type(v) is int:
        return check_uint("meta", v)
    if not isinstance(v, bytes | list):
        raise BadRequest(f"meta: {show(v)} is not {META_RULE}")
    if isinstance(v, bytes) and len(v) % 8:
        raise BadRequest(f"meta: bin of {len(v)} bytes is not a multiple of 8 (uint64 LE)")
    n = len(v) // 8 if isinstance(v, bytes) else len(v)
    if n != blocks:
        raise BadRequest(f"meta: {n} values for {blocks} blocks (one uint64 per whole "
                         f"{limits.block_tokens}-token block, or a single uint for all)")
    if isinstance(v, bytes):
        return np.frombuffer(v, dtype="<u8").astype(np.uint64)
    return uint_array(v, "meta", U64_MAX + 1, "uint64")


# -- report (extension op) --------------------------------------------------

MAX_REPORT_COUNTERS = 64  # counters per report
MAX_SOURCE_BYTES = 128
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")  # also a valid Prometheus label value


def parse_report(rid: int, d: Mapping[str, Any]) -> Report:
    """Validate the fields of a ``report`` request (errors name the field and limit).
    Counters keep their kind: an int stays an int (printed without decimals)."""
    source = d.get("source")
    if type(source) is not str or not source:
        raise BadRequest(f"source: {show(source)} is not a non-empty str")
    if utf8_len("source", source) > MAX_SOURCE_BYTES:
        raise TooLarge(f"source: {utf8_len('source', source)} bytes exceeds {MAX_SOURCE_BYTES}")
    counters = d.get("counters")
    if not isinstance(counters, Mapping):
        raise BadRequest(f"counters: {show(counters)} is not a map of name -> number")
    if len(counters) > MAX_REPORT_COUNTERS:
        raise TooLarge(f"counters: {len(counters)} entries exceeds {MAX_REPORT_COUNTERS}")
    out: dict[str, float] = {}
    for name, value in counters.items():
        if type(name) is not str or not _NAME.match(name):
            raise BadRequest(f"counters: name {show(name)} is not [a-z][a-z0-9_]{{0,63}}")
        if not ((type(value) is int and -(2**63) <= value < 2**64)
                or (type(value) is float and math.isfinite(value))):
            raise BadRequest(f"counters.{name}: {show(value)} is not a finite number (an "
                             "int within 64 bits or a float)")
        out[name] = value
    return Report(rid, source, out)
