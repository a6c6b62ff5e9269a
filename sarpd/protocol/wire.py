"""Sans-I/O wire codec of docs/PROTOCOL.md (h11's style: no sockets, no asyncio):
msgpack bytes -> typed requests (`Decoder`), typed results -> msgpack bytes (below it).

`Decoder`: a skipping unpacker finds where each message ends, under the stream limits
(``max_frame_size``, the frame budgets, msgpack's 1,024 levels of nesting: `Limits`,
PROTOCOL.md "Limits"); each message then has the one typed decode of
`sarpd.protocol.requests`: msgspec reads one whose fields have their wire types,
msgpack builds any other under the budgets, and one set of rules judges either. Past a
stream limit, or on bytes that are not msgpack, `feed` raises `StreamError` (the
server answers ``encode_error(0, exc)`` and closes). Memory: an unfinished message
costs its bytes, twice (at most ``max_frame_size + 1`` in the skipper's buffer and in
ours), never objects; a built one at most ~40 MB of objects (max_sequence_tokens ints).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from sarpd import errors, model
from sarpd.errors import BadRequest, FrameError, SarpError
from sarpd.model import Request
from sarpd.protocol import requests
from sarpd.protocol.requests import BadMessage, Limits, parse_message

__all__ = ["BadMessage", "Decoder", "Limits", "StreamError", "encode_error", "encode_ok",
           "encode_request", "encode_result", "error_from_code", "parse_message"]


class StreamError(FrameError):
    """What `Decoder.feed` raises. ``decoded``: the requests completed earlier in the
    same ``feed`` (in order), which the server may answer before it closes."""

    def __init__(self, message: str, code: str = "too_large",
                 decoded: list[Request | BadMessage] | None = None) -> None:
        super().__init__(message, code)
        self.decoded: list[Request | BadMessage] = decoded if decoded is not None else []


@dataclasses.dataclass(slots=True)
class _Budget:
    """Per-message container/item counters, fed by the unpacker's hooks."""

    limits: Limits
    containers: int = 0
    items: int = 0

    def on_list(self, items: list[Any]) -> list[Any]:
        self.containers, self.items, lim = self.containers + 1, self.items + len(items), self.limits
        if self.containers > lim.max_containers:
            raise FrameError(f"frame: more than {lim.max_containers} maps and arrays in one "
                             f"message exceeds max_containers ({lim.max_containers})")
        if self.items > lim.max_items:
            raise FrameError(f"frame: {self.items} array elements and map pairs in one "
                             f"message exceeds max_items ({lim.max_items})")
        return items

    def on_map(self, pairs: list[tuple[Any, Any]]) -> dict[str, Any] | requests.OddMap:
        self.on_list(pairs)
        return dict(pairs) if all(type(key) is str for key, _ in pairs) else requests.OddMap(pairs)


_LEN_LIMIT_RE = re.compile(r"(\d+) exceeds max_(\w+)_len\((\d+)\)")


class Decoder:
    """Streaming request decoder for one connection: ``feed(data)`` returns every request
    completed by ``data`` (`Request`s and `BadMessage`s, in stream order), or raises
    `StreamError`, then again on every ``feed``. The skipper builds nothing (a header
    declaring a huge array costs nothing until its bytes arrive); nothing holds the
    caller's buffer past ``feed``."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = lim = limits if limits is not None else Limits()
        self.protocol = 1  # until a hello negotiates another (requests.negotiate)
        self._skipper = msgpack.Unpacker(max_buffer_size=lim.max_frame_size + 1)
        self._unpack: dict[str, Any] = dict(  # bad UTF-8: a per-request error; keys: the hook
                            raw=False, unicode_errors="surrogateescape", strict_map_key=False,
                            max_str_len=min(lim.max_str_bytes, lim.max_frame_size),
                            max_bin_len=lim.max_frame_size, max_ext_len=lim.max_frame_size,
                            max_array_len=lim.max_items, max_map_len=lim.max_map_len)
        self._fed = 0  # stream offset of everything fed
        self._frame_start = 0  # stream offset where the unfinished message starts
        self._pending = bytearray()  # its bytes fed before the last chunk
        self._dead: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished message held (in each of the two buffers)."""
        return self._fed - self._frame_start

    def feed(self, data: bytes | bytearray | memoryview) -> list[Request | BadMessage]:
        """Requests completed by ``data``, in stream order (see `Decoder`, `StreamError`)."""
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
        pos, limit = 0, self.limits.max_frame_size
        while True:
            if self.buffered > limit:
                raise FrameError(f"frame: message of at least {self.buffered} bytes exceeds "
                                 f"max_frame_size ({limit})")
            if pos >= len(view):
                return
            # Never more than one byte past the limit: the buffers stay bounded.
            chunk = view[pos : pos + limit + 1 - self.buffered]
            self._skipper.feed(chunk)
            at, self._fed, pos = self._fed, self._fed + len(chunk), pos + len(chunk)
            self._drain(chunk, at, out)
            self._pending += chunk[max(self._frame_start - at, 0):]

    def _drain(self, chunk: memoryview, at: int, out: list[Request | BadMessage]) -> None:
        """Decode every message the skipper finds complete in `chunk` (fed from `at`)."""
        limit = self.limits.max_frame_size
        while True:
            try:
                self._skipper.skip()
            except msgpack.OutOfData:
                return
            except Exception as exc:  # not msgpack: the stream is unusable
                raise self._stream_error(exc) from exc
            start, end = self._frame_start, self._skipper.tell()
            if end - start > limit:
                raise FrameError(f"frame: {end - start} bytes exceeds max_frame_size ({limit})")
            if self._pending:  # it began in an earlier chunk
                frame: bytes | memoryview = bytes(self._pending + chunk[: end - at])
                self._pending.clear()
            else:
                frame = chunk[start - at : end - at]
            self._frame_start = end
            out.append(self._message(frame))

    def _message(self, frame: bytes | memoryview) -> Request | BadMessage:
        """The request of one complete message."""
        obj: object = requests.read_frame(frame, self.limits)
        if obj is None:  # another shape: built under the frame budgets, to be judged
            budget = _Budget(self.limits)
            try:
                obj = msgpack.unpackb(frame, object_pairs_hook=budget.on_map,
                                      list_hook=budget.on_list, **self._unpack)
            except FrameError:
                raise
            except Exception as exc:  # over a limit, or a malformed ext value
                raise self._stream_error(exc) from exc
            deep = requests.too_deep(obj, self.limits.max_depth) \
                if budget.containers > self.limits.max_depth else None
            if deep is not None:
                return deep
        req = parse_message(obj, self.limits, self.protocol)
        if isinstance(req, model.Hello):  # the connection speaks what hello negotiated
            self.protocol = requests.negotiate(req.protocol)
        return req

    def _stream_error(self, exc: Exception) -> FrameError:
        found = _LEN_LIMIT_RE.search(str(exc)) if isinstance(exc, ValueError) else None
        if found is not None:
            n, kind, lim = found.groups()
            unit = "bytes" if kind in ("str", "bin", "ext") else "entries"
            name = "max_str_bytes" if kind == "str" else f"max_{kind}_len"
            return FrameError(f"frame: {kind} of {n} {unit} exceeds {name} ({lim}) "
                              f"(max_frame_size {self.limits.max_frame_size})")
        detail = f" ({exc})" if str(exc) else ""
        return FrameError(f"frame: not valid msgpack in the message at stream byte "
                          f"{self._frame_start}{detail}", code="bad_request")


# --------------------------------------------------------------------------- encoding

# Shared by every connection (and thread): `pack` of plain values never calls back
# into Python, so it runs start to end under the GIL. Any other message (numpy values,
# lone surrogates, paths...) is packed by a packer of its own that converts them.
_packer = msgpack.Packer(use_bin_type=True)


def _plain(v: Any) -> Any:
    """A value msgpack cannot pack -> one it can: numpy's as Python's, any other as str."""
    return v.tolist() if isinstance(v, np.generic | np.ndarray) else \
        dict(v) if isinstance(v, Mapping) else str(v)


def _pack(msg: dict[str, Any]) -> bytes:
    try:
        out: bytes = _packer.pack(msg)
    except (TypeError, ValueError):
        out = msgpack.packb(msg, default=_plain, unicode_errors="backslashreplace")
    return out


def encode_ok(req_id: int, fields: Mapping[str, Any]) -> bytes:
    """A success response: ``{"id", "ok": true, **fields}``."""
    return _pack({"id": req_id, "ok": True,
                  **{k: v for k, v in fields.items() if k not in ("id", "ok")}})


def encode_error(req_id: int, err: SarpError) -> bytes:
    """A failure response with the error's wire code and message."""
    message = getattr(err, "message", None) or str(err)
    return _pack({"id": req_id, "ok": False, "error": {"code": err.code, "message": message}})


_PLAIN_RESULTS = (model.InsertResult, model.RemoveResult, model.SnapshotResult, model.CheckReport)


def encode_result(req_id: int, result: object, *, block_tokens: int = 16,
                  seq: int | None = None) -> bytes:
    """A typed index result (or a dict, None, or a SarpError) -> response bytes.
    `seq`: a write's sequence in its shard's log (cluster mode, PROTOCOL.md)."""
    msg: dict[str, Any] = {"id": req_id, "ok": True}
    if isinstance(result, model.MatchResult):  # the hot path
        msg["blocks"] = blocks = int(result.blocks)
        msg["tokens"] = blocks * block_tokens
        msg["meta"] = np.ascontiguousarray(result.meta, dtype="<u8").tobytes()
        if result.ids is not None:
            msg["ids"] = model.ids_to_bytes(result.ids)
        if result.holders is not None:
            msg["holders"] = [[m, b] for m, b in result.holders]
        if result.spans is not None:
            msg["spans"] = [list(s) for s in result.spans]
    elif isinstance(result, _PLAIN_RESULTS):  # their fields, as named (PROTOCOL.md "Ops")
        msg.update((f.name, getattr(result, f.name)) for f in dataclasses.fields(result))
        if isinstance(result, model.CheckReport):
            msg["clean"] = result.clean
    elif isinstance(result, SarpError):
        return encode_error(req_id, result)
    elif isinstance(result, Mapping) or result is None:
        return encode_ok(req_id, result or {})
    else:
        raise TypeError(f"encode_result: cannot encode a {type(result).__name__}")
    if seq is not None and isinstance(result, model.InsertResult | model.RemoveResult):
        msg["seq"] = seq
    return _pack(msg)


def encode_request(req_id: int, op: str, fields: Mapping[str, Any]) -> bytes:
    """A request ``{"id", "op", **fields}``; fields whose value is None are left out.
    A value no request can carry (an int outside -2**63..2**64-1) is a `BadRequest`
    naming the field, raised before anything is sent."""
    msg = {"id": req_id, "op": op,
           **{k: v for k, v in fields.items() if v is not None and k not in ("id", "op")}}
    try:
        return _pack(msg)
    except (OverflowError, TypeError, ValueError) as exc:
        raise _unsendable(msg) from exc


def _unsendable(msg: Mapping[str, Any]) -> BadRequest:
    """The error naming the first value of `msg` that cannot be encoded."""
    stack: list[tuple[str, Any]] = list(msg.items())[::-1]
    while stack:
        path, v = stack.pop()
        v = v.tolist() if isinstance(v, np.generic | np.ndarray) else v
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
            return BadRequest(f"{path}: {requests.show(v)} is out of range (no request field "
                              "takes an int outside -2**63..2**64-1)")
        kids = [(f"{path}.{k}", x) for k, x in v.items()] if isinstance(v, Mapping) else \
            [(f"{path}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list | tuple) else []
        stack.extend(reversed(kids))
    return BadRequest("request: a field holds a value that cannot be sent (fields are "
                      "ints, floats, strs, bins, bools, nil, arrays and maps)")


_ERROR_CLASSES: dict[str, type[SarpError]] = {cls.code: cls for cls in (
    BadRequest, errors.UnknownOp, errors.UnknownParent, errors.TooLarge, errors.Busy,
    errors.Forbidden, errors.Unavailable, errors.Internal, errors.QuotaExceeded, errors.Moved)}


def error_from_code(code: str, message: str) -> SarpError:
    """The SarpError subclass for a wire error code (unknown code: a plain SarpError
    carrying that code)."""
    err = _ERROR_CLASSES.get(code, SarpError)(message)
    err.code = code
    return err
