"""Decoding vLLM EventBatch payloads (sarpd.events.schema): both encodings, versions
with fewer or more fields (the current ones too), engine hashes, replay replies in
both framings, errors naming the field."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from sarpd.errors import BadRequest
from sarpd.events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    ExtraKey,
    OtherEvent,
    decode_batch,
    decode_replay,
    decode_seq,
    engine_hash,
)
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
        first_tokens=tuple(range(16)),  # the first block's, of a store from position 0
    )
    assert rm == BlockRemoved((7, engine_hash(DIGEST)), "CPU")
    assert cl == AllBlocksCleared()


def test_old_short_arrays_and_new_unknown_fields() -> None:
    # an early vLLM: [tag, hashes, parent, token_ids, block_size, lora_id] only
    old = msgpack.packb([1.0, [["BlockStored", [1, 2], 9, list(range(32)), 16, None]]])
    (ev,) = decode_batch(old).events
    assert ev == BlockStored((1, 2), 9, 16, num_tokens=32)
    # a future vLLM: extra trailing array fields (after locality and ownership), extra
    # map keys, unknown event types
    new = msgpack.packb(
        [2.0, [["BlockRemoved", [3], "GPU", 0, None, None, "future", 42], ["ShinyNewEvent", 1]]]
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
        (b"\xc1", "payload: not msgpack"),
        (msgpack.packb(7), "EventBatch: expected an array or a map, got int"),
        (msgpack.packb(["x", []]), r"EventBatch: .* - at `\$\.ts`"),
        (msgpack.packb([1.0, {}]), r"EventBatch: .* - at `\$\.events`"),
        (msgpack.packb([1.0, [[5]]]), r"- at `\$\.events\[0\]`"),
        (msgpack.packb([1.0, [["BlockStored", "nope", None, [], 16]]]),
         r"`\$\.events\[0\]\.block_hashes`"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [], 0]]]),
         r"`\$\.events\[0\]\.block_size`"),
        (msgpack.packb([1.0, [["BlockStored", [1], 2.5, [], 16]]]),
         r"`\$\.events\[0\]\.parent_block_hash`"),
        (msgpack.packb([1.0, [["BlockRemoved", [1], 7]]]), r"`\$\.events\[0\]\.medium`"),
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


def test_decode_replay_both_framings() -> None:
    seq = (7).to_bytes(8, "big")
    end = (-1).to_bytes(8, "big", signed=True)
    current = decode_replay([b"", b"kv", seq, b"payload"])  # vLLM now: topic included
    assert (current.seq, current.payload, current.topic, current.end) == (7, b"payload", b"kv",
                                                                          False)  # fmt: skip
    older = decode_replay([b"", seq, b"payload"])
    assert (older.seq, older.payload, older.topic) == (7, b"payload", None)
    assert decode_replay([b"", b"", end, b""]).end and decode_replay([b"", end, b""]).end


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([b"", b"x"], "2 frames, expected 3 or 4"),
        ([b"", b"kv", b"", (1).to_bytes(8, "big"), b"p"], "5 frames"),
        ([b"id", (1).to_bytes(8, "big"), b"p"], "frame 0 is 2 bytes"),
        ([b"", b"kv", b"\1", b"p"], "sequence frame: 1 bytes, expected 8"),
        ([b"", (-2).to_bytes(8, "big", signed=True), b""], "sequence -2 is negative"),
    ],
)
def test_decode_replay_errors_name_the_frame(frames: list[bytes], message: str) -> None:
    with pytest.raises(EventDecodeError, match=message):
        decode_replay(frames)


def test_current_fields_in_both_encodings() -> None:
    """locality, ownership, session_id and lookahead_token_ids, as array fields after
    the cache-spec ones and as map keys; typed extra keys become ExtraKey."""
    arr = ["BlockStored", [1], None, [0] * 16, 16, None, "STORAGE", None, None, 0, None, None,
           "REMOTE", "fs0", "s9", [5]]  # fmt: skip
    as_map = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
              "token_ids": [0] * 16, "block_size": 16, "lora_id": None, "medium": "STORAGE",
              "lora_name": None, "group_idx": 0, "locality": "REMOTE", "ownership": "fs0",
              "session_id": "s9", "lookahead_token_ids": [5]}  # fmt: skip
    want = BlockStored((1,), None, 16, "STORAGE", group_idx=0, num_tokens=16,
                       locality="REMOTE", ownership="fs0", session_id="s9", lookahead=1,
                       first_tokens=(0,) * 16)
    for ev in (arr, as_map):
        assert decode_batch(msgpack.packb([1.0, [ev]])).events == (want,)
    removed_map = {"type": "BlockRemoved", "block_hashes": [1], "medium": "STORAGE",
                   "locality": "LOCAL", "ownership": "obj"}  # fmt: skip
    assert decode_batch(msgpack.packb([1.0, [removed_map]])).events == (
        BlockRemoved((1,), "STORAGE", None, "LOCAL", "obj"),)
    typed = {**as_map, "extra_keys": [[{"type": "cache_salt", "salt": "t"},
                                       {"type": "mm", "modality": "image", "hash": "h",
                                        "block_offset": 3}, "raw"], None]}  # fmt: skip
    (st,) = decode_batch(msgpack.packb([1.0, [typed]])).events
    assert isinstance(st, BlockStored) and st.first_extra_keys == (
        ExtraKey("cache_salt", "t"),
        ExtraKey("mm", (("block_offset", 3), ("hash", "h"), ("modality", "image"))), "raw")
    bad = {**as_map, "lookahead_token_ids": 5}
    with pytest.raises(EventDecodeError, match=r"events\[0\]\.lookahead_token_ids"):
        decode_batch(msgpack.packb([1.0, [bad]]))
    with pytest.raises(EventDecodeError, match=r"events\[0\]\.locality"):
        decode_batch(msgpack.packb([1.0, [{**as_map, "locality": 1}]]))
