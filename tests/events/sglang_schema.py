"""SGLang's KV-event schema, as msgspec structs mirroring SGLang's own, so that tests
encode events exactly as an SGLang server does (msgspec itself encodes: field order,
tags, array or map, trailing nulls). Public source, sgl-project/sglang,
``python/sglang/srt/disaggregation/kv_events.py``, one class per revision seen:

- `V1`, commit 006d053f182f9b488d2bd841afa06d5f9120a258: `EventBatch` ``[ts, events]``
  (``array_like``, ``omit_defaults``); events ``array_like`` and tagged:
  ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id)``,
  ``BlockRemoved(block_hashes)``, ``AllBlocksCleared``;
- `V2`, commit 612d579090db24ec7c47cc5ca6b83e0c649b8c28: `EventBatch` gains
  ``attn_dp_rank: Optional[int] = None`` (third: vLLM's ``data_parallel_rank`` slot),
  set by the publisher to its rank;
- `V3`, a later revision of the same file (no commit id in the copy read): without
  ``omit_defaults``; ``medium: Optional[str] = None`` on BlockStored and BlockRemoved
  (`StorageMedium`: ``GPU``, ``CPU_PINNED``, ``DISK``, ``EXTERNAL``; the radix cache
  sends ``GPU``), and a salted store is ``BlockStoredWithMetadata`` (same tag,
  ``kw_only`` ``metadata: BlockStoredMetadata(cache_salt: str)``: an array slot after
  ``medium``, where vLLM has ``lora_name``);
- `V4`, the current one (copied as SGLang-side test fixtures by a consumer: "events are
  tagged msgpack maps, the same encoding vLLM uses"): `EventBatch` still an array;
  events maps with ``omit_defaults``, BlockStored with ``medium``, ``cache_salt`` and
  ``session_id`` by name.

Block hashes are `int` everywhere: `hash_str_to_int64` of a sha256 hex digest
(signed: negative half the time; python/sglang/srt/mem_cache/radix_cache.py, one
BlockStored per page, ``block_size`` = the page's tokens, ``lora_id`` None).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

# ruff: noqa: UP007, UP045 -- SGLang's own spelling (Optional, Union)
# Each revision is a namespace class; msgspec's ``tag=True`` would tag a nested class by
# its qualified name (``V1.BlockStored``), so each event names its tag: the class name,
# as SGLang's ``tag=True`` does.


class V1:
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False,
                       tag=True):  # fmt: skip
        pass

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int]

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


class V2(V1):
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        attn_dp_rank: Optional[int] = None


class V3:
    class EventBatch(msgspec.Struct, array_like=True, gc=False):
        ts: float
        events: list[Any]
        attn_dp_rank: Optional[int] = None

    class KVCacheEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
        pass

    class BlockStoredMetadata(msgspec.Struct, omit_defaults=True, gc=False):
        cache_salt: str

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str] = None

    class BlockStoredWithMetadata(BlockStored, tag="BlockStored", kw_only=True):
        metadata: V3.BlockStoredMetadata

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: Optional[str] = None

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


class V4:
    class EventBatch(msgspec.Struct, array_like=True, gc=False):
        ts: float
        events: list[Any]
        attn_dp_rank: Optional[int] = None

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str] = None
        cache_salt: Optional[str] = None
        session_id: Optional[str] = None

    class BlockRemoved(KVCacheEvent, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: Optional[str] = None

    class AllBlocksCleared(KVCacheEvent, tag="AllBlocksCleared"):
        pass


Batch = Union[V1.EventBatch, V2.EventBatch, V3.EventBatch, V4.EventBatch]
MEDIA = ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")  # StorageMedium's values


def encode(batch: Batch) -> bytes:
    """The payload frame `ZmqEventPublisher` sends for `batch` (msgspec's encoder)."""
    return msgspec.msgpack.encode(batch)


def frames(seq: int, batch: Batch, topic: bytes = b"") -> list[bytes]:
    """The live message: ``(topic, seq as 8 bytes big-endian, payload)``."""
    return [topic, seq.to_bytes(8, "big"), encode(batch)]


def replay_reply(seq: int, payload: bytes) -> list[bytes]:
    """What a DEALER receives for one buffered batch: the ROUTER sends
    ``(client_id, b"", seq, payload)`` and the identity is stripped (no topic)."""
    return [b"", seq.to_bytes(8, "big", signed=True), payload]
