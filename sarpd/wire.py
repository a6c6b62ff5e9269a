"""Sans-I/O wire codec of PROTOCOL.md: msgpack bytes -> validated typed requests,
typed results -> msgpack bytes. No sockets, no asyncio (in the style of h11): the
server feeds whatever bytes arrive and writes whatever bytes come back.

Limits (all in `Limits`; the server builds them with `Limits.from_config`):

- ``max_frame_size`` (64 MiB): the largest single message. A bigger one raises
  `FrameError` (code ``too_large``, the message gives both sizes): a stream
  error, after which the server answers ``encode_error(0, exc)`` and closes.
  Bytes that are not msgpack raise `FrameError` (code ``bad_request``) the same way.
  (`Decoder.feed` raises the subclass `StreamError`, whose ``decoded`` keeps the
  requests completed earlier in the same feed.) The decoder never buffers more
  than ``max_frame_size + 1`` bytes, however many are fed at once.
- ``max_sequence_tokens`` (1,048,576): tokens per sequence; longer is a per-request
  ``too_large``.
- ``block_tokens`` (16): tokens per block; ``meta`` needs one value per whole block.
- ``max_ns_bytes`` (1,024): the UTF-8 length of a namespace (``bad_request``).
- ``max_ids`` (default ``max_sequence_tokens // block_tokens``): ids in ``hashes``
  / ``ids`` (``too_large`` beyond; ``meta`` must match the block count anyway).
- ``max_str_bytes`` (65,536): any one string (``op``, ``ns``, map keys); longer is
  a stream error (``too_large``): no valid request needs one.
- ``max_depth`` (8): nesting of maps and arrays (a valid request needs 2: the
  request map and a list in it). Deeper is a per-request ``too_large`` (checked
  only when a message has more than ``max_depth`` containers, so never on the
  common path); past msgpack's own stack (1,024 levels) it is a stream error.
- ``max_map_len`` (1,024): pairs in any one map of a message.
- ``max_containers`` (4,096): maps plus arrays in one message.
- ``max_items`` (``2 * max(max_sequence_tokens, max_ids)``): elements of any one
  array, and array elements plus map pairs of one whole message. A token list of up
  to ``max_items`` still gets a per-request ``too_large``.
  Past these last three, the message is refused as a stream error (``too_large``).

Memory: a message is built only once all its bytes are in (a skipping pass finds
its end first), so an unfinished message costs its bytes (twice: one buffer per
unpacker), never objects; a complete one, the objects the budgets above allow
(the largest valid request, max_sequence_tokens tokens as msgpack ints: ~40 MB of
Python objects; as ``bin``: 4 MB).

Everything below the frame level is a per-request error: a well-formed message that
is not a valid request yields a `BadMessage` with the request's id (0 when no id
can be read); the server answers it and keeps the connection. Strings that are not
valid UTF-8 are per-request errors too. Unknown extra fields are ignored (forward
compatibility); a field given as nil counts as absent. Fields that would change
the meaning of a request where they do not apply are refused rather than ignored:
``parent`` outside ``insert``; a sequence or ``ids`` on ``clear``; ``from`` with
``ids``. ``clear`` refuses a ``value`` with bits outside ``mask`` (it would match
nothing).

Extension ops (PROTOCOL.md, "Extensions"): ``check`` with optional ``fix`` (bool);
``dump`` with a sequence (read-only inspection of its routing and segments).
"""

from __future__ import annotations

import logging
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from sarpd.errors import (
    BadRequest,
    Busy,
    Forbidden,
    FrameError,
    Internal,
    QuotaExceeded,
    SarpError,
    TooLarge,
    Unavailable,
    UnknownOp,
    UnknownParent,
)
from sarpd.model import (
    CheckReport,
    Clear,
    Hello,
    IdArray,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Ping,
    Remove,
    RemoveResult,
    Request,
    SeqSpec,
    Snapshot,
    SnapshotResult,
    Stats,
    U32Array,
    U64Array,
    ids_from_bytes,
    ids_to_bytes,
)
from sarpd.reports import parse_report

if TYPE_CHECKING:
    from sarpd.config import ServerConfig

__all__ = [
    "BadMessage",
    "Check",
    "Decoder",
    "Dump",
    "Limits",
    "StreamError",
    "encode_error",
    "encode_ok",
    "encode_request",
    "encode_result",
    "error_from_code",
    "parse_message",
]

log = logging.getLogger(__name__)

U64_MAX = 2**64 - 1
U32_LIMIT = 2**32


@dataclass(frozen=True, slots=True)
class Limits:
    """Decoder limits; see the module docstring. ``max_ids=0`` derives the default."""

    max_frame_size: int = 64 * 1024 * 1024
    max_sequence_tokens: int = 1_048_576
    block_tokens: int = 16
    max_ns_bytes: int = 1024
    max_ids: int = 0
    max_map_len: int = 1024
    max_containers: int = 4096
    max_str_bytes: int = 65_536
    max_depth: int = 8

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
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise BadRequest(f"Limits.{name}: {value!r} must be an int >= 1")
        if self.max_ids == 0:
            object.__setattr__(self, "max_ids", self.max_sequence_tokens // self.block_tokens)
        if type(self.max_ids) is not int or self.max_ids < 1:
            raise BadRequest(f"Limits.max_ids: {self.max_ids!r} must be an int >= 1")

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


@dataclass(frozen=True, slots=True, eq=False)
class Check(Request):
    """Extension op ``check``: verify the index (and repair it with ``fix``)."""

    fix: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Dump(Request):
    """Extension op ``dump``: the routing entries and segments of one sequence."""

    seq: SeqSpec


class StreamError(FrameError):
    """The `FrameError` that `Decoder.feed` raises. ``decoded``: the requests completed
    earlier in the same ``feed`` call (in order), which the server may still answer
    before it sends the error and closes."""

    def __init__(
        self,
        message: str,
        code: str = "too_large",
        decoded: list[Request | BadMessage] | None = None,
    ) -> None:
        super().__init__(message, code)
        self.decoded: list[Request | BadMessage] = decoded if decoded is not None else []


@dataclass(frozen=True, slots=True)
class BadMessage:
    """A message that is not a valid request: answer ``error`` under ``id``, keep going."""

    id: int
    error: SarpError


# --------------------------------------------------------------------------- decoding


class _OddMap:
    """A map whose keys are not all strings (never a valid request or field)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


class _Budget:
    """Per-message container/item counters, fed by the unpacker's hooks. Kept apart
    from `Decoder` so that the unpacker holds no reference back to the decoder."""

    __slots__ = ("containers", "items", "limits")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.containers = 0
        self.items = 0

    def reset(self) -> None:
        self.containers = 0
        self.items = 0

    def _count(self, n: int) -> None:
        self.containers += 1
        self.items += n
        lim = self.limits
        if self.containers > lim.max_containers:
            raise FrameError(
                f"frame: more than {lim.max_containers} maps and arrays in one message "
                f"exceeds max_containers ({lim.max_containers})"
            )
        if self.items > lim.max_items:
            raise FrameError(
                f"frame: {self.items} array elements and map pairs in one message "
                f"exceeds max_items ({lim.max_items})"
            )

    def on_list(self, items: list[Any]) -> list[Any]:
        self._count(len(items))
        return items

    def on_map(self, pairs: list[tuple[Any, Any]]) -> dict[str, Any] | _OddMap:
        self._count(len(pairs))
        for key, _ in pairs:
            if type(key) is not str:
                return _OddMap(pairs)
        return dict(pairs)


_LEN_LIMIT_RE = re.compile(r"(\d+) exceeds max_(\w+)_len\((\d+)\)")


class Decoder:
    """Streaming request decoder for one connection.

    ``feed(data)`` returns every request completed by ``data`` (typed `Request`s and
    `BadMessage`s, in stream order) and raises `StreamError` (a `FrameError`) when
    the stream is unusable; after that every ``feed`` raises it again.

    Two unpackers see the same bytes: a skipping one finds where each message ends
    without building anything, and only then does the other build that message,
    under the per-type limits and the hooks of `_Budget`. So a header that declares
    a huge array costs nothing until the bytes of that array have arrived.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits if limits is not None else Limits()
        lim = self.limits
        self._budget = _Budget(lim)
        self._skipper = msgpack.Unpacker(max_buffer_size=lim.max_frame_size + 1)
        self._builder = msgpack.Unpacker(
            raw=False,
            unicode_errors="surrogateescape",  # bad UTF-8 is a per-request error
            strict_map_key=False,  # keys are checked by the pairs hook (no dict built)
            object_pairs_hook=self._budget.on_map,
            list_hook=self._budget.on_list,
            max_buffer_size=lim.max_frame_size + 1,
            max_str_len=min(lim.max_str_bytes, lim.max_frame_size),
            max_bin_len=lim.max_frame_size,
            max_ext_len=lim.max_frame_size,
            max_array_len=lim.max_items,
            max_map_len=lim.max_map_len,
        )
        self._fed = 0  # stream offset of everything fed
        self._frame_start = 0  # stream offset where the unfinished message starts
        self._dead: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished message held (in each of the two unpackers)."""
        return self._fed - self._frame_start

    def feed(self, data: bytes | bytearray | memoryview) -> list[Request | BadMessage]:
        """Requests completed by ``data``, in stream order. Raises `StreamError` (a
        `FrameError`) when the stream is unusable; its ``decoded`` holds the requests
        completed earlier in this same ``data``, which the server may still answer."""
        if self._dead is not None:
            raise StreamError(self._dead.message, self._dead.code) from self._dead
        out: list[Request | BadMessage] = []
        try:
            self._feed(memoryview(data).cast("B"), out)
        except FrameError as exc:
            self._dead = exc
            raise StreamError(exc.message, exc.code, out) from exc.__cause__
        return out

    def _feed(self, view: memoryview, out: list[Request | BadMessage]) -> None:
        pos, end = 0, len(view)
        limit = self.limits.max_frame_size
        while True:
            self._drain(out)
            partial = self._fed - self._frame_start  # bytes of the unfinished message
            if partial > limit:
                raise FrameError(
                    f"frame: message of at least {partial} bytes exceeds max_frame_size ({limit})"
                )
            if pos >= end:
                return
            # Never more than one byte past the limit: the buffers stay bounded.
            chunk = view[pos : pos + limit + 1 - partial]
            self._skipper.feed(chunk)
            self._builder.feed(chunk)
            self._fed += len(chunk)
            pos += len(chunk)

    def _drain(self, out: list[Request | BadMessage]) -> None:
        """Build every message the skipper finds complete."""
        limit = self.limits.max_frame_size
        while True:
            try:
                self._skipper.skip()
            except msgpack.OutOfData:
                return
            except Exception as exc:  # not msgpack: the stream is unusable
                raise self._stream_error(exc) from exc
            end = self._skipper.tell()
            size, self._frame_start = end - self._frame_start, end
            if size > limit:
                raise FrameError(f"frame: {size} bytes exceeds max_frame_size ({limit})")
            self._budget.reset()
            try:
                obj = self._builder.unpack()
            except FrameError:
                raise
            except Exception as exc:  # over a limit, or a malformed ext value
                raise self._stream_error(exc) from exc
            if self._budget.containers > self.limits.max_depth:
                deep = _too_deep(obj, self.limits.max_depth)
                if deep is not None:
                    out.append(deep)
                    continue
            out.append(parse_message(obj, self.limits))

    def _stream_error(self, exc: Exception) -> FrameError:
        found = _LEN_LIMIT_RE.search(str(exc)) if isinstance(exc, ValueError) else None
        if found is not None:
            n, kind, lim = found.groups()
            unit = "bytes" if kind in ("str", "bin", "ext") else "entries"
            name = "max_str_bytes" if kind == "str" else f"max_{kind}_len"
            return FrameError(
                f"frame: {kind} of {n} {unit} exceeds {name} ({lim}) "
                f"(max_frame_size {self.limits.max_frame_size})"
            )
        detail = f": {exc}" if str(exc) else ""
        return FrameError(
            f"frame: not valid msgpack in the message at stream byte {self._frame_start} "
            f"({type(exc).__name__}{detail})",
            code="bad_request",
        )


def _children(o: object) -> list[Any]:
    if isinstance(o, list):
        return o
    if isinstance(o, dict):
        return list(o.values())
    if isinstance(o, _OddMap):
        return [x for pair in o.pairs for x in pair]
    return []


def _too_deep(obj: object, limit: int) -> BadMessage | None:
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
        stack.extend((c, d + 1) for c in _children(o) if isinstance(c, list | dict | _OddMap))
    return None


def parse_message(obj: object, limits: Limits) -> Request | BadMessage:
    """One decoded msgpack value -> a typed request, or a `BadMessage`."""
    if isinstance(obj, _OddMap):
        return BadMessage(0, BadRequest("request: map keys must be strings"))
    if not isinstance(obj, dict):
        return BadMessage(0, BadRequest(f"request: expected a map, got {_kind(obj)}"))
    rid = obj.get("id")
    if type(rid) is not int or not 0 <= rid <= U64_MAX:
        what = "missing" if rid is None else f"expected a uint, got {_show(rid)}"
        return BadMessage(0, BadRequest(f"id: {what}"))
    try:
        return _parse_op(rid, obj, limits)
    except SarpError as exc:
        return BadMessage(rid, exc)
    except Exception as exc:  # a decoder bug must not take the connection down
        log.exception("wire: decoding request %d failed", rid)
        return BadMessage(rid, Internal(f"request: decoder failed ({type(exc).__name__})"))


def _parse_op(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    op = d.get("op")
    if op is None:
        raise BadRequest("op: missing")
    if type(op) is not str:
        raise BadRequest(f"op: expected a str, got {_kind(op)}")
    parse = _OPS.get(op)
    if parse is None:
        raise UnknownOp(f"op: unknown op {_show(op)} (known: {', '.join(sorted(_OPS))})")
    return parse(rid, d, limits)


def _op_check(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    return Check(rid, fix=_bool(d, "fix"))


def _op_dump(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    _refuse(d, "dump", "parent")
    return Dump(rid, seq=_need_seq(d, limits, "dump"))


def _op_match(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    _refuse(d, "match", "parent")
    return Match(rid, seq=_need_seq(d, limits, "match"), with_ids=_bool(d, "with_ids"))


def _op_insert(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    seq = _need_seq(d, limits, "insert")
    meta_v = d.get("meta")
    if meta_v is None:
        raise BadRequest("meta: missing (one uint for all blocks, or one per block)")
    meta = _meta(meta_v, _blocks(seq, limits), limits)
    parent_v = d.get("parent")
    parent = None if parent_v is None else _one_id(parent_v, "parent")
    return Insert(rid, seq=seq, meta=meta, parent=parent)


def _op_remove(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    _refuse(d, "remove", "parent")
    seq = _seq(d, limits, "remove", required=False)
    ids_v = d.get("ids")
    if seq is not None and ids_v is not None:
        raise BadRequest("remove: give either tokens/hashes (with from) or ids, not both")
    if ids_v is not None:
        if d.get("from") is not None:
            raise BadRequest("from: only with tokens or hashes, not with ids")
        return Remove(rid, ns=_ns(d, limits), ids=_ids(ids_v, "ids", limits))
    if seq is None:
        raise BadRequest("remove: needs tokens or hashes (with optional from), or ns and ids")
    return Remove(rid, seq=seq, start=_uint(d, "from"), ns=seq.ns)


def _op_clear(rid: int, d: dict[str, Any], limits: Limits) -> Request:
    for name in ("tokens", "hashes", "ids", "parent"):
        _refuse(d, "clear", name, hint="; clear takes ns, mask and value (use remove)")
    if d.get("ns") is None:
        raise BadRequest("ns: missing (clear needs the namespace to clear)")
    mask, value = _uint(d, "mask"), _uint(d, "value")
    if value & ~mask:
        raise BadRequest(f"value: {value:#x} has bits outside mask {mask:#x} (would match nothing)")
    return Clear(rid, ns=_ns(d, limits), mask=mask, value=value)


_OPS: dict[str, Callable[[int, dict[str, Any], Limits], Request]] = {
    "hello": lambda rid, d, limits: Hello(rid),  # field-less ops ignore every field
    "ping": lambda rid, d, limits: Ping(rid),
    "stats": lambda rid, d, limits: Stats(rid),
    "snapshot": lambda rid, d, limits: Snapshot(rid),
    "match": _op_match,
    "insert": _op_insert,
    "remove": _op_remove,
    "clear": _op_clear,
    "check": _op_check,
    "dump": _op_dump,
    "report": lambda rid, d, limits: parse_report(rid, d),
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
    _OddMap: "map",
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
    if n > limits.max_sequence_tokens:
        raise TooLarge(
            f"tokens: {n} tokens exceeds max_sequence_tokens ({limits.max_sequence_tokens})"
        )


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


# --------------------------------------------------------------------------- encoding

# Shared by every connection (and thread): `pack` of plain values never calls back
# into Python, so it runs start to end under the GIL. Numpy values are converted first.
_packer = msgpack.Packer(use_bin_type=True)


def _plain(v: Any) -> Any:
    """Numpy scalars/arrays and other near-plain values -> msgpack-able values."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, str):
        return _safe_text(v)
    if v is None or isinstance(v, bool | int | float | bytes):
        return v
    return str(v)


def _pack(msg: dict[str, Any]) -> bytes:
    try:
        out: bytes = _packer.pack(msg)
    except (TypeError, ValueError):  # numpy values, lone surrogates, paths...
        out = _packer.pack(_plain(msg))
    return out


def _safe_text(s: str) -> str:
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def encode_ok(req_id: int, fields: Mapping[str, Any]) -> bytes:
    """A success response: ``{"id", "ok": true, **fields}``."""
    msg: dict[str, Any] = {"id": req_id, "ok": True}
    for key, value in fields.items():
        if key not in ("id", "ok"):
            msg[key] = value
    return _pack(msg)


def encode_error(req_id: int, err: SarpError) -> bytes:
    """A failure response with the error's wire code and message."""
    message = getattr(err, "message", None) or str(err)
    error = {"code": _safe_text(err.code), "message": _safe_text(message)}
    return _pack({"id": req_id, "ok": False, "error": error})


def encode_result(req_id: int, result: object, *, block_tokens: int = 16) -> bytes:
    """A typed index result (or a dict, None, or a SarpError) -> response bytes."""
    if isinstance(result, MatchResult):
        fields: dict[str, Any] = {
            "blocks": int(result.blocks),
            "tokens": int(result.blocks) * block_tokens,
            "meta": np.ascontiguousarray(result.meta, dtype="<u8").tobytes(),
        }
        if result.ids is not None:
            fields["ids"] = ids_to_bytes(result.ids)
        return encode_ok(req_id, fields)
    if isinstance(result, InsertResult):
        return encode_ok(
            req_id,
            {
                "blocks": result.blocks,
                "new_blocks": result.new_blocks,
                "matched_blocks": result.matched_blocks,
            },
        )
    if isinstance(result, RemoveResult):
        return encode_ok(req_id, {"removed": result.removed})
    if isinstance(result, SnapshotResult):
        return encode_ok(
            req_id, {"segment_id": result.segment_id, "seconds": float(result.seconds)}
        )
    if isinstance(result, CheckReport):
        return encode_ok(
            req_id,
            {
                "segments": result.segments,
                "routing_points": result.routing_points,
                "problems": [str(p) for p in result.problems],
                "fixed": result.fixed,
                "clean": result.clean,
            },
        )
    if isinstance(result, SarpError):
        return encode_error(req_id, result)
    if isinstance(result, Mapping):
        return encode_ok(req_id, result)
    if result is None:
        return encode_ok(req_id, {})
    raise TypeError(f"encode_result: cannot encode a {type(result).__name__}")


def encode_request(req_id: int, op: str, fields: Mapping[str, Any]) -> bytes:
    """A request ``{"id", "op", **fields}``; fields whose value is None are left out."""
    msg: dict[str, Any] = {"id": req_id, "op": op}
    for key, value in fields.items():
        if value is not None and key not in ("id", "op"):
            msg[key] = value
    return _pack(msg)


_ERROR_CLASSES: dict[str, type[SarpError]] = {
    cls.code: cls
    for cls in (
        BadRequest, UnknownOp, UnknownParent, TooLarge, Busy, Forbidden, Unavailable, Internal,
        QuotaExceeded,
    )
}


def error_from_code(code: str, message: str) -> SarpError:
    """The SarpError subclass for a wire error code (unknown code: a plain SarpError
    carrying that code)."""
    cls = _ERROR_CLASSES.get(code)
    if cls is not None:
        return cls(message)
    err = SarpError(message)
    err.code = code
    return err
