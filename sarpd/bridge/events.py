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
decode to `ExtraKey`. What the bridge makes of each: `sarpd.bridge.mapping`.

Block hashes arrive as ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, and every
version before sha256 hashing; old ones could be negative: Python's ``hash()``) or as
bytes (the full digest). Both become one unsigned 64-bit int: an int modulo 2**64,
bytes as vLLM's own int form, ``int.from_bytes(digest, "big") & (2**64 - 1)`` (the
last 8 bytes). One block therefore has one id whichever form the engine sends.

Replay replies (`decode_replay`): the engine's ROUTER socket answers a DEALER with
``[b"", topic, seq, payload]`` per buffered batch and ``[b"", b"", -1, b""]`` at the
end (vLLM since the topic fix of its replay, 4 frames), or, in older versions,
``[b"", seq, payload]`` and ``[b"", -1, b""]`` (3 frames).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack

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


@dataclass(frozen=True, slots=True)
class ExtraKey:
    """One of vLLM's typed extra keys (a map tagged ``lora``, ``cache_salt``, ``mm``,
    ``prompt_embeds``, ``legacy``...): its tag and its value (the one field of
    ``lora`` and ``cache_salt``; otherwise the other fields, frozen)."""

    kind: str
    value: Any


@dataclass(frozen=True, slots=True)
class BlockStored:
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


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True, slots=True)
class OtherEvent:
    """An event type this bridge does not know (skipped, counted as ignored)."""

    tag: str


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared | OtherEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class ReplayReply:
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


def decode_batch(payload: bytes, max_bytes: int = 64 * 1024 * 1024) -> EventBatch:
    """One msgpack `EventBatch` payload -> `EventBatch` (either encoding)."""
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
    decoded = tuple(decode_event(e, i) for i, e in enumerate(events))
    return EventBatch(float(ts), decoded, rank if type(rank) is int else None)


def _fields(raw: object, order: Sequence[str], what: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list):
        return dict(zip(order, raw, strict=False))
    raise EventDecodeError(f"{what}: expected an array or a map, got {type(raw).__name__}")


def decode_event(raw: object, index: int = 0) -> Event:
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
        return _stored(_fields(body, STORED_FIELDS, where), where)
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


def _stored(f: dict[str, Any], where: str) -> BlockStored:
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
    )


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
