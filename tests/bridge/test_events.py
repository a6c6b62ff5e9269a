"""Decoding vLLM EventBatch payloads (sarpd.bridge.events): both encodings, versions
with fewer or more fields, engine hashes, errors naming the field."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from sarpd.bridge.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    OtherEvent,
    decode_batch,
    decode_seq,
    engine_hash,
)
from sarpd.errors import BadRequest
from tools.bench.vllm_publisher import cleared, encode_batch, removed, stored

DIGEST = hashlib.sha256(b"block").digest()


@pytest.mark.parametrize("array_like", [True, False], ids=["array_like", "map"])
def test_decode_both_encodings(array_like: bool) -> None:
    events = [
        stored(
            [DIGEST, 5],
            None,
            list(range(32)),
            lora_name="sql",
            extra_keys=[["sql", "tenant"], ["sql"]],
            group_idx=0,
            kv_cache_spec_kind="full_attention",
        ),
        removed([7, DIGEST], medium="CPU"),
        cleared(),
    ]
    batch = decode_batch(encode_batch(events, array_like=array_like, ts=12.5, rank=2))
    assert batch.ts == 12.5 and batch.data_parallel_rank == 2
    st, rm, cl = batch.events
    assert st == BlockStored(
        block_hashes=(engine_hash(DIGEST), 5),
        parent=None,
        block_size=16,
        medium="GPU",
        lora_name="sql",
        first_extra_keys=("sql", "tenant"),
        group_idx=0,
        num_tokens=32,
    )
    assert rm == BlockRemoved((7, engine_hash(DIGEST)), "CPU")
    assert cl == AllBlocksCleared()


def test_old_short_arrays_and_new_unknown_fields() -> None:
    # an early vLLM: [tag, hashes, parent, token_ids, block_size, lora_id] only
    old = msgpack.packb([1.0, [["BlockStored", [1, 2], 9, list(range(32)), 16, None]]])
    (ev,) = decode_batch(old).events
    assert ev == BlockStored((1, 2), 9, 16, num_tokens=32)
    # a future vLLM: extra trailing array fields, extra map keys, unknown event types
    new = msgpack.packb(
        [2.0, [["BlockRemoved", [3], "GPU", 0, "future", 42], ["ShinyNewEvent", 1, 2]]]
    )
    assert decode_batch(new).events == (BlockRemoved((3,), "GPU", 0), OtherEvent("ShinyNewEvent"))
    as_map = msgpack.packb(
        {"ts": 3, "events": [{"type": "AllBlocksCleared", "reason": "x"}], "more": {"a": 1}}
    )
    assert decode_batch(as_map).events == (AllBlocksCleared(),)


def test_engine_hash_forms() -> None:
    # bytes fold to vLLM's own int form: the last 8 bytes, big-endian
    assert engine_hash(DIGEST) == int.from_bytes(DIGEST[-8:], "big")
    assert engine_hash(DIGEST) == int.from_bytes(DIGEST, "big") & (2**64 - 1)
    assert engine_hash(2**64 - 1) == 2**64 - 1
    assert engine_hash(-1) == 2**64 - 1  # Python hash() of old vLLM versions
    assert engine_hash(b"\x01") == 1
    for bad in (b"", "str", 1.5, None):
        with pytest.raises(EventDecodeError):
            engine_hash(bad)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb(7), "EventBatch"),
        (msgpack.packb(["x", []]), "EventBatch.ts"),
        (msgpack.packb([1.0, {}]), "EventBatch.events"),
        (msgpack.packb([1.0, [[5]]]), r"events\[0\]"),
        (msgpack.packb([1.0, [["BlockStored", "nope", None, [], 16]]]), "block_hashes"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [], 0]]]), "block_size"),
        (msgpack.packb([1.0, [["BlockStored", [1], 2.5, [], 16]]]), "parent_block_hash"),
        (msgpack.packb([1.0, [["BlockRemoved", [1], 7]]]), "medium"),
    ],
)
def test_decode_errors_name_the_field(payload: bytes, field: str) -> None:
    with pytest.raises(EventDecodeError, match=field) as info:  # a regex
        decode_batch(payload)
    assert isinstance(info.value, BadRequest) and info.value.code == "bad_request"


def test_decode_seq() -> None:
    assert decode_seq((41207).to_bytes(8, "big")) == 41207
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(EventDecodeError, match="4 bytes"):
        decode_seq(b"\0\0\0\1")
