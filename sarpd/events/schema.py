"""Engines' KV-cache events (vLLM, SGLang): decode an `EventBatch` payload into frozen
records (sans-I/O).

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

SGLang (`python/sglang/srt/disaggregation/kv_events.py`) publishes the same
`EventBatch` (its rank field is named ``attn_dp_rank``: same place), on the same
frames, with these differences, all accepted: its older events are ``array_like``
and end at ``lora_id`` (later at ``medium``); a salted store of those versions
(``BlockStoredWithMetadata``) puts ``{"cache_salt": SALT}`` in the array slot where
vLLM has ``lora_name``; its current events are maps that carry ``cache_salt`` (and
``session_id``) by name. A salt read either way becomes a typed extra key of the
first block, ``ExtraKey("cache_salt", SALT)``, as vLLM's typed salt decodes. Its
media (``GPU``, ``CPU_PINNED``, ``DISK``, ``EXTERNAL``) are mapped by
`sarpd.events.mapping`; its block hashes are signed 64-bit ints (below).

Block hashes arrive as ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, and every
version before sha256 hashing; old ones could be negative: Python's ``hash()``;
SGLang's are sha256 digests folded to a signed int64) or as bytes (the full digest).
All become one unsigned 64-bit int: an int modulo 2**64, bytes as vLLM's own int
form, ``int.from_bytes(digest, "big") & (2**64 - 1)`` (the last 8 bytes). One block
therefore has one id whichever form the engine sends.

One decoder, msgspec's, typed, in C (the structs at the end of this module): a whole
batch of one of the four shapes (array or map batch; array or map events; today's
vLLM, array batch and map events, is tried first) is decoded and type-checked in one
call, with `token_ids`, `lookahead_token_ids` and `extra_keys` kept as raw msgpack
(the bridge needs the length of the first two, read off the array header, and the
tokens of a first block or the extra keys only now and then). A batch that fits none
of them (an unknown event type, array and map events mixed, or an error) is decoded
again with its events raw, then each event by its own head byte: an unknown tag
becomes `OtherEvent`, anything else wrong raises `EventDecodeError` with msgspec's
message and the path of the field (``EventBatch: Expected `int | null`, got `str` -
at `$.events[0].lora_id```). tests/events/schema_oracle.py (msgpack and Python) is
the reference the tests compare it with: the same records, or both reject, except
that what this decoder skips (token ids it does not need, unknown fields, the body
of an unknown event) it does not check for strings that are not UTF-8. The records
are frozen msgspec Structs (immutable, slotted, compared by value like frozen
dataclasses, and ~20x cheaper to build: the bridge builds several per event).

Replay replies (`decode_replay`): the engine's ROUTER socket answers a DEALER with
``[b"", topic, seq, payload]`` per buffered batch and ``[b"", b"", -1, b""]`` at the
end (vLLM since the topic fix of its replay, 4 frames), or, in older versions and
SGLang, ``[b"", seq, payload]`` and ``[b"", -1, b""]`` (3 frames).
"""

from __future__ import annotations

import array
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeAlias

import msgspec

from sarpd.core import native
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
    "decode_replay",
    "decode_seq",
    "engine_hash",
]

MASK64 = (1 << 64) - 1
MAX_BYTES = 64 * 1024 * 1024  # of one payload
END_SEQ = -1  # the sequence number of a replay's end marker
# Field order of the array_like encoding (vLLM's declaration order, tag first;
# SGLang's is a prefix of it, up to `medium`, then its salt in `lora_name`'s slot).
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
    """A payload that is not an engine's EventBatch (the message names the field)."""


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


def decode_batch(payload: bytes, max_bytes: int = MAX_BYTES, tokens: bool = False) -> EventBatch:
    """One msgpack `EventBatch` payload -> `EventBatch` (every shape of the module
    docstring), or `EventDecodeError` naming the field. `tokens`: keep each store's
    token ids (`BlockStored.token_bytes`)."""
    if len(payload) > max_bytes:
        raise EventDecodeError(f"payload: {len(payload)} bytes exceeds max_bytes ({max_bytes})")
    for dec in _WHOLE.get(_SHAPE_OF[payload[0]] if payload else None, ()):
        try:
            raw = dec.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # another shape, or an error: the per-event decoding names it
        return _batch_of(raw, raw.events, tokens)
    return _decode_per_event(payload, tokens)


# ------------------------------------------------------------------ typed decoding
#
# msgspec (the library vLLM and SGLang encode with) decodes and type-checks a whole
# batch in C. `token_ids`, `lookahead_token_ids` and `extra_keys` stay raw msgpack
# (`msgspec.Raw`): the bridge needs the length of the first two (read off the array
# header) and the tokens of a first block or the extra keys only now and then, so no
# Python object is made per token. Every field is optional in the structs: what is
# required (`ts`, `events`, `block_hashes`, a positive `block_size`) is checked after.

_NO_RAW = msgspec.Raw()
_Hash: TypeAlias = "int | bytes"
_STORED_TYPES: dict[str, Any] = {
    "block_hashes": list[int | bytes] | None,
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
# SGLang: the salt of an array event's `BlockStoredWithMetadata` (a map in the slot of
# vLLM's lora_name); a map event's `cache_salt` (by name: no array slot of its own)
_ARRAY_STORED_TYPES = {**_STORED_TYPES, "lora_name": str | dict[Any, Any] | None}
_MAP_STORED_TYPES = {**_STORED_TYPES, "cache_salt": str | None}
_REMOVED_TYPES: dict[str, Any] = {
    "block_hashes": list[int | bytes] | None,
    "medium": str | None,
    "group_idx": int | None,
    "locality": str | None,
    "ownership": str | None,
}
_STORED_MAP_ONLY = ("cache_salt",)


def _struct_fields(order: Sequence[str], types: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every field of `order` (ignored ones as `Any`: any value), all defaulted."""
    return [(f, types.get(f, Any), _NO_RAW if types.get(f) is msgspec.Raw else None)
            for f in order]  # fmt: skip


def _event_structs(array_like: bool) -> tuple[type, type, type]:
    kw: dict[str, Any] = {"array_like": array_like, "tag_field": "type"}
    if array_like:  # `cache_salt`: None on an array event (read from `lora_name`'s slot)
        stored = _struct_fields(STORED_FIELDS, _ARRAY_STORED_TYPES)
        kw_stored: dict[str, Any] = {"namespace": {"cache_salt": None}}
    else:
        stored = _struct_fields(STORED_FIELDS + _STORED_MAP_ONLY, _MAP_STORED_TYPES)
        kw_stored = {}
    return (
        msgspec.defstruct("BlockStored", stored, tag="BlockStored", **kw, **kw_stored),
        msgspec.defstruct("BlockRemoved", _struct_fields(REMOVED_FIELDS, _REMOVED_TYPES),
                          tag="BlockRemoved", **kw),
        msgspec.defstruct("AllBlocksCleared", [], tag="AllBlocksCleared", **kw),
    )  # fmt: skip


_EVENTS = {True: _event_structs(array_like=True), False: _event_structs(array_like=False)}
_STORED = frozenset(e[0] for e in _EVENTS.values())
_REMOVED = frozenset(e[1] for e in _EVENTS.values())


def _batch_struct(array_like: bool, events: Any) -> type:
    fields = [("ts", float | None, None), ("events", list[events] | None, None),
              ("data_parallel_rank", Any, None)]  # fmt: skip
    return msgspec.defstruct("EventBatch", fields, array_like=array_like)


def _union(structs: tuple[type, type, type]) -> Any:
    return structs[0] | structs[1] | structs[2]


# per shape of the batch (True: an array), its events maps then arrays; today's vLLM
# (an array batch of map events) first
_WHOLE: dict[bool | None, list[msgspec.msgpack.Decoder[Any]]] = {
    a: [msgspec.msgpack.Decoder(_batch_struct(a, _union(_EVENTS[m]))) for m in (False, True)]
    for a in (True, False)
}
_RAW_BATCH: dict[bool, msgspec.msgpack.Decoder[Any]] = {
    a: msgspec.msgpack.Decoder(_batch_struct(a, msgspec.Raw)) for a in (True, False)}
_EVENT = {a: msgspec.msgpack.Decoder(_union(_EVENTS[a])) for a in (True, False)}
_TAG = {True: msgspec.msgpack.Decoder(msgspec.defstruct("Tag", [("tag", Any, None)],
                                                          array_like=True)),
        False: msgspec.msgpack.Decoder(msgspec.defstruct("Tag", [("type", Any, None)]))}
_STR_KEYED = msgspec.msgpack.Decoder(dict[Any, msgspec.Raw])
_ENCODE = msgspec.msgpack.Encoder()
_ARRAY_HEAD = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
_MAP_HEAD = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


_SHAPE_OF = tuple(True if b in _ARRAY_HEAD else False if b in _MAP_HEAD else None
                  for b in range(256))  # fmt: skip


def _shape(raw: bytes | msgspec.Raw) -> bool | None:
    """True: a msgpack array, False: a map, None: anything else (or nothing)."""
    return _SHAPE_OF[memoryview(raw)[0]] if len(raw) else None


# ------------------------------------------------------------ event by event, errors


def _decode_per_event(payload: bytes, tokens: bool) -> EventBatch:
    """A batch that no whole-batch shape took: its events raw, then one by one."""
    shape = _shape(payload)
    if shape is None:
        got = type(_value(payload)).__name__
        raise EventDecodeError(f"EventBatch: expected an array or a map, got {got}")
    try:
        raw = _with_str_keys(_RAW_BATCH[shape], payload, "")
    except msgspec.ValidationError as exc:  # (a DecodeError too: first)
        raise EventDecodeError(_located(exc, "", BATCH_FIELDS if shape else None, 0)) from exc
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"payload: not msgpack ({exc})") from exc
    events = [_event(ev, i) for i, ev in enumerate(raw.events or ())]
    return _batch_of(raw, events if raw.events is not None else None, tokens)


def _with_str_keys(dec: msgspec.msgpack.Decoder[Any], raw: bytes | msgspec.Raw,
                   where: str) -> Any:  # fmt: skip
    """`dec.decode(raw)`; a map with keys other than strings is decoded without them
    (msgpack allows any key; no field is named by another), unless a key is an array
    or a map (no msgpack decoder in Python takes those)."""
    try:
        return dec.decode(raw)
    except msgspec.ValidationError as exc:
        if "at `key` in" not in str(exc) or _shape(raw) is not False:
            raise
    fields = _STR_KEYED.decode(raw)
    if any(isinstance(k, tuple | dict) for k in fields):
        raise EventDecodeError(f"EventBatch: a map key is an array or a map - at `${where}`")
    return dec.decode(_ENCODE.encode({k: v for k, v in fields.items() if isinstance(k, str)}))


def _event(raw: msgspec.Raw, i: int) -> Any:
    """One raw event -> its struct (array or map by its head byte), or `OtherEvent`
    for an unknown tag (whatever the rest holds, as an unknown event is skipped)."""
    shape, where = _shape(raw), f".events[{i}]"
    if shape is not None:
        try:
            return _with_str_keys(_EVENT[shape], raw, where)
        except msgspec.ValidationError as exc:
            error = exc
        tag = _with_str_keys(_TAG[shape], raw, where)
        tag = tag.tag if shape else tag.type
        if isinstance(tag, str) and tag not in ("BlockStored", "BlockRemoved",
                                                "AllBlocksCleared"):
            return OtherEvent(tag)
        if isinstance(tag, str):
            order = STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS
            raise EventDecodeError(_located(error, where, order if shape else None, 1))
    raise EventDecodeError("EventBatch: expected a tagged array or a map with `type` - at "
                           f"`${where}`")


_PATH = re.compile(r"`\$((?:\[\d+\]|\.[^`.\[]+)*)`")
_INDEX = re.compile(r"\[(\d+)\]")


def _located(exc: msgspec.ValidationError, where: str, order: Sequence[str] | None,
             first: int) -> str:  # fmt: skip
    """msgspec's message with its path re-rooted at `where` (``$.events[3]``), an
    array_like struct's first index named by `order` (fields from index `first`)."""
    msg = str(exc)

    def named(m: re.Match[str]) -> str:
        path = m.group(1)
        head = _INDEX.match(path)
        if order is not None and head:
            k = int(head.group(1)) - first
            name = order[k] if 0 <= k < len(order) else "type" if k < 0 else None
            path = f".{name}{path[head.end():]}" if name else path
        return f"`${where}{path}`"

    located, n = _PATH.subn(named, msg, count=1)
    return f"EventBatch: {located if n else f'{msg} - at `${where}`'}"


def _value(raw: bytes | msgspec.Raw, field: str | None = None) -> Any:
    """Raw msgpack as Python values (the payload, or an event's `field` read now and
    then: extra keys, tokens that are not all ints); not msgpack (e.g. a string that is
    not UTF-8): an error naming the field."""
    try:
        return msgspec.msgpack.decode(raw)
    except msgspec.DecodeError as exc:
        if field is None:
            raise EventDecodeError(f"payload: not msgpack ({exc})") from exc
        raise _Bad(f"not msgpack ({exc})", field) from exc


# ------------------------------------------------------------- structs -> records


class _Bad(Exception):
    """A wrong field of the event being converted: the message and the field's path
    below the event (``.block_size``); `_batch_of` adds the event's index."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field)
        self.message, self.field = message, field


def _batch_of(raw: Any, events: list[Any] | None, tokens: bool) -> EventBatch:
    if raw.ts is None:
        raise EventDecodeError("EventBatch: Expected `float`, got nothing or `null` - at `$.ts`")
    if events is None:
        raise EventDecodeError("EventBatch: Expected `array`, got nothing or `null` - at "
                               "`$.events`")
    out: list[Event] = []
    add = out.append
    try:
        for ev in events:
            cls = type(ev)
            if cls in _STORED:
                add(_stored_of(ev, tokens))
            elif cls in _REMOVED:
                add(BlockRemoved(_fold(ev.block_hashes), ev.medium, ev.group_idx, ev.locality,
                                 ev.ownership))  # fmt: skip
            elif cls is OtherEvent:
                add(ev)
            else:
                add(AllBlocksCleared())
    except _Bad as bad:  # the event at len(out): the ones before it are converted
        raise EventDecodeError(f"EventBatch: {bad.message} - at "
                               f"`$.events[{len(out)}]{bad.field}`") from bad
    rank = raw.data_parallel_rank
    return EventBatch(raw.ts, tuple(out), rank if type(rank) is int else None)


def _fold(hashes: list[_Hash] | None, field: str = ".block_hashes") -> tuple[int, ...]:
    """Engine hashes -> unsigned 64-bit ids, without Python work per hash when they are
    ints below 2**64 (msgpack's ints are, unless negative)."""
    if hashes is None:
        raise _Bad("Expected `array`, got nothing or `null`", field)
    if not hashes:
        return ()
    try:
        if min(hashes) >= 0:  # type: ignore[operator]
            return tuple(hashes)  # type: ignore[arg-type]
    except TypeError:  # bytes, or a mix
        pass
    if b"" in hashes:
        at = "" if field == ".parent_block_hash" else f"[{hashes.index(b'')}]"
        raise _Bad("an empty bytes hash", f"{field}{at}")
    return tuple(engine_hash(h) for h in hashes)


def _stored_of(ev: Any, keep_tokens: bool) -> BlockStored:
    block_size = ev.block_size
    if block_size is None or block_size <= 0:
        raise _Bad(f"Expected `int` > 0, got {block_size}", ".block_size")
    pv = ev.parent_block_hash
    parent = (pv if pv is None or (type(pv) is int and pv >= 0)
              else _fold([pv], ".parent_block_hash")[0])  # fmt: skip
    n_tokens = _array_len(ev.token_ids) or 0
    lookahead = _array_len(ev.lookahead_token_ids, True) if len(ev.lookahead_token_ids) else 0
    first_tokens = (_head_tokens(ev.token_ids, block_size)
                    if parent is None and n_tokens >= block_size else ())  # fmt: skip
    lora_name, salt, extra = ev.lora_name, ev.cache_salt, ev.extra_keys
    if type(lora_name) is dict:  # SGLang's BlockStoredWithMetadata (array events)
        salt = _metadata_salt(lora_name)
        lora_name = None
    return BlockStored(_fold(ev.block_hashes), parent, block_size, ev.medium, lora_name,
                       ev.lora_id, _extra(extra, salt) if len(extra) or salt else None,
                       ev.group_idx, n_tokens, ev.locality, ev.ownership, ev.session_id,
                       lookahead or 0, first_tokens,
                       _raw_token_bytes(ev.token_ids) if keep_tokens else None)


def _metadata_salt(meta: dict[Any, Any]) -> str | None:
    salt = meta.get("cache_salt")
    if salt is None or type(salt) is str:
        return salt
    raise _Bad(f"Expected `str | null`, got `{type(salt).__name__}` (SGLang's metadata)",
               ".lora_name.cache_salt")


def _extra(raw: msgspec.Raw, salt: str | None) -> tuple[Any, ...] | None:
    """The first block's extra keys, SGLang's salt (if any) last as a typed key."""
    first = _first_extra_keys(_value(raw, ".extra_keys")) if len(raw) else None
    if not salt:
        return first
    return (*(first or ()), ExtraKey("cache_salt", salt))


def _array_len(raw: msgspec.Raw, lookahead: bool = False) -> int | None:
    """The length of a raw msgpack array; None for nil or absent; anything else: None,
    or, for lookahead tokens (a list or nil is required there), an error."""
    if not len(raw):
        return None
    m = memoryview(raw)
    b = m[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return int.from_bytes(m[1:3], "big")
    if b == 0xDD:
        return int.from_bytes(m[1:5], "big")
    if b == 0xC0 or not lookahead:
        return None
    field = ".lookahead_token_ids"
    raise _Bad(f"Expected `array | null`, got `{type(_value(raw, field)).__name__}`", field)


_TOKENS = msgspec.msgpack.Decoder(list[int])
_BIG_ENDIAN = sys.byteorder == "big"
if array.array("I").itemsize != 4:  # pragma: no cover (no such target is supported)
    raise ImportError("sarpd.events.schema: a C unsigned int is not 4 bytes here")


def _head_tokens(raw: msgspec.Raw, block_size: int) -> tuple[int, ...]:
    """`_first_tokens` of raw token ids (all ints: decoded as such, in C)."""
    try:
        head = _TOKENS.decode(raw)[:block_size]
    except msgspec.ValidationError:
        return _first_tokens(_value(raw, ".token_ids"), block_size)
    return tuple(head) if min(head) >= 0 and max(head) < 2**32 else ()


def _raw_token_bytes(raw: msgspec.Raw) -> bytes | None:
    """Every token id as uint32 LE; None when absent or not all ints in 0..2**32-1:
    natively from the msgpack bytes (`sarpd.core._chash.msgpack_u32`: no Python int a
    token) when the kernels have it, else `_ref_token_bytes`."""
    if not len(raw):
        return None
    c = native.pick().hash
    return _ref_token_bytes(raw) if c is None else c.msgpack_u32(raw)


def _ref_token_bytes(raw: msgspec.Raw) -> bytes | None:
    """`_raw_token_bytes` by msgspec's list[int] and one array.array pass."""
    try:
        return _token_bytes(_TOKENS.decode(raw))
    except msgspec.ValidationError:
        return None


def _token_bytes(tokens: list[int]) -> bytes | None:
    """uint32 LE in one C pass (array.array checks the range: ~7x np.array's time
    with a min and a max over 12k ids)."""
    try:
        arr = array.array("I", tokens)  # a C unsigned int: 4 bytes (checked at import)
    except OverflowError:  # negative, or 2**32 and over
        return None
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


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
