"""Sans-I/O validation of requests (PROTOCOL.md): one decoded msgpack value -> a
typed request, or a `BadMessage` naming the field and the limit. No sockets, no
asyncio; `sarpd.protocol.wire` feeds it what its `Decoder` unpacks. The limits are documented
in `sarpd.protocol.wire` (framing) and PROTOCOL.md ("Limits")."""

from __future__ import annotations

import logging
import math
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

log = logging.getLogger(__name__)

U64_MAX = 2**64 - 1
U32_LIMIT = 2**32


@dataclass(frozen=True, slots=True)
class Limits:
    """Decoder limits; see the module docstring. ``max_ids=0`` derives the default.
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
        for name in (
            "max_frame_size",
            "max_sequence_tokens",
            "block_tokens",
            "max_ns_bytes",
            "max_map_len",
            "max_containers",
            "max_str_bytes",
            "max_depth",
            "max_match_holders",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Limits.{name}: {value!r} must be an int >= 1")
        if self.max_ids == 0:
            object.__setattr__(self, "max_ids", self.max_sequence_tokens // self.block_tokens)
        if type(self.max_ids) is not int or self.max_ids < 1:
            raise ConfigError(f"Limits.max_ids: {self.max_ids!r} must be an int >= 1")

    @property
    def max_items(self) -> int:
        return 2 * max(self.max_sequence_tokens, self.max_ids)

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Limits:
        return cls(
            max_frame_size=cfg.max_frame_size,
            max_sequence_tokens=cfg.index.max_sequence_tokens,
            block_tokens=cfg.index.block_tokens,
        )


@dataclass(frozen=True, slots=True)
class BadMessage:
    """A message that is not a valid request: answer ``error`` under ``id``, keep going."""

    id: int
    error: SarpError


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
        what = "missing" if rid is None else f"expected a uint, got {_show(rid)}"
        return BadMessage(0, BadRequest(f"id: {what}"))
    try:
        return _parse_op(rid, obj, limits, protocol)
    except SarpError as exc:
        return BadMessage(rid, exc)
    except Exception as exc:  # the one guard of validation: a bug costs one answer, not
        # the connection's other pipelined requests (execution's guard is the service's)
        log.exception("validating request %d failed", rid)
        return BadMessage(rid, Internal(f"request: validation failed ({type(exc).__name__}); "
                                        "see the sarpd log"))


def _parse_op(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    op = d.get("op")
    if op is None:
        raise BadRequest("op: missing")
    if type(op) is not str:
        raise BadRequest(f"op: expected a str, got {_kind(op)}")
    parse = _OPS.get(op)
    if parse is None:
        raise UnknownOp(f"op: unknown op {_show(op)} (known: {', '.join(sorted(_OPS))})")
    return parse(rid, d, limits, protocol)


def _op_hello(rid: int, d: dict[str, Any], limits: Limits, protocol: int) -> Request:
    asked = d.get("protocol")
    if asked is None:
        return Hello(rid)
    if type(asked) is not int or asked < 1:
        raise BadRequest(f"protocol: expected a uint >= 1, got {_kind(asked)} {_show(asked)}")
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
                 holders=k, after_seq=_after_seq(d),
                 after_seq_wait_ms=AFTER_SEQ_WAIT_MS if wait is None else _wait_ms(d))


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
        raise BadRequest(f"after_seq: expected a map of shard -> uint, got {_kind(v)}")
    if len(v) > MAX_AFTER_SEQ_SHARDS:
        raise TooLarge(f"after_seq: {len(v):,} shards exceeds {MAX_AFTER_SEQ_SHARDS:,}")
    out = []
    for shard, seq in v.items():
        if not isinstance(shard, str) or not 0 < len(shard.encode()) <= MAX_SHARD_NAME_BYTES:
            raise BadRequest(f"after_seq: a shard name must be a str of 1..{MAX_SHARD_NAME_BYTES}"
                             f" bytes, got {_kind(shard)} {_show(shard)}")
        if type(seq) is not int or seq < 0:
            raise BadRequest(f"after_seq[{shard!r}]: expected a uint, got {_kind(seq)} "
                             f"{_show(seq)}")
        out.append((shard, seq))
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
    return _KIND_NAMES.get(type(v), type(v).__name__)


_repr = reprlib.Repr()  # bounded in depth and length, so any decoded value is safe to show
_repr.maxlevel = 3
_repr.maxstring = _repr.maxother = _repr.maxlong = 40


def _show(v: object, width: int = 60) -> str:
    text = _repr.repr(v)
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _refuse(d: dict[str, Any], op: str, name: str, hint: str = "") -> None:
    if d.get(name) is not None:
        raise BadRequest(f"{name}: not allowed in {op}{hint}")


def _bool(d: dict[str, Any], name: str) -> bool:
    v = d.get(name)
    if v is None:
        return False
    if type(v) is not bool:
        raise BadRequest(f"{name}: expected a bool, got {_kind(v)} {_show(v)}")
    return v


def _uint(d: dict[str, Any], name: str) -> int:
    """An optional uint64 field (default 0)."""
    v = d.get(name)
    if v is None:
        return 0
    if type(v) is not int:
        raise BadRequest(f"{name}: expected a uint, got {_kind(v)} {_show(v)}")
    if v < 0:
        raise BadRequest(f"{name}: {v} is negative (expected a uint)")
    return v


def _ns(d: dict[str, Any], limits: Limits) -> str:
    v = d.get("ns")
    if v is None:
        return ""
    if type(v) is not str:
        raise BadRequest(f"ns: expected a str, got {_kind(v)} {_show(v)}")
    try:
        n = len(v.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadRequest(f"ns: {_show(v)} is not valid UTF-8") from exc
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


def _first_not_int(items: list[Any], name: str, what: str) -> BadRequest:
    for i, v in enumerate(items):
        if type(v) is not int:
            return BadRequest(f"{name}[{i}]: expected a {what}, got {_kind(v)} {_show(v)}")
    return BadRequest(f"{name}: expected an array of {what}")  # pragma: no cover


def _first_out_of_range(items: list[Any], name: str, limit: int, what: str) -> BadRequest:
    for i, v in enumerate(items):
        if not 0 <= v < limit:
            return BadRequest(f"{name}[{i}]: {v} is not a {what}")
    return BadRequest(f"{name}: a value is not a {what}")  # pragma: no cover


def _tokens(v: object, limits: Limits) -> U32Array:
    if isinstance(v, bytes):
        if len(v) % 4:
            raise BadRequest(
                f"tokens: bin of {len(v)} bytes is not a multiple of 4 (uint32 LE per token)"
            )
        _check_tokens_len(len(v) // 4, limits)
        return np.frombuffer(v, dtype="<u4").astype(np.uint32)
    if not isinstance(v, list):
        raise BadRequest(f"tokens: expected an array of uint32 or a bin, got {_kind(v)}")
    _check_tokens_len(len(v), limits)
    if not v:
        return np.zeros(0, dtype=np.uint32)
    if not set(map(type, v)) <= {int}:
        raise _first_not_int(v, "tokens", "uint32")
    try:
        arr = np.array(v, dtype=np.int64)
    except OverflowError as exc:
        raise _first_out_of_range(v, "tokens", U32_LIMIT, "uint32") from exc
    bad = (arr < 0) | (arr >= U32_LIMIT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise BadRequest(f"tokens[{i}]: {int(arr[i])} is not a uint32")
    return arr.astype(np.uint32)


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
        raise BadRequest(f"{name}: expected a bin or an array of ids, got {_kind(v)}")
    _check_ids_len(len(v), name, limits)
    types = set(map(type, v))
    out = np.zeros((len(v), 2), dtype=np.uint64)
    if types <= {int}:
        try:
            out[:, 0] = np.array(v, dtype=np.uint64)
        except OverflowError as exc:
            raise _first_out_of_range(v, name, U64_MAX + 1, "uint64 id") from exc
        return out
    if types == {bytes} and set(map(len, v)) == {16}:
        return ids_from_bytes(b"".join(v))
    for i, item in enumerate(v):
        out[i] = _one_id(item, f"{name}[{i}]")[0]
    return out


def _one_id(v: object, name: str) -> IdArray:
    if isinstance(v, bytes):
        if len(v) != 16:
            raise BadRequest(f"{name}: bin of {len(v)} bytes, an id takes 16")
        return ids_from_bytes(v)
    if type(v) is int:
        if not 0 <= v <= U64_MAX:
            raise BadRequest(f"{name}: {v} is not a uint64 (or a 16-byte bin)")
        return np.array([[v, 0]], dtype=np.uint64)
    raise BadRequest(f"{name}: expected a 16-byte bin or a uint64, got {_kind(v)} {_show(v)}")


def _meta(v: object, blocks: int, limits: Limits) -> U64Array | int:
    if type(v) is int:
        if not 0 <= v <= U64_MAX:
            raise BadRequest(f"meta: {v} is not a uint64")
        return v
    if isinstance(v, bytes):
        if len(v) % 8:
            raise BadRequest(f"meta: bin of {len(v)} bytes is not a multiple of 8 (uint64 LE)")
        _meta_count(len(v) // 8, blocks, limits)
        return np.frombuffer(v, dtype="<u8").astype(np.uint64)
    if not isinstance(v, list):
        raise BadRequest(f"meta: expected a uint, an array of uints or a bin, got {_kind(v)}")
    _meta_count(len(v), blocks, limits)
    if not set(map(type, v)) <= {int}:
        raise _first_not_int(v, "meta", "uint64")
    try:
        return np.array(v, dtype=np.uint64)
    except OverflowError as exc:
        raise _first_out_of_range(v, "meta", U64_MAX + 1, "uint64") from exc


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
    """Validate the fields of a ``report`` request (errors name the field and limit)."""
    source = d.get("source")
    if type(source) is not str or not source:
        raise BadRequest("source: expected a non-empty str")
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise TooLarge(f"source: {len(source.encode())} bytes exceeds {MAX_SOURCE_BYTES}")
    counters = d.get("counters")
    if not isinstance(counters, Mapping):
        raise BadRequest("counters: expected a map of name -> number")
    if len(counters) > MAX_REPORT_COUNTERS:
        raise TooLarge(f"counters: {len(counters)} entries exceeds {MAX_REPORT_COUNTERS}")
    out: dict[str, float] = {}
    for name, value in counters.items():
        if type(name) is not str or not _NAME.match(name):
            raise BadRequest(f"counters: name {name!r:.80} is not [a-z][a-z0-9_]{{0,63}}")
        if not ((type(value) is int and -(2**63) <= value < 2**64)
                or (type(value) is float and math.isfinite(value))):
            raise BadRequest(f"counters.{name}: expected a finite number (an int within "
                             f"64 bits or a float), got {value!r:.80}")
        out[name] = float(value)
    return Report(rid, source, out)
