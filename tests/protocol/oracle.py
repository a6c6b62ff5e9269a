"""The test oracle of request decoding: the second implementation, kept only to check
the daemon's one decoding path (`sarpd.protocol`) against it. It is the hand-written
validation and the budgeted msgpack build that sarpd used before issue 23 (at
ffc9467, `sarpd/protocol/requests.py` and `wire.py`'s full path), trimmed to decoding
one frame: `decode_frame` gives the request, the `BadMessage`, or raises the stream
error (`FrameError`) that the daemon must give for the same bytes."""

from __future__ import annotations

import logging
import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from sarpd.core.ids import check_sequence_tokens
from sarpd.errors import BadRequest, FrameError, Internal, SarpError, TooLarge, UnknownOp
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
from sarpd.protocol.requests import BadMessage, Limits

log = logging.getLogger(__name__)

U64_MAX = 2**64 - 1
U32_LIMIT = 2**32


# --------------------------------------------------------------------------- decoding


class OddMap:
    """A map whose keys are not all strings (never a valid request or field): what the
    wire decoder builds for such a map, so that no dict with odd keys is ever made."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


def _children(o: object) -> list[Any]:
    if isinstance(o, list):
        return o
    if isinstance(o, dict):
        return list(o.values())
    if isinstance(o, OddMap):
        return [x for pair in o.pairs for x in pair]
    return []


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
                rid, TooLarge(f"request: nesting depth over {limit} exceeds max_depth ({limit})")
            )
        stack.extend((c, d + 1) for c in _children(o) if isinstance(c, list | dict | OddMap))
    return None


NEWEST_PROTOCOL = 2  # what `hello` can negotiate (PROTOCOL.md "Holders")


def negotiate(requested: int) -> int:
    """The protocol a connection speaks after a `hello` asking for `requested`."""
    return max(1, min(requested, NEWEST_PROTOCOL))


def parse_message(obj: object, limits: Limits, protocol: int = 1) -> Request | BadMessage:
    """One decoded msgpack value -> a typed request, or a `BadMessage`. `protocol`: what
    the connection negotiated (`negotiate`); it changes what an insert means."""
    if isinstance(obj, OddMap):
        return BadMessage(0, BadRequest("request: map keys must be strings"))
    if not isinstance(obj, dict):
        return BadMessage(0, BadRequest(f"request: expected a map, got {_kind(obj)}"))
    rid = obj.get("id")
    if type(rid) is not int or not 0 <= rid <= U64_MAX:
        what = "missing" if rid is None else f"{show(rid)} is not a uint64"
        return BadMessage(0, BadRequest(f"id: {what}"))
    try:
        return _parse_op(rid, obj, limits, protocol)
    except SarpError as exc:
        return BadMessage(rid, exc)
    except Exception:  # the one guard of validation: a bug costs one answer, not
        # the connection's other pipelined requests (execution's guard is the service's)
        log.exception("validating request %d failed", rid)
        return BadMessage(rid, Internal("request: validation failed (a bug in sarpd; the "
                                        "sarpd log has the details)"))


def _parse_op(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    op = d.get("op")
    if op is None:
        raise BadRequest("op: missing")
    if type(op) is not str:
        raise BadRequest(f"op: {show(op)} is not a str (an op name)")
    parse = _OPS.get(op)
    if parse is None:
        raise UnknownOp(f"op: unknown op {show(op)} (known: {', '.join(sorted(_OPS))})")
    return parse(rid, d, limits, protocol)


def _op_hello(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    asked = d.get("protocol")
    if asked is None:
        return Hello(rid)
    if type(asked) is not int or asked < 1:
        raise BadRequest(f"protocol: {show(asked)} is not a uint >= 1 (a protocol version)")
    return Hello(rid, protocol=asked)


def _op_check(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    return Check(rid, fix=_bool(d, "fix"))


def _op_dump(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    _refuse(d, "dump", "parent")
    return Dump(rid, seq=_need_seq(d, limits, "dump"))


def _op_match(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    _refuse(d, "match", "parent")
    k = _uint(d, "holders")
    if d.get("holders") is not None and k == 0:
        raise BadRequest("holders: 0 asks for no holder (1..max_match_holders, or leave it out)")
    if k > limits.max_match_holders:
        raise TooLarge(f"holders: {k:,} exceeds max_match_holders ({limits.max_match_holders:,})")
    wait = d.get("after_seq_wait_ms")
    return Match(rid, seq=_need_seq(d, limits, "match"), with_ids=_bool(d, "with_ids"),
                 holders=k, spans=_bool(d, "spans"), after_seq=_after_seq(d),
                 after_seq_wait_ms=AFTER_SEQ_WAIT_MS if wait is None else _wait_ms(d),
                 route=_route(d))


MAX_ROUTE = 4096  # sarpd.core.shards.MAX_HEAD_DEPTH


def _route(d: dict[str, Any]) -> int | None:
    """`route`: the sender's split depth for the sequence, 0..MAX_ROUTE (cluster mode)."""
    if d.get("route") is None:
        return None
    return check_uint("route", d["route"], MAX_ROUTE + 1, f"depth in 0..{MAX_ROUTE}")


MAX_AFTER_SEQ_SHARDS = 1024  # sarpd.core.shards.MAX_SHARDS
MAX_SHARD_NAME_BYTES = 64
MAX_AFTER_SEQ_WAIT_MS = 60_000


def _after_seq(d: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """`after_seq`: a map shard name -> uint (the newest write sequence the client
    got from that shard)."""
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
    meta = _meta(meta_v, _blocks(seq, limits), limits)
    parent_v = d.get("parent")
    if parent_v is not None:
        _refuse(d, "insert after a parent", "route")
    parent = None if parent_v is None else _one_id(parent_v, "parent")
    return Insert(rid, seq=seq, meta=meta, parent=parent, add_holder=protocol >= 2,
                  route=_route(d))


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
        _refuse(d, "remove by ids", "route")
        return Remove(rid, ns=_ns(d, limits), ids=_ids(ids_v, "ids", limits), meta=holder)
    if seq is None:
        raise BadRequest("remove: needs tokens or hashes (with optional from), or ns and ids")
    return Remove(rid, seq=seq, start=_uint(d, "from"), ns=seq.ns, meta=holder,
                  route=_route(d))


def _op_clear(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    for name in ("tokens", "hashes", "ids", "parent"):
        _refuse(d, "clear", name, hint="; clear takes ns, mask and value (use remove)")
    if d.get("ns") is None:
        raise BadRequest("ns: missing (clear needs the namespace to clear)")
    mask, value = _uint(d, "mask"), _uint(d, "value")
    if value & ~mask:
        raise BadRequest(f"value: {value:#x} has bits outside mask {mask:#x} (would match nothing)")
    return Clear(rid, ns=_ns(d, limits), mask=mask, value=value)


_OPS: dict[str, Callable[[int, dict[str, Any], Limits, int], Request]] = {
    "hello": _op_hello,
    "ping": lambda rid, d, limits, protocol: Ping(rid),  # field-less ops ignore every field
    "stats": lambda rid, d, limits, protocol: Stats(rid),
    "snapshot": lambda rid, d, limits, protocol: Snapshot(rid),
    "match": _op_match,
    "insert": _op_insert,
    "remove": _op_remove,
    "clear": _op_clear,
    "check": _op_check,
    "dump": _op_dump,
    "report": lambda rid, d, limits, protocol: parse_report(rid, d),
}


# ------------------------------------------------------------------ field validation


_KIND_NAMES: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bin",
    list: "array",
    dict: "map",
    type(None): "nil",
    OddMap: "map",
}


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
    return "ext" if isinstance(v, msgpack.ExtType | msgpack.Timestamp) else "value"


_repr = reprlib.Repr()  # bounded in depth and length, so any decoded value is safe to show
_repr.maxlevel = 3
_repr.maxstring = _repr.maxother = _repr.maxlong = 40


def _plain_value(v: object) -> object:
    """A numpy scalar or array -> its Python value (so no dtype is ever shown)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


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
    if v is None:
        return False
    if type(v) is not bool:
        raise BadRequest(f"{name}: {show(v)} is not a bool (true or false)")
    return v


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


def _blocks(seq: SeqSpec, limits: Limits) -> int:
    if seq.tokens is not None:
        return len(seq.tokens) // limits.block_tokens
    assert seq.hashes is not None
    return len(seq.hashes)


def _check_tokens_len(n: int, limits: Limits) -> None:
    check_sequence_tokens(n, limits.max_sequence_tokens)  # the core's one rule


TOKENS_RULE = "an array of uint32 token ids or a bin (uint32 LE per token)"
IDS_RULE = "a bin of 16-byte ids or an array of ids (each a uint64 or a 16-byte bin)"
ID_RULE = "uint64 or a 16-byte bin"
META_RULE = "a uint64, an array of uint64 (one per block) or a bin (uint64 LE per block)"


def _tokens(v: object, limits: Limits) -> U32Array:
    if isinstance(v, bytes):
        if len(v) % 4:
            raise BadRequest(
                f"tokens: bin of {len(v)} bytes is not a multiple of 4 (uint32 LE per token)"
            )
        _check_tokens_len(len(v) // 4, limits)
        return np.frombuffer(v, dtype="<u4").astype(np.uint32)
    if not isinstance(v, list):
        raise BadRequest(f"tokens: {show(v)} is not {TOKENS_RULE}")
    _check_tokens_len(len(v), limits)
    return uint_array(v, "tokens", U32_LIMIT, "uint32").astype(np.uint32)


def _check_ids_len(n: int, name: str, limits: Limits) -> None:
    if n > limits.max_ids:
        raise TooLarge(f"{name}: {n} ids exceeds max_ids ({limits.max_ids})")


def _ids(v: object, name: str, limits: Limits) -> IdArray:
    """hashes / ids: bin of 16 B per id, or a list of 16-byte bins / uints < 2**64."""
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
    if types <= {int}:
        out = np.zeros((len(v), 2), dtype=np.uint64)
        out[:, 0] = uint_array(v, name, U64_MAX + 1, ID_RULE)
        return out
    if types == {bytes} and set(map(len, v)) == {16}:
        return ids_from_bytes(b"".join(v))
    out = np.zeros((len(v), 2), dtype=np.uint64)
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
    if isinstance(v, bytes):
        if len(v) % 8:
            raise BadRequest(f"meta: bin of {len(v)} bytes is not a multiple of 8 (uint64 LE)")
        _meta_count(len(v) // 8, blocks, limits)
        return np.frombuffer(v, dtype="<u8").astype(np.uint64)
    if not isinstance(v, list):
        raise BadRequest(f"meta: {show(v)} is not {META_RULE}")
    _meta_count(len(v), blocks, limits)
    return uint_array(v, "meta", U64_MAX + 1, "uint64")


def _meta_count(n: int, blocks: int, limits: Limits) -> None:
    if n != blocks:
        raise BadRequest(
            f"meta: {n} values for {blocks} blocks (one uint64 per whole "
            f"{limits.block_tokens}-token block, or a single uint for all)"
        )


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


# -- one frame, as the full path of the framing built it ----------------------------

_LEN_LIMIT_RE = re.compile(r"(\d+) exceeds max_(\w+)_len\((\d+)\)")


def decode_frame(frame: bytes, limits: Limits, protocol: int = 1, end: int | None = None
                 ) -> Request | BadMessage:
    """The request of one complete msgpack message, or its `BadMessage`; a `FrameError`
    (a stream error) past a frame budget. `end`: the stream offset after the frame."""
    counts = [0, 0]  # containers, items

    def count(n: int) -> None:
        counts[0] += 1
        counts[1] += n
        if counts[0] > limits.max_containers:
            raise FrameError(f"frame: more than {limits.max_containers} maps and arrays in "
                             f"one message exceeds max_containers ({limits.max_containers})")
        if counts[1] > limits.max_items:
            raise FrameError(f"frame: {counts[1]} array elements and map pairs in one "
                             f"message exceeds max_items ({limits.max_items})")

    def on_map(pairs: list[tuple[Any, Any]]) -> object:
        count(len(pairs))
        return dict(pairs) if all(type(k) is str for k, _ in pairs) else OddMap(pairs)

    def on_list(items: list[Any]) -> list[Any]:
        count(len(items))
        return items

    try:
        obj = msgpack.unpackb(
            frame, raw=False, unicode_errors="surrogateescape", strict_map_key=False,
            object_pairs_hook=on_map, list_hook=on_list,
            max_str_len=min(limits.max_str_bytes, limits.max_frame_size),
            max_bin_len=limits.max_frame_size, max_ext_len=limits.max_frame_size,
            max_array_len=limits.max_items, max_map_len=limits.max_map_len)
    except FrameError:
        raise
    except Exception as exc:
        found = _LEN_LIMIT_RE.search(str(exc)) if isinstance(exc, ValueError) else None
        if found is None:
            at = len(frame) if end is None else end
            detail = f" ({exc})" if str(exc) else ""
            raise FrameError(f"frame: not valid msgpack in the message at stream byte {at}"
                             f"{detail}", code="bad_request") from exc
        n, kind, lim = found.groups()
        unit = "bytes" if kind in ("str", "bin", "ext") else "entries"
        name = "max_str_bytes" if kind == "str" else f"max_{kind}_len"
        raise FrameError(f"frame: {kind} of {n} {unit} exceeds {name} ({lim}) "
                         f"(max_frame_size {limits.max_frame_size})") from exc
    if counts[0] > limits.max_depth:
        deep = too_deep(obj, limits.max_depth)
        if deep is not None:
            return deep
    return parse_message(obj, limits, protocol)
