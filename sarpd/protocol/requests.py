"""The one typed decode of a request (PROTOCOL.md), no sockets, no asyncio: a frame, or
a map the framing built, -> a typed request of `sarpd.model`, or a `BadMessage` naming
the field, the value and the rule. Layout: `Limits`, `BadMessage`, `OddMap`, `too_deep`;
`read_frame` (msgspec reads a frame into `Fields`, each field as the wire types it, or
says None: another type, bad UTF-8, an unknown field, a frame that might pass a budget);
`parse_message` (one set of rules, `_OPS`, in a fixed order: several bad fields name the
same one whatever their order); the field rules the client also applies (`show`, ...).
"""

from __future__ import annotations

import logging
import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from sarpd import model
from sarpd.core.ids import check_sequence_tokens
from sarpd.core.shards import MAX_HEAD_DEPTH, MAX_SHARDS  # `route`; the shards `after_seq` may name
from sarpd.errors import BadRequest, ConfigError, Internal, SarpError, TooLarge, UnknownOp
from sarpd.model import IdArray, Request, U32Array, U64Array

if TYPE_CHECKING:
    from sarpd.config import ServerConfig

__all__ = ["IDS_RULE", "ID_RULE", "META_RULE", "NEWEST_PROTOCOL", "TOKENS_RULE", "BadMessage",
           "Fields", "Limits", "OddMap", "check_uint", "first_bad", "id_items", "negotiate",
           "parse_message", "parse_report", "read_frame", "show", "too_deep", "uint_array",
           "utf8_len"]

log = logging.getLogger(__name__)
U64_MAX = 2**64 - 1
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
    max_items: int = field(default=0, init=False, repr=False)  # 2 * max(tokens, ids)

    def __post_init__(self) -> None:
        for f in fields(self):  # the derived ones after those they derive from
            if f.name == "max_ids" and self.max_ids == 0:
                object.__setattr__(self, "max_ids", self.max_sequence_tokens // self.block_tokens)
            if f.name == "max_items":
                object.__setattr__(self, f.name, 2 * max(self.max_sequence_tokens, self.max_ids))
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Limits.{f.name}: {value!r} must be an int >= 1")

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


@dataclass(slots=True)
class OddMap:
    """A map whose keys are not all strings (never a valid request or field): what the
    framing builds for such a map, so that no dict with odd keys is ever made."""

    pairs: list[tuple[Any, Any]]


def too_deep(obj: object, limit: int) -> BadMessage | None:
    """A `BadMessage` if maps and arrays nest deeper than `limit` (iterative)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            rid = obj.get("id") if isinstance(obj, dict) else None
            return BadMessage(rid if type(rid) is int and 0 <= rid <= U64_MAX else 0, TooLarge(
                f"request: nesting depth over {limit} exceeds max_depth ({limit})"))
        kids = (o if isinstance(o, list) else list(o.values()) if isinstance(o, dict)
                else [x for pair in o.pairs for x in pair] if isinstance(o, OddMap) else [])
        stack.extend((c, d + 1) for c in kids if isinstance(c, list | dict | OddMap))
    return None



class Fields(msgspec.Struct, forbid_unknown_fields=True, gc=False, rename={"from_": "from"}):
    """Every field of every op as the wire types it (nil: absent; `hashes`, `ids`: raw, for
    `_read_ids`), or, from a built map, whatever it held: the rules check both alike."""

    id: int | None = None
    op: str | None = None
    ns: str | None = None
    tokens: bytes | list[int] | None = None
    hashes: msgspec.Raw = msgspec.Raw()
    ids: msgspec.Raw = msgspec.Raw()
    meta: int | bytes | list[int] | None = None
    parent: int | bytes | None = None
    with_ids: bool | None = None
    holders: int | None = None
    spans: bool | None = None
    from_: int | None = None
    mask: int | None = None
    value: int | None = None
    fix: bool | None = None
    protocol: int | None = None
    after_seq: dict[str, int] | None = None
    after_seq_wait_ms: int | None = None
    route: int | None = None
    source: str | None = None
    counters: dict[str, int | float] | None = None


_ATTRS = {f.encode_name: f.name for f in msgspec.structs.fields(Fields)}  # wire -> attr
_READER = msgspec.msgpack.Decoder(Fields)
_ANY_IDS = msgspec.msgpack.Decoder(bytes | list[int | bytes] | None)
_KEYS = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_UINT64 = b"\xcf"  # msgpack's uint 64 marker (then 8 bytes big-endian)


def read_frame(frame: bytes | memoryview, limits: Limits) -> Fields | None:
    """The fields of the request map `frame`, or None (see the module docstring). Its
    values nest at most 2 deep, one container each; a frame of at most min(max_str_bytes,
    max_items) bytes is within the other budgets; a longer one is counted (`_within`)."""
    head = frame[0] if len(frame) else 0
    n = head - 0x80 if 0x80 <= head <= 0x8F else int.from_bytes(frame[1:3], "big") \
        if head == 0xDE else int.from_bytes(frame[1:5], "big") if head == 0xDF else -1
    if not 0 <= n <= limits.max_map_len or n >= limits.max_containers or limits.max_depth < 2:
        return None
    try:
        f = _READER.decode(frame)
        f.hashes, f.ids = _read_ids(f.hashes, limits), _read_ids(f.ids, limits)
        if (f.after_seq is not None or f.counters is not None) and any(
                m is not None and len(m) > limits.max_map_len for m in (f.after_seq, f.counters)):
            return None
        big = len(frame) > min(limits.max_str_bytes, limits.max_items)
        return None if big and not _within(frame, f, n, limits) else f
    except msgspec.MsgspecError:
        return None


def _read_ids(raw: Any, limits: Limits) -> Any:
    """hashes / ids from raw msgpack: uint64s each ``0xcf`` + 8 bytes big-endian (msgpack's
    form of every uint >= 2**32: any 64-bit engine hash, almost) in one numpy view."""
    raw = bytes(raw)
    head = raw[0] if raw else 0
    n, start = ((head & 0x0F, 1) if 0x90 <= head <= 0x9F else
                (int.from_bytes(raw[1:3], "big"), 3) if head == 0xDC else
                (int.from_bytes(raw[1:5], "big"), 5) if head == 0xDD else (-1, -1))
    if 0 < n <= limits.max_ids and len(raw) == start + 9 * n and raw[start::9] == _UINT64 * n:
        out = np.zeros((n, 2), dtype=np.uint64)
        out[:, 0] = np.ndarray((n,), ">u8", raw, start + 1, (9,))  # the values, in place
        return out
    return _ANY_IDS.decode(raw) if raw else None  # b"": absent


def _within(frame: bytes | memoryview, f: Fields, n: int, limits: Limits) -> bool:
    """Whether a long frame keeps within the budgets (a repeated key: the build counts all)."""
    if len(_KEYS.decode(frame)) != n:
        return False
    sizes = [len(v) for v in msgspec.structs.astuple(f) if isinstance(v, list | dict | np.ndarray)]
    items, containers = n + sum(sizes), 1 + len(sizes)
    strs = [f.op, f.ns, f.source, *(f.after_seq or ()), *(f.counters or ())]
    return items <= limits.max_items and containers <= limits.max_containers and \
        max(map(len, _ATTRS)) <= limits.max_str_bytes and \
        all(s is None or len(s) <= limits.max_str_bytes // 4 for s in strs)



def negotiate(requested: int) -> int:
    """The protocol a connection speaks after a `hello` asking for `requested`."""
    return max(1, min(requested, NEWEST_PROTOCOL))


def parse_message(obj: object, limits: Limits, protocol: int = 1) -> Request | BadMessage:
    """`Fields` or one decoded value -> a typed request, or a `BadMessage`. `protocol`:
    what the connection negotiated (`negotiate`); it changes what an insert means."""
    if isinstance(obj, Fields):
        f = obj
    elif isinstance(obj, dict):
        f = Fields(**{"hashes": None, "ids": None,
                      **{_ATTRS[k]: v for k, v in obj.items() if k in _ATTRS}})
    else:
        return BadMessage(0, BadRequest("request: map keys must be strings" if isinstance(
            obj, OddMap) else f"request: expected a map, got {_kind(obj)}"))
    rid = f.id
    if type(rid) is not int or not 0 <= rid <= U64_MAX:
        return BadMessage(0, BadRequest(
            f"id: {'missing' if rid is None else f'{show(rid)} is not a uint64'}"))
    try:
        if f.op is None:
            raise BadRequest("op: missing")
        if type(f.op) is not str:
            raise BadRequest(f"op: {show(f.op)} is not a str (an op name)")
        parse = _OPS.get(f.op)
        if parse is None:
            raise UnknownOp(f"op: unknown op {show(f.op)} (known: {', '.join(sorted(_OPS))})")
        return parse(rid, f, limits, protocol)
    except SarpError as exc:
        return BadMessage(rid, exc)
    except Exception:  # the one guard of validation: a bug costs one answer, not
        # the connection's other pipelined requests (execution's guard is the service's)
        log.exception("validating request %d failed", rid)
        return BadMessage(rid, Internal("request: validation failed (a bug in sarpd; the "
                                        "sarpd log has the details)"))


def _op_hello(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    if f.protocol is not None and (type(f.protocol) is not int or f.protocol < 1):
        raise BadRequest(f"protocol: {show(f.protocol)} is not a uint >= 1 (a protocol version)")
    return model.Hello(rid, protocol=1 if f.protocol is None else f.protocol)


MAX_SHARD_NAME_BYTES = 64
MAX_AFTER_SEQ_WAIT_MS = 60_000


def _op_match(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    _refuse(f.parent, "match", "parent")
    k = 0
    if f.holders is not None and (k := check_uint("holders", f.holders)) == 0:
        raise BadRequest("holders: 0 asks for no holder (1..max_match_holders, or leave it out)")
    if k > limits.max_match_holders:
        raise TooLarge(f"holders: {k:,} exceeds max_match_holders ({limits.max_match_holders:,})")
    wait = model.AFTER_SEQ_WAIT_MS
    if f.after_seq_wait_ms is not None and (wait := check_uint(
            "after_seq_wait_ms", f.after_seq_wait_ms)) > MAX_AFTER_SEQ_WAIT_MS:
        raise BadRequest(f"after_seq_wait_ms: {wait:,} exceeds {MAX_AFTER_SEQ_WAIT_MS:,}")
    return model.Match(rid, seq=_seq(f, limits, "match"), with_ids=_bool("with_ids", f.with_ids),
                       holders=k, spans=_bool("spans", f.spans), after_seq=_after_seq(f.after_seq),
                       after_seq_wait_ms=wait, route=_route(f))


def _after_seq(v: object) -> tuple[tuple[str, int], ...]:
    """`after_seq`: shard name -> uint (the newest write sequence the client got)."""
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise BadRequest(f"after_seq: {show(v)} is not a map of shard name -> uint64")
    if len(v) > MAX_SHARDS:
        raise TooLarge(f"after_seq: {len(v):,} shards exceeds {MAX_SHARDS:,}")
    for shard, seq in v.items():
        if not isinstance(shard, str) or not 0 < utf8_len("after_seq", shard) <= \
                MAX_SHARD_NAME_BYTES:
            raise BadRequest(f"after_seq: shard name {show(shard)} is not a str of "
                             f"1..{MAX_SHARD_NAME_BYTES} bytes")
        check_uint(f"after_seq[{show(shard)}]", seq)
    return tuple(v.items())


def _op_insert(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    seq = _seq(f, limits, "insert")
    if f.meta is None:
        raise BadRequest("meta: missing (one uint for all blocks, or one per block)")
    meta = _meta(f.meta, seq.blocks(limits.block_tokens), limits)
    if f.parent is not None:
        _refuse(f.route, "insert after a parent", "route")
    return model.Insert(rid, seq=seq, meta=meta, add_holder=protocol >= 2,
                        parent=None if f.parent is None else _one_id(f.parent, "parent"),
                        route=_route(f))


def _op_remove(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    _refuse(f.parent, "remove", "parent")
    seq = _seq(f, limits, "remove", required=False)
    holder = None if f.meta is None else check_uint("meta", f.meta)
    if seq is not None and f.ids is not None:
        raise BadRequest("remove: give either tokens/hashes (with from) or ids, not both")
    if f.ids is not None:
        if f.from_ is not None:
            raise BadRequest("from: only with tokens or hashes, not with ids")
        _refuse(f.route, "remove by ids", "route")
        return model.Remove(rid, ns=_ns(f.ns, limits), ids=_ids(f.ids, "ids", limits),
                            meta=holder)
    if seq is None:
        raise BadRequest("remove: needs tokens or hashes (with optional from), or ns and ids")
    start = 0 if f.from_ is None else check_uint("from", f.from_)
    return model.Remove(rid, seq=seq, start=start, ns=seq.ns, meta=holder, route=_route(f))


def _route(f: Fields) -> int | None:
    """`route` (cluster mode, rule heads): the depth of the deepest split the sender's
    shard map has the sequence pass, 0..MAX_HEAD_DEPTH blocks."""
    if f.route is None:
        return None
    return check_uint("route", f.route, MAX_HEAD_DEPTH + 1, f"depth in 0..{MAX_HEAD_DEPTH}")


def _op_clear(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    for name in ("tokens", "hashes", "ids", "parent"):
        _refuse(getattr(f, name), "clear", name, "; clear takes ns, mask and value (use remove)")
    if f.ns is None:
        raise BadRequest("ns: missing (clear needs the namespace to clear)")
    mask, value = (0 if v is None else check_uint(n, v)
                   for n, v in (("mask", f.mask), ("value", f.value)))
    if value & ~mask:
        raise BadRequest(f"value: {value:#x} has bits outside mask {mask:#x} (would match nothing)")
    return model.Clear(rid, ns=_ns(f.ns, limits), mask=mask, value=value)


def _op_dump(rid: int, f: Fields, limits: Limits, protocol: int) -> Request:
    _refuse(f.parent, "dump", "parent")
    return model.Dump(rid, seq=_seq(f, limits, "dump"))


_OPS: dict[str, Callable[[int, Fields, Limits, int], Request]] = {  # others ignore fields
    "hello": _op_hello, "match": _op_match, "insert": _op_insert, "remove": _op_remove,
    "clear": _op_clear, "dump": _op_dump, "ping": lambda rid, *_: model.Ping(rid),
    "stats": lambda rid, *_: model.Stats(rid), "snapshot": lambda rid, *_: model.Snapshot(rid),
    "check": lambda rid, f, *_: model.Check(rid, fix=_bool("fix", f.fix)),
    "report": lambda rid, f, *_: parse_report(rid, {"source": f.source, "counters": f.counters}),
}


_KIND_NAMES: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str",
                                bytes: "bin", list: "array", dict: "map", type(None): "nil",
                                OddMap: "map"}
_repr = reprlib.Repr()  # bounded in depth and length, so any decoded value is safe to show
_repr.maxlevel = 3
_repr.maxstring = _repr.maxother = _repr.maxlong = 40


def _kind(v: object) -> str:
    """What a plain value is, in the protocol's words (never a Python type name)."""
    return _KIND_NAMES.get(type(v)) or (
        "bin" if isinstance(v, bytes | bytearray | memoryview) else "array" if isinstance(
            v, tuple | set | frozenset) else "ext" if type(v).__name__ in (
                "ExtType", "Timestamp", "Ext") else "value")


def show(v: object, width: int = 60) -> str:
    """`v` for an error message: a bounded repr (strings and ints cut at 40 chars), numpy
    values as their Python values, other objects by what they are (never a type name)."""
    v = v.item() if isinstance(v, np.generic) else v.tolist() if isinstance(v, np.ndarray) else v
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
    try:
        arr = np.array(items, dtype=np.uint64) if set(map(type, items)) <= {int} else None
    except OverflowError:  # a negative int, or one of 2**64 or more
        arr = None
    if arr is None or (limit <= U64_MAX and arr.size and int(arr.max()) >= limit):
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


def _refuse(v: object, op: str, name: str, hint: str = "") -> None:
    if v is not None:
        raise BadRequest(f"{name}: not allowed in {op}{hint}")


def _bool(name: str, v: object) -> bool:
    if v is not None and type(v) is not bool:
        raise BadRequest(f"{name}: {show(v)} is not a bool (true or false)")
    return bool(v)


def _ns(v: object, limits: Limits) -> str:
    if v is None:
        return ""
    if type(v) is not str:
        raise BadRequest(f"ns: {show(v)} is not a str (a namespace name)")
    n = len(v) if v.isascii() else utf8_len("ns", v)
    if n > limits.max_ns_bytes:
        raise BadRequest(f"ns: {n} bytes exceeds max_ns_bytes ({limits.max_ns_bytes})")
    return v


def _seq(f: Fields, limits: Limits, op: str, *, required: bool = True) -> Any:
    """The SeqSpec of `tokens` or `hashes` (None: neither, when not `required`)."""
    if f.tokens is not None and f.hashes is not None:
        raise BadRequest(f"tokens, hashes: {op} takes one of them, not both")
    if f.tokens is None and f.hashes is None:
        if required:
            raise BadRequest(f"tokens, hashes: missing ({op} needs one of them)")
        return None
    ns = _ns(f.ns, limits)
    return model.SeqSpec(ns=ns, hashes=_ids(f.hashes, "hashes", limits)) if f.tokens is None \
        else model.SeqSpec(ns=ns, tokens=_tokens(f.tokens, limits))


TOKENS_RULE = "an array of uint32 token ids or a bin (uint32 LE per token)"
IDS_RULE = "a bin of 16-byte ids or an array of ids (each a uint64 or a 16-byte bin)"
ID_RULE = "uint64 or a 16-byte bin"
META_RULE = "a uint64, an array of uint64 (one per block) or a bin (uint64 LE per block)"


def _tokens(v: object, limits: Limits) -> U32Array:
    if not isinstance(v, bytes | list):
        raise BadRequest(f"tokens: {show(v)} is not {TOKENS_RULE}")
    n = _count(v, "tokens", 4, "uint32 LE per token")
    check_sequence_tokens(n, limits.max_sequence_tokens)  # the core's rule
    return np.frombuffer(v, dtype="<u4").astype(np.uint32) if isinstance(v, bytes) else \
        uint_array(v, "tokens", 2**32, "uint32").astype(np.uint32)


def _count(v: bytes | list[Any], name: str, size: int, unit: str) -> int:
    """Values in a list, or in a bin of `size` bytes per value."""
    if isinstance(v, list):
        return len(v)
    if len(v) % size:
        raise BadRequest(f"{name}: bin of {len(v)} bytes is not a multiple of {size} ({unit})")
    return len(v) // size


def _ids(v: object, name: str, limits: Limits) -> IdArray:
    """hashes / ids: bin of 16 B per id, or a list of 16-byte bins / uints < 2**64 (or
    the ids `_read_ids` already put in numpy)."""
    if isinstance(v, np.ndarray):
        return v
    if not isinstance(v, bytes | list):
        raise BadRequest(f"{name}: {show(v)} is not {IDS_RULE}")
    n = _count(v, name, 16, "id size")
    if n > limits.max_ids:
        raise TooLarge(f"{name}: {n} ids exceeds max_ids ({limits.max_ids})")
    return model.ids_from_bytes(v) if isinstance(v, bytes) else id_items(v, name)


def id_items(v: list[Any], name: str) -> IdArray:
    """A list of ids (each a uint64, zero-extended, or a 16-byte bin) -> (n, 2) ids."""
    out = np.zeros((len(v), 2), dtype=np.uint64)
    try:
        out[:, 0] = uint_array(v, name, U64_MAX + 1, ID_RULE)
    except BadRequest:  # not all uint64s: 16-byte bins, a mix, or a bad one (`_one_id`'s error)
        if set(map(type, v)) == {bytes} and set(map(len, v)) == {16}:
            return model.ids_from_bytes(b"".join(v))
        for i, item in enumerate(v):
            out[i] = _one_id(item, f"{name}[{i}]")[0]
    return out


def _one_id(v: object, name: str) -> IdArray:
    if isinstance(v, bytes):
        if len(v) != 16:
            raise BadRequest(f"{name}: bin of {len(v)} bytes is not an id (an id takes 16)")
        return model.ids_from_bytes(v)
    return np.array([[check_uint(name, v, what=ID_RULE), 0]], dtype=np.uint64)


def _meta(v: object, blocks: int, limits: Limits) -> U64Array | int:
    if type(v) is int:
        return check_uint("meta", v)
    if not isinstance(v, bytes | list):
        raise BadRequest(f"meta: {show(v)} is not {META_RULE}")
    n = _count(v, "meta", 8, "uint64 LE")
    if n != blocks:
        raise BadRequest(f"meta: {n} values for {blocks} blocks (one uint64 per whole "
                         f"{limits.block_tokens}-token block, or a single uint for all)")
    return np.frombuffer(v, dtype="<u8").astype(np.uint64) if isinstance(v, bytes) else \
        uint_array(v, "meta", U64_MAX + 1, "uint64")


MAX_REPORT_COUNTERS = 64  # counters per report
MAX_SOURCE_BYTES = 128
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")  # also a valid Prometheus label value


def parse_report(rid: int, d: Mapping[str, Any]) -> model.Report:
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
    for name, value in counters.items():
        if type(name) is not str or not _NAME.match(name):
            raise BadRequest(f"counters: name {show(name)} is not [a-z][a-z0-9_]{{0,63}}")
        if not ((type(value) is int and -(2**63) <= value < 2**64)
                or (type(value) is float and math.isfinite(value))):
            raise BadRequest(f"counters.{name}: {show(value)} is not a finite number (an "
                             "int within 64 bits or a float)")
    return model.Report(rid, source, dict(counters))
