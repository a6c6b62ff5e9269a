"""vLLM KV-cache events: decode an `EventBatch` payload into frozen records (sans-I/O).

vLLM (`vllm/distributed/kv_events.py`) publishes msgspec structs encoded as msgpack,
one `EventBatch` per ZMQ message (frames: topic, 8-byte big-endian sequence number,
payload). Two encodings exist across vLLM versions, and both are accepted:

- ``array_like``: a struct is an array of its fields in declaration order; a tagged
  event puts its tag first: ``["BlockStored", block_hashes, parent, ...]``, and an
  `EventBatch` is ``[ts, events, data_parallel_rank]``;
- maps: a struct is a map of field names; an event carries its tag in ``"type"``.

Trailing fields may be missing (older versions, ``omit_defaults``) and extra fields
(newer versions: ``group_idx``, ``lora_name``, ``extra_keys``, cache-spec fields...)
are ignored. Events of an unknown type decode to `OtherEvent` (counted, skipped).

Block hashes arrive as ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, and every
version before sha256 hashing; old ones could be negative: Python's ``hash()``) or as
bytes (the full digest). Both become one unsigned 64-bit int: an int modulo 2**64,
bytes as vLLM's own int form, ``int.from_bytes(digest, "big") & (2**64 - 1)`` (the
last 8 bytes). One block therefore has one id whichever form the engine sends.
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
    "OtherEvent",
    "decode_batch",
    "decode_seq",
    "engine_hash",
]

MASK64 = (1 << 64) - 1
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
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


class EventDecodeError(BadRequest):
    """A payload that is not a vLLM EventBatch (the message names the field)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """New full blocks after `parent` (None: from position 0), in chain order."""

    block_hashes: tuple[int, ...]
    parent: int | None
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    lora_id: int | None = None
    # extra keys of the FIRST block (LoRA name, multimodal ids, cache salt...)
    first_extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    num_tokens: int = 0  # len(token_ids): 0 in offloading connectors' events


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


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
    extra = f.get("extra_keys")
    first: tuple[Any, ...] | None = None
    if isinstance(extra, list) and extra and isinstance(extra[0], list | tuple):
        first = tuple(_freeze(k) for k in extra[0])
    return BlockStored(
        block_hashes=hashes,
        parent=parent,
        block_size=block_size,
        medium=_opt(f.get("medium"), str, f"{where}.medium"),
        lora_name=_opt(f.get("lora_name"), str, f"{where}.lora_name"),
        lora_id=_opt(f.get("lora_id"), int, f"{where}.lora_id"),
        first_extra_keys=first,
        group_idx=_opt(f.get("group_idx"), int, f"{where}.group_idx"),
        num_tokens=len(tokens) if isinstance(tokens, list) else 0,
    )


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def _hashes(v: object, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise EventDecodeError(f"{name}: expected a list, got {type(v).__name__}")
    return tuple(engine_hash(h, f"{name}[{i}]") for i, h in enumerate(v))


def _opt(v: object, kind: type, name: str) -> Any:
    if v is None or (type(v) is kind):
        return v
    raise EventDecodeError(f"{name}: expected {kind.__name__} or nil, got {type(v).__name__}")
