"""vLLM KV-cache events: decode an `EventBatch` payload into frozen records (sans-I/O).

vLLM (`vllm/distributed/kv_events.py`) publishes msgspec structs encoded as msgpack,
one `EventBatch` per ZMQ message (frames: topic, 8-byte big-endian sequence number,
payload). A struct is encoded either way, per struct class and across versions, and
both are accepted at every level:

- ``array_like``: an array of its fields in declaration order; a tagged event puts
  its tag first: ``["BlockStored", block_hashes, parent, ...]``, and an `EventBatch`
  is ``[ts, events, data_parallel_rank]`` (current vLLM: the batch is an array, its
  events are maps);
- maps: a map of field names; an event carries its tag in ``"type"``.

Fields with a default are left out when they hold it (``omit_defaults``; older
versions lack them too) and fields this bridge does not know are ignored. Events of
an unknown type decode to `OtherEvent` (counted, skipped). Of `BlockStored`'s newer
fields: ``locality`` (LOCAL/REMOTE relative to the engine) and ``ownership`` (which
secondary tier) are kept, ``session_id`` (the request that caused the store, not an
owner: blocks are shared) is kept but indexes nothing, ``lookahead_token_ids`` (the
hashes also cover tokens past each block) is kept as a count. ``extra_keys`` (one
entry per block) are read for the first block only, as raw values (strings, lists,
bytes) or vLLM's typed keys (maps tagged ``lora``, ``cache_salt``, ``mm``...), which
decode to `ExtraKey`. What the bridge makes of each: `sarpd.events.mapping`.

Block hashes arrive as ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, and every
version before sha256 hashing; old ones could be negative: Python's ``hash()``) or as
bytes (the full digest). Both become one unsigned 64-bit int: an int modulo 2**64,
bytes as vLLM's own int form, ``int.from_bytes(digest, "big") & (2**64 - 1)`` (the
last 8 bytes). One block therefore has one id whichever form the engine sends.

Decoding is msgspec's, typed, in C (the structs at the end of this module: one per
shape, tokens kept as raw msgpack) wherever a payload fits them; the rest goes to
the reference (`decode_batch_reference`: msgpack and Python), which also names every
error. Both give the same records (tests/events/test_schema_typed.py). The records
are frozen msgspec Structs (immutable, slotted, compared by value like frozen
dataclasses, and ~20x cheaper to build: the bridge builds several per event).

Replay replies (`decode_replay`): the engine's ROUTER socket answers a DEALER with
``[b"", topic, seq, payload]`` per buffered batch and ``[b"", b"", -1, b""]`` at the
end (vLLM since the topic fix of its replay, 4 frames), or, in older versions,
``[b"", seq, payload]`` and ``[b"", -1, b""]`` (3 frames).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import msgpack
import msgspec
import numpy as np

from sarpd.errors import BadRequest

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "EventDecodeError",
    "ExtraKey",
    "OtherEvent",
    "ReplayReply",
    "decode_batch",
    "decode_batch_reference",
    "decode_replay",
    "decode_seq",
    "engine_hash",
]

MASK64 = (1 << 64) - 1
MAX_BYTES = 64 * 1024 * 1024  # of one payload
END_SEQ = -1  # the sequence number of a replay's end marker
# Field order of the array_like encoding (vLLM's declaration order, tag first).
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


class EventDecodeError(BadRequest):
    """A payload that is not a vLLM EventBatch (the message names the field)."""


class ExtraKey(msgspec.Struct, frozen=True):
    """One of vLLM's typed extra keys (a map tagged ``lora``, ``cache_salt``, ``mm``,
    ``prompt_embeds``, ``legacy``...): its tag and its value (the one field of
    ``lora`` and ``cache_salt``; otherwise the other fields, frozen)."""

    kind: str
    value: Any


class BlockStored(msgspec.Struct, frozen=True):
    """New full blocks after `parent` (None: from position 0), in chain order."""

    block_hashes: tuple[int, ...]
    parent: int | None
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    # extra keys of the FIRST block (LoRA name, multimodal ids, cache salt...): raw
    # values, lists frozen to tuples, typed keys as `ExtraKey`
    first_extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    num_tokens: int = 0  # len(token_ids): 0 in offloading connectors' events
    locality: str | None = None  # "LOCAL" / "REMOTE" relative to the engine; None: unsaid
    ownership: str | None = None  # the secondary (offloading) tier that stored it
    session_id: str | None = None  # the request that caused the store (not an owner)
    lookahead: int = 0  # len(lookahead_token_ids): tokens past the blocks in their hashes
    # the first block's tokens of a store from position 0 (the hash-agreement check)
    first_tokens: tuple[int, ...] = ()
    # every token id as uint32 LE, when asked for (`decode_batch(..., tokens=True)`: the
    # daemon's listeners key blocks by their tokens); None when not asked for, absent, or
    # not all uint32
    token_bytes: bytes | None = None


class BlockRemoved(msgspec.Struct, frozen=True):
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True):
    pass


class OtherEvent(msgspec.Struct, frozen=True):
    """An event type this bridge does not know (skipped, counted as ignored)."""

    tag: str


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared | OtherEvent


class EventBatch(msgspec.Struct, frozen=True):
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


class ReplayReply(msgspec.Struct, frozen=True):
    """One reply of the replay socket: a buffered batch, or the end (`seq` -1)."""

    seq: int
    payload: bytes
    topic: bytes | None = None  # None: the older 3-frame framing carries no topic

    @property
    def end(self) -> bool:
        return self.seq == END_SEQ


def engine_hash(value: object, name: str = "block hash") -> int:
    """An engine block hash (int or bytes) -> unsigned 64-bit int (module docstring)."""
    if type(value) is int:
        return value & MASK64
    if isinstance(value, bytes):
        if not value:
            raise EventDecodeError(f"{name}: empty bytes")
        return int.from_bytes(value, "big") & MASK64
    raise EventDecodeError(f"{name}: expected int or bytes, got {type(value).__name__}")


def decode_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence frame (signed: the replay end marker is -1)."""
    if len(frame) != 8:
        raise EventDecodeError(f"sequence frame: {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_replay(frames: Sequence[bytes]) -> ReplayReply:
    """One message a DEALER received from the replay ROUTER socket, in either framing
    (module docstring): ``[b"", topic, seq, payload]`` or ``[b"", seq, payload]``."""
    if len(frames) not in (3, 4):
        raise EventDecodeError(f"replay reply: {len(frames)} frames, expected 3 or 4")
    if frames[0] != b"":
        raise EventDecodeError(f"replay reply: frame 0 is {len(frames[0])} bytes, expected "
                               "the empty delimiter")  # fmt: skip
    topic = frames[1] if len(frames) == 4 else None
    seq = decode_seq(frames[-2])
    if seq < END_SEQ:
        raise EventDecodeError(f"replay reply: sequence {seq} is negative")
    return ReplayReply(seq, frames[-1], topic)


def decode_batch(payload: bytes, max_bytes: int = MAX_BYTES, typed: bool = True,
                 tokens: bool = False) -> EventBatch:
    """One msgpack `EventBatch` payload -> `EventBatch` (either encoding): msgspec's
    typed decoding where the payload has one of the four shapes below (`_typed`),
    else (or with ``typed=False``) the reference, which also names what is wrong.
    `tokens`: keep each store's token ids (`BlockStored.token_bytes`)."""
    if len(payload) > max_bytes:
        raise EventDecodeError(f"payload: {len(payload)} bytes exceeds max_bytes ({max_bytes})")
    if typed:
        batch = _typed(payload, tokens)
        if batch is not None:
            return batch
    return decode_batch_reference(payload, max_bytes, tokens)


def decode_batch_reference(payload: bytes, max_bytes: int = MAX_BYTES,
                           tokens: bool = False) -> EventBatch:
    """`decode_batch` by msgpack and Python: every shape, and the errors."""
    if len(payload) > max_bytes:
        raise EventDecodeError(f"payload: {len(payload)} bytes exceeds max_bytes ({max_bytes})")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:
        raise EventDecodeError(f"payload: not msgpack ({type(exc).__name__}: {exc})") from exc
    fields = _fields(raw, BATCH_FIELDS, "EventBatch")
    ts = fields.get("ts")
    events = fields.get("events")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise EventDecodeError(f"EventBatch.ts: expected a number, got {ts!r:.40}")
    if not isinstance(events, list):
        raise EventDecodeError(f"EventBatch.events: expected a list, got {events!r:.40}")
    rank = fields.get("data_parallel_rank")
    decoded = tuple(decode_event(e, i, tokens) for i, e in enumerate(events))
    return EventBatch(float(ts), decoded, rank if type(rank) is int else None)


def _fields(raw: object, order: Sequence[str], what: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list):
        return dict(zip(order, raw, strict=False))
    raise EventDecodeError(f"{what}: expected an array or a map, got {type(raw).__name__}")


def decode_event(raw: object, index: int = 0, tokens: bool = False) -> Event:
    """One tagged event, ``[tag, *fields]`` or ``{"type": tag, ...}``."""
    where = f"events[{index}]"
    body: list[Any] | dict[str, Any]
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, body = raw[0], raw[1:]
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, body = raw["type"], raw
    else:
        raise EventDecodeError(f"{where}: expected a tagged array or a map with 'type'")
    if tag == "BlockStored":
        return _stored(_fields(body, STORED_FIELDS, where), where, tokens)
    if tag == "BlockRemoved":
        f = _fields(body, REMOVED_FIELDS, where)
        return BlockRemoved(
            _hashes(f.get("block_hashes"), f"{where}.block_hashes"),
            _opt(f.get("medium"), str, f"{where}.medium"),
            _opt(f.get("group_idx"), int, f"{where}.group_idx"),
            _opt(f.get("locality"), str, f"{where}.locality"),
            _opt(f.get("ownership"), str, f"{where}.ownership"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return OtherEvent(tag)


def _stored(f: dict[str, Any], where: str, keep_tokens: bool = False) -> BlockStored:
    hashes = _hashes(f.get("block_hashes"), f"{where}.block_hashes")
    parent_v = f.get("parent_block_hash")
    parent = None if parent_v is None else engine_hash(parent_v, f"{where}.parent_block_hash")
    block_size = f.get("block_size")
    if type(block_size) is not int or block_size <= 0:
        raise EventDecodeError(f"{where}.block_size: expected a positive int, got {block_size!r}")
    tokens = f.get("token_ids")
    lookahead = _opt(f.get("lookahead_token_ids"), list, f"{where}.lookahead_token_ids")
    return BlockStored(
        block_hashes=hashes,
        parent=parent,
        block_size=block_size,
        medium=_opt(f.get("medium"), str, f"{where}.medium"),
        lora_name=_opt(f.get("lora_name"), str, f"{where}.lora_name"),
        lora_id=_opt(f.get("lora_id"), int, f"{where}.lora_id"),
        first_extra_keys=_first_extra_keys(f.get("extra_keys")),
        group_idx=_opt(f.get("group_idx"), int, f"{where}.group_idx"),
        num_tokens=len(tokens) if isinstance(tokens, list) else 0,
        locality=_opt(f.get("locality"), str, f"{where}.locality"),
        ownership=_opt(f.get("ownership"), str, f"{where}.ownership"),
        session_id=_opt(f.get("session_id"), str, f"{where}.session_id"),
        lookahead=len(lookahead) if lookahead else 0,
        first_tokens=_first_tokens(tokens, block_size) if parent is None else (),
        token_bytes=_token_bytes(tokens) if keep_tokens else None,
    )


def _token_bytes(tokens: object) -> bytes | None:
    """Token ids as uint32 LE bytes; None unless a list of ints in 0..2**32-1."""
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        return None
    if tokens and (min(tokens) < 0 or max(tokens) >= 2**32):
        return None
    return np.array(tokens, dtype="<u4").tobytes()


def _first_tokens(tokens: object, block_size: int) -> tuple[int, ...]:
    if not isinstance(tokens, list) or len(tokens) < block_size:
        return ()
    head = tokens[:block_size]
    return tuple(head) if all(type(t) is int and 0 <= t < 2**32 for t in head) else ()


def _first_extra_keys(extra: object) -> tuple[Any, ...] | None:
    """The first block's extra keys (vLLM sends one entry per block, or None)."""
    if isinstance(extra, list) and extra and isinstance(extra[0], list | tuple):
        return tuple(_freeze(k) for k in extra[0])
    return None


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        tag = v.get("type")
        if not isinstance(tag, str):
            return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
        rest = {str(k): _freeze(x) for k, x in v.items() if k != "type"}
        if len(rest) == 1:
            return ExtraKey(tag, next(iter(rest.values())))
        return ExtraKey(tag, tuple(sorted(rest.items())))
    return v


def _hashes(v: object, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise EventDecodeError(f"{name}: expected a list, got {type(v).__name__}")
    return tuple(engine_hash(h, f"{name}[{i}]") for i, h in enumerate(v))


def _opt(v: object, kind: type, name: str) -> Any:
    if v is None or (type(v) is kind):
        return v
    raise EventDecodeError(f"{name}: expected {kind.__name__} or nil, got {type(v).__name__}")


# ------------------------------------------------------------- typed decoding (msgspec)
#
# The same shapes as above, as msgspec structs: msgspec (the library vLLM encodes
# with) decodes and type-checks a whole batch in C. `token_ids`, `lookahead_token_ids`
# and `extra_keys` stay raw msgpack (`msgspec.Raw`): the bridge needs the length of
# the first two (read off the array header) and the tokens of a first block or the
# extra keys only now and then, so no Python object is made per token. Anything the
# structs do not take (an unknown event type, a batch mixing array and map events, a
# wrong type anywhere, an empty bytes hash) returns None: the reference then decodes
# it, or names the error, exactly as before.

_Hash: TypeAlias = "int | bytes"
_NO_RAW = msgspec.Raw()
_STORED_TYPES: dict[str, Any] = {
    "block_hashes": list[int | bytes],
    "parent_block_hash": int | bytes | None,
    "token_ids": msgspec.Raw,
    "block_size": int | None,
    "lora_id": int | None,
    "medium": str | None,
    "lora_name": str | None,
    "extra_keys": msgspec.Raw,
    "group_idx": int | None,
    "locality": str | None,
    "ownership": str | None,
    "session_id": str | None,
    "lookahead_token_ids": msgspec.Raw,
}
_REMOVED_TYPES: dict[str, Any] = {
    "block_hashes": list[int | bytes],
    "medium": str | None,
    "group_idx": int | None,
    "locality": str | None,
    "ownership": str | None,
}


def _struct_fields(order: Sequence[str], types: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every field of `order` (ignored ones as `Any`: any value), all defaulted."""
    return [(f, types.get(f, Any), _NO_RAW if types.get(f) is msgspec.Raw else None)
            for f in order]  # fmt: skip


def _event_structs(array_like: bool) -> tuple[type, type, type]:
    kw: dict[str, Any] = {"array_like": array_like, "tag_field": "type"}
    return (
        msgspec.defstruct("BlockStored", _struct_fields(STORED_FIELDS, _STORED_TYPES),
                          tag="BlockStored", **kw),
        msgspec.defstruct("BlockRemoved", _struct_fields(REMOVED_FIELDS, _REMOVED_TYPES),
                          tag="BlockRemoved", **kw),
        msgspec.defstruct("AllBlocksCleared", [], tag="AllBlocksCleared", **kw),
    )  # fmt: skip


_ARRAY_EVENTS = _event_structs(array_like=True)
_MAP_EVENTS = _event_structs(array_like=False)
_BATCH_FIELDS = [("ts", float | None, None), ("events", Any, None),
                 ("data_parallel_rank", Any, None)]  # fmt: skip


def _batch_struct(array_like: bool, events: tuple[type, type, type]) -> type:
    fields = [(n, list[events[0] | events[1] | events[2]] if n == "events" else t, d)  # type: ignore[valid-type]
              for n, t, d in _BATCH_FIELDS]  # fmt: skip
    return msgspec.defstruct("EventBatch", fields, array_like=array_like)


# (array batch, map events) is today's vLLM: tried first
_DECODERS: dict[bool, list[msgspec.msgpack.Decoder[Any]]] = {
    True: [msgspec.msgpack.Decoder(_batch_struct(True, _MAP_EVENTS)),
           msgspec.msgpack.Decoder(_batch_struct(True, _ARRAY_EVENTS))],
    False: [msgspec.msgpack.Decoder(_batch_struct(False, _MAP_EVENTS)),
            msgspec.msgpack.Decoder(_batch_struct(False, _ARRAY_EVENTS))],
}  # fmt: skip
_ARRAY_HEAD = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
_MAP_HEAD = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def _typed(payload: bytes, tokens: bool = False) -> EventBatch | None:
    """`decode_batch` by msgspec, or None where the reference must decide."""
    if not payload:
        return None
    head = payload[0]
    if head not in _ARRAY_HEAD and head not in _MAP_HEAD:
        return None
    for dec in _DECODERS[head in _ARRAY_HEAD]:
        try:
            raw = dec.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue
        try:
            return _from_struct(raw, tokens)
        except (_Reference, ValueError, TypeError):
            return None
    return None


class _Reference(Exception):
    """Something only the reference decides (or names the error of)."""


def _from_struct(raw: Any, tokens: bool = False) -> EventBatch:
    if raw.ts is None or raw.events is None:
        raise _Reference
    events: list[Event] = []
    for ev in raw.events:
        tag = type(ev).__name__
        if tag == "BlockStored":
            events.append(_stored_of(ev, tokens))
        elif tag == "BlockRemoved":
            events.append(BlockRemoved(_fold(ev.block_hashes), ev.medium, ev.group_idx,
                                       ev.locality, ev.ownership))  # fmt: skip
        else:
            events.append(AllBlocksCleared())
    rank = raw.data_parallel_rank
    return EventBatch(raw.ts, tuple(events), rank if type(rank) is int else None)


def _fold(hashes: list[_Hash] | None) -> tuple[int, ...]:
    """Engine hashes -> unsigned 64-bit ids, without Python work per hash when they are
    ints below 2**64 (msgpack's ints are, unless negative)."""
    if hashes is None:  # missing: the reference names it
        raise _Reference
    if not hashes:
        return ()
    try:
        if min(hashes) >= 0:  # type: ignore[operator]
            return tuple(hashes)  # type: ignore[arg-type]
    except TypeError:  # bytes, or a mix
        pass
    if b"" in hashes:  # an empty bytes hash: the reference names it
        raise _Reference
    return tuple(engine_hash(h) for h in hashes)


def _array_len(raw: msgspec.Raw) -> int | None:
    """The length of a raw msgpack array; None for nil or absent; else _Reference."""
    if not len(raw):
        return None
    m = memoryview(raw)
    b = m[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xC0:
        return None
    if b == 0xDC:
        return int.from_bytes(m[1:3], "big")
    if b == 0xDD:
        return int.from_bytes(m[1:5], "big")
    raise _Reference


_TOKENS = msgspec.msgpack.Decoder(list[int])


def _head_tokens(raw: msgspec.Raw, block_size: int) -> tuple[int, ...]:
    """`_first_tokens` of raw token ids (all ints: decoded in C; else the reference's
    way)."""
    try:
        head = _TOKENS.decode(raw)[:block_size]
    except msgspec.ValidationError:
        return _first_tokens(msgpack.unpackb(raw), block_size)
    return tuple(head) if min(head) >= 0 and max(head) < 2**32 else ()


def _stored_of(ev: Any, keep_tokens: bool = False) -> BlockStored:
    block_size = ev.block_size
    if block_size is None or block_size <= 0:
        raise _Reference
    pv = ev.parent_block_hash
    parent = pv if pv is None or (type(pv) is int and pv >= 0) else _fold([pv])[0]
    n_tokens = _array_len_or_zero(ev.token_ids)
    lookahead = _array_len(ev.lookahead_token_ids) if len(ev.lookahead_token_ids) else 0
    first_tokens = (_head_tokens(ev.token_ids, block_size)
                    if parent is None and n_tokens >= block_size else ())  # fmt: skip
    extra = ev.extra_keys
    first_extra = (_first_extra_keys(msgpack.unpackb(extra, raw=False, strict_map_key=False))
                   if len(extra) else None)  # fmt: skip
    return BlockStored(_fold(ev.block_hashes), parent, block_size, ev.medium, ev.lora_name,
                       ev.lora_id, first_extra, ev.group_idx, n_tokens, ev.locality,
                       ev.ownership, ev.session_id, lookahead or 0, first_tokens,
                       _raw_token_bytes(ev.token_ids) if keep_tokens else None)  # fmt: skip


def _raw_token_bytes(raw: msgspec.Raw) -> bytes | None:
    """`_token_bytes` of raw token ids (all ints: decoded in C; else the reference's)."""
    if not len(raw):
        return None
    try:
        return _token_bytes(_TOKENS.decode(raw))
    except msgspec.ValidationError:
        return _token_bytes(msgpack.unpackb(raw))


def _array_len_or_zero(raw: msgspec.Raw) -> int:
    """`token_ids` counts only as an array (anything else: no tokens, as the reference)."""
    try:
        return _array_len(raw) or 0
    except _Reference:
        return 0
