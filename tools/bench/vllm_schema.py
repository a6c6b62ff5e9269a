"""vLLM's current KV-event schema as msgspec structs, so that tests and the bridge
benchmark encode events exactly as an engine does (msgspec itself does the encoding:
field order, tags, omitted defaults, ints or bytes).

Written from `vllm/distributed/kv_events.py` as of vLLM 0.33:

- `EventBatch` is ``array_like`` (``[ts, events, data_parallel_rank]``), the events in
  it are tagged maps (``{"type": "BlockStored", ...}``), and every struct omits the
  fields that hold their default (``omit_defaults``);
- `BlockStored` carries per-block ``extra_keys`` (typed keys, maps tagged ``lora``,
  ``cache_salt``, ``mm``), ``locality`` (LOCAL/REMOTE relative to the engine),
  ``ownership`` (the secondary tier that stored it), ``session_id`` (the request that
  caused the store) and ``lookahead_token_ids`` (tokens past each block that its hash
  covers, EAGLE-style successor-aware hashing); `BlockRemoved` carries locality and
  ownership too;
- medium names: ``GPU``, ``CPU``, ``STORAGE`` (vLLM's native FS/OBJ offload).

The hand-made encoder of older shapes (all ``array_like``, fields missing at the end,
unknown extra fields) is `tools.bench.vllm_publisher.encode_batch`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
LOCAL = "LOCAL"
REMOTE = "REMOTE"

BlockHash = int | bytes


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (encoded as maps with ``type``)."""


class ExtraKey(msgspec.Struct, frozen=True, gc=False, tag=True):
    """Base of the typed extra keys of `BlockStored.extra_keys`."""


class LoRAKey(ExtraKey, frozen=True, tag="lora"):
    name: str


class CacheSaltKey(ExtraKey, frozen=True, tag="cache_salt"):
    salt: str


class MultiModalKey(ExtraKey, frozen=True, tag="mm"):
    modality: str
    hash: str
    block_offset: int


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    event_version: int = 1
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


_ENCODER = msgspec.msgpack.Encoder()


def block_stored(
    block_hashes: Sequence[BlockHash],
    parent: BlockHash | None,
    token_ids: Sequence[int],
    block_size: int = 16,
    *,
    medium: str | None = MEDIUM_GPU,
    lora_name: str | None = None,
    **fields: Any,
) -> BlockStored:
    """A `BlockStored` as the engine's block pool builds it (`fields`: the defaulted
    ones, e.g. ``extra_keys``, ``group_idx``, ``locality``, ``session_id``)."""
    return BlockStored(list(block_hashes), parent, list(token_ids), block_size, None,
                       medium, lora_name, **fields)  # fmt: skip


def block_removed(block_hashes: Sequence[BlockHash], medium: str | None = MEDIUM_GPU,
                  **fields: Any) -> BlockRemoved:  # fmt: skip
    return BlockRemoved(list(block_hashes), medium, **fields)


def encode_events(events: Sequence[KVCacheEvent], *, ts: float | None = None,
                  rank: int | None = 0) -> bytes:  # fmt: skip
    """One `EventBatch` payload, stamped with the publisher's data-parallel rank as
    vLLM's `ZmqEventPublisher.publish` does (None: no rank, omitted)."""
    batch = EventBatch(time.time() if ts is None else ts, list(events), rank)
    return _ENCODER.encode(batch)
