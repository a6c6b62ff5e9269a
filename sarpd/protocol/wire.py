"""Sans-I/O wire codec of PROTOCOL.md: msgpack bytes -> validated typed requests,
typed results -> msgpack bytes. No sockets, no asyncio (in the style of h11): the
server feeds whatever bytes arrive and writes whatever bytes come back. Framing and
encoding live here; the validation of each decoded message into a typed request lives
in `sarpd.protocol.requests` (its public names are re-exported here).

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

import re
from collections.abc import Mapping
from typing import Any

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
    Hello,
    InsertResult,
    MatchResult,
    RemoveResult,
    Request,
    SnapshotResult,
    ids_to_bytes,
)
from sarpd.protocol.fast import fast_frame_limit, fast_parse
from sarpd.protocol.requests import (  # the validation half (re-exported: its public names)
    BadMessage,
    Limits,
    OddMap,
    negotiate,
    parse_message,
    show,
    too_deep,
)

__all__ = [
    "BadMessage",
    "Decoder",
    "Limits",
    "StreamError",
    "encode_error",
    "encode_ok",
    "encode_request",
    "encode_result",
    "error_from_code",
    "parse_message",
]


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

    def on_map(self, pairs: list[tuple[Any, Any]]) -> dict[str, Any] | OddMap:
        self._count(len(pairs))
        for key, _ in pairs:
            if type(key) is not str:
                return OddMap(pairs)
        return dict(pairs)


_LEN_LIMIT_RE = re.compile(r"(\d+) exceeds max_(\w+)_len\((\d+)\)")


class Decoder:
    """Streaming request decoder for one connection.

    ``feed(data)`` returns every request completed by ``data`` (typed `Request`s and
    `BadMessage`s, in stream order) and raises `StreamError` (a `FrameError`) when
    the stream is unusable; after that every ``feed`` raises it again.

    Two unpackers: a skipping one sees every byte and finds where each message ends
    without building anything, and only then does the other get that message's bytes
    and build it, under the per-type limits and the hooks of `_Budget`. So a header
    that declares a huge array costs nothing until the bytes of that array have
    arrived. (The bytes of an unfinished message are given to the builder at the end
    of each chunk: neither unpacker holds the caller's buffer.)

    With ``fast`` (the default), a complete message of at most
    `fast.fast_frame_limit` bytes that lies in the bytes of one ``feed`` is first
    offered to `fast.fast_parse` (msgspec, for the common match and insert; the builder
    then never sees its bytes); whatever that does not take is built as above, so
    every answer, and every error, is the full path's.
    """

    def __init__(self, limits: Limits | None = None, *, fast: bool = True) -> None:
        self.limits = limits if limits is not None else Limits()
        self.protocol = 1  # until a hello negotiates another (requests.negotiate)
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
        # frames up to this size go through the fast path first (sarpd.protocol.fast)
        self._fast_limit = fast_frame_limit(lim) if fast else 0
        self._chunk = memoryview(b"")  # the bytes fed last, from stream offset _chunk_at
        self._chunk_at = 0
        # The builder gets a message's bytes only when it builds or skips that message
        # (fast-path messages it never sees): it holds the stream up to _built.
        self._built = 0

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
        finally:  # the caller's buffer is not held past this call
            self._chunk, self._chunk_at = memoryview(b""), self._fed
        return out

    def _feed(self, view: memoryview, out: list[Request | BadMessage]) -> None:
        pos, end = 0, len(view)
        limit = self.limits.max_frame_size
        while True:
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
            self._chunk, self._chunk_at = chunk, self._fed
            self._fed += len(chunk)
            pos += len(chunk)
            self._drain(out)
            self._feed_builder(self._fed)  # the unfinished message's bytes, if any

    def _feed_builder(self, upto: int) -> None:
        """Give the builder the stream's bytes from `_built` to `upto` (all in the last
        chunk fed: earlier bytes were given when their chunk was)."""
        if upto > self._built:
            self._builder.feed(self._chunk[self._built - self._chunk_at : upto - self._chunk_at])
            self._built = upto

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
            out.append(self._message(end - size, size))

    def _message(self, start: int, size: int) -> Request | BadMessage:
        """The request of the next complete message in the builder: `size` bytes from
        stream offset `start`."""
        at = start - self._chunk_at
        # small, all in the last chunk fed, and none of it given to the builder yet
        if size <= self._fast_limit and at >= 0 and self._built == start:
            fast = fast_parse(self._chunk[at : at + size], self.limits, self.protocol)
            if fast is not None:
                self._built = start + size  # the builder never sees this message
                return fast
        self._feed_builder(start + size)
        self._budget.reset()
        try:
            obj = self._builder.unpack()
        except FrameError:
            raise
        except Exception as exc:  # over a limit, or a malformed ext value
            raise self._stream_error(exc) from exc
        if self._budget.containers > self.limits.max_depth:
            deep = too_deep(obj, self.limits.max_depth)
            if deep is not None:
                return deep
        req = parse_message(obj, self.limits, self.protocol)
        if isinstance(req, Hello):  # the connection speaks what hello negotiated
            self.protocol = negotiate(req.protocol)
        return req

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
        detail = f" ({exc})" if str(exc) else ""
        return FrameError(
            f"frame: not valid msgpack in the message at stream byte {self._frame_start}"
            f"{detail}",
            code="bad_request",
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


def encode_result(req_id: int, result: object, *, block_tokens: int = 16,
                  seq: int | None = None) -> bytes:
    """A typed index result (or a dict, None, or a SarpError) -> response bytes.
    `seq`: a write's sequence in its shard's log (cluster mode, PROTOCOL.md)."""
    if isinstance(result, MatchResult):  # the response map built at once (hot path)
        blocks = int(result.blocks)
        msg: dict[str, Any] = {
            "id": req_id,
            "ok": True,
            "blocks": blocks,
            "tokens": blocks * block_tokens,
            "meta": np.ascontiguousarray(result.meta, dtype="<u8").tobytes(),
        }
        if result.ids is not None:
            msg["ids"] = ids_to_bytes(result.ids)
        if result.holders is not None:
            msg["holders"] = [[m, b] for m, b in result.holders]
        return _pack(msg)
    if isinstance(result, InsertResult):
        msg = {
            "id": req_id,
            "ok": True,
            "blocks": result.blocks,
            "new_blocks": result.new_blocks,
            "matched_blocks": result.matched_blocks,
        }
        if seq is not None:
            msg["seq"] = seq
        return _pack(msg)
    if isinstance(result, RemoveResult):
        return encode_ok(req_id, {"removed": result.removed} if seq is None
                         else {"removed": result.removed, "seq": seq})
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
    """A request ``{"id", "op", **fields}``; fields whose value is None are left out.
    A value no request can carry (an int outside -2**63..2**64-1) is a `BadRequest`
    naming the field, raised before anything is sent."""
    msg: dict[str, Any] = {"id": req_id, "op": op}
    for key, value in fields.items():
        if value is not None and key not in ("id", "op"):
            msg[key] = value
    try:
        return _pack(msg)
    except (OverflowError, TypeError, ValueError) as exc:
        raise _unsendable(msg) from exc


_INT_MIN, _INT_LIMIT = -(2**63), 2**64


def _unsendable(msg: Mapping[str, Any]) -> BadRequest:
    """The error naming the first value of `msg` that cannot be encoded."""
    stack: list[tuple[str, Any]] = list(msg.items())[::-1]
    while stack:
        path, v = stack.pop()
        if isinstance(v, np.generic | np.ndarray):
            v = v.tolist()
        if isinstance(v, int) and not isinstance(v, bool) and not _INT_MIN <= v < _INT_LIMIT:
            return BadRequest(f"{path}: {show(v)} is out of range (no request field takes "
                              "an int outside -2**63..2**64-1)")
        if isinstance(v, Mapping):
            stack.extend((f"{path}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return BadRequest("request: a field holds a value that cannot be sent (fields are "
                      "ints, floats, strs, bins, bools, nil, arrays and maps)")


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
