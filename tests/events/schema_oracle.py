"""The reference decoder of engines' KV-event batches (msgpack and Python): the test
oracle of `sarpd.events.schema.decode_batch`, the one decoder sarpd uses.

It was sarpd's fallback decoder until the typed one (msgspec) took every shape; it
stays here, written the plain way, so that the property tests
(tests/events/test_schema_typed.py) can compare the two on random payloads: the same
records, or both reject. Its rules are the module docstring of `sarpd.events.schema`,
SGLang's differences included (`_sglang_salt`), with one exception the typed decoder
documents: reading everything, it rejects a payload with a value that no Python
decoder takes (a string that is not UTF-8, a map keyed by an array) anywhere, where
the typed decoder does not look inside what it skips (token ids it does not need,
unknown fields, the body of an unknown event).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from sarpd.events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    EventDecodeError,
    ExtraKey,
    OtherEvent,
    _first_extra_keys,  # the extra keys' freezing rule: one place (the decoder's)
    _first_tokens,
    engine_hash,
)

MAX_BYTES = 64 * 1024 * 1024
# field order of the array_like encoding (vLLM's declaration order, the tag first)
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
                 "lookahead_token_ids")  # fmt: skip
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


def decode_batch_reference(payload: bytes, max_bytes: int = MAX_BYTES,
                           tokens: bool = False) -> EventBatch:  # fmt: skip
    """`decode_batch` by msgpack and Python."""
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
        salt = _sglang_salt(body, where)
        return _stored(_fields(body, STORED_FIELDS, where), where, tokens, salt)
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


def _sglang_salt(body: list[Any] | dict[str, Any], where: str) -> str | None:
    """SGLang's cache salt: a map event's ``cache_salt``; an array event's
    ``BlockStoredWithMetadata`` puts ``{"cache_salt": ...}`` in lora_name's slot (which
    is then no LoRA name: taken out of `body`)."""
    if isinstance(body, dict):
        return _opt(body.get("cache_salt"), str, f"{where}.cache_salt")  # type: ignore[no-any-return]
    slot = STORED_FIELDS.index("lora_name")
    if len(body) > slot and isinstance(body[slot], dict):
        meta = body[slot]
        body[slot] = None
        return _opt(meta.get("cache_salt"), str, f"{where}.lora_name.cache_salt")  # type: ignore[no-any-return]
    return None


def _stored(f: dict[str, Any], where: str, keep_tokens: bool, salt: str | None) -> BlockStored:
    hashes = _hashes(f.get("block_hashes"), f"{where}.block_hashes")
    parent_v = f.get("parent_block_hash")
    parent = None if parent_v is None else engine_hash(parent_v, f"{where}.parent_block_hash")
    block_size = f.get("block_size")
    if type(block_size) is not int or block_size <= 0:
        raise EventDecodeError(f"{where}.block_size: expected a positive int, got {block_size!r}")
    tokens = f.get("token_ids")
    lookahead = _opt(f.get("lookahead_token_ids"), list, f"{where}.lookahead_token_ids")
    extra = _first_extra_keys(f.get("extra_keys"))
    if salt:
        extra = (*(extra or ()), ExtraKey("cache_salt", salt))
    return BlockStored(
        block_hashes=hashes,
        parent=parent,
        block_size=block_size,
        medium=_opt(f.get("medium"), str, f"{where}.medium"),
        lora_name=_opt(f.get("lora_name"), str, f"{where}.lora_name"),
        lora_id=_opt(f.get("lora_id"), int, f"{where}.lora_id"),
        first_extra_keys=extra,
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


def _hashes(v: object, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise EventDecodeError(f"{name}: expected a list, got {type(v).__name__}")
    return tuple(engine_hash(h, f"{name}[{i}]") for i, h in enumerate(v))


def _opt(v: object, kind: type, name: str) -> Any:
    if v is None or (type(v) is kind):
        return v
    raise EventDecodeError(f"{name}: expected {kind.__name__} or nil, got {type(v).__name__}")
