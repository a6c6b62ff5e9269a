"""SGLang's KV events (tests/events/sglang_schema.py: msgspec structs mirroring each
revision of SGLang's schema, encoded by msgspec as SGLang encodes them) through the
one decoder and the bridge's mapping: every revision decodes as the oracle does and
to the records the structs say, its differences from vLLM (no rank or one named
attn_dp_rank, events ending at lora_id or medium, the salt in lora_name's array slot
or by name, signed int64 hashes, its media) are taken, and the framing is vLLM's
older one."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.events.mapping import InsertOp, Translator, block_meta
from sarpd.events.schema import (
    _WHOLE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExtraKey,
    decode_batch,
    decode_replay,
    decode_seq,
    engine_hash,
)
from tests.events import sglang_schema as sg
from tests.events.schema_oracle import decode_batch_reference

I64 = st.integers(-(2**63), 2**63 - 1)  # hash_str_to_int64: a signed 64-bit int
TOKENS = list(range(100, 116))


def _stored(version: Any, hashes: list[int], parent: int | None, salt: str | None = None,
            medium: str | None = "GPU", **kw: Any) -> Any:  # fmt: skip
    """A BlockStored of `version`, as its radix cache builds one (lora_id None)."""
    args = (hashes, parent, TOKENS * len(hashes), 16, None)
    if version is sg.V3:
        if salt is not None:
            return sg.V3.BlockStoredWithMetadata(*args, medium,
                                                 metadata=sg.V3.BlockStoredMetadata(salt))
        return sg.V3.BlockStored(*args, medium)
    if version is sg.V4:
        return sg.V4.BlockStored(*args, medium, cache_salt=salt, **kw)
    return version.BlockStored(*args)


def _removed(version: Any, hashes: list[int], medium: str | None = "GPU") -> Any:
    if version in (sg.V3, sg.V4):
        return version.BlockRemoved(hashes, medium)
    return version.BlockRemoved(hashes)


def _batch(version: Any, events: list[Any], rank: int | None = 1) -> bytes:
    if version is sg.V1:
        return sg.encode(sg.V1.EventBatch(12.5, events))
    return sg.encode(version.EventBatch(12.5, events, rank))


VERSIONS = [sg.V1, sg.V2, sg.V3, sg.V4]


@pytest.mark.parametrize("version", VERSIONS, ids=["v1", "v2", "v3", "v4"])
def test_each_revision_decodes_to_its_records(version: Any) -> None:
    salt = "tenant" if version in (sg.V3, sg.V4) else None
    events = [_stored(version, [-5, 7], None, salt), _stored(version, [9], 7),
              _removed(version, [-5]), version.AllBlocksCleared()]  # fmt: skip
    payload = _batch(version, events)
    for tokens in (False, True):
        assert decode_batch(payload, tokens=tokens) == decode_batch_reference(payload,
                                                                              tokens=tokens)
    batch = decode_batch(payload)
    medium = None if version in (sg.V1, sg.V2) else "GPU"
    assert batch.ts == 12.5 and batch.data_parallel_rank == (None if version is sg.V1 else 1)
    first, cont, rm, cl = batch.events
    assert first == BlockStored(
        (2**64 - 5, 7), None, 16, medium, num_tokens=32, first_tokens=tuple(TOKENS),
        first_extra_keys=(ExtraKey("cache_salt", "tenant"),) if salt else None)
    assert cont == BlockStored((9,), 7, 16, medium, num_tokens=16)
    assert rm == BlockRemoved((2**64 - 5,), medium) and cl == AllBlocksCleared()
    # one msgspec call for the whole batch: arrays of arrays (v1-v3), of maps (v4)
    assert msgspec.msgpack.decode(payload, type=list)  # an array batch
    assert _WHOLE[True][0 if version is sg.V4 else 1].decode(payload)


def test_the_current_revision_names_its_salt_and_session() -> None:
    ev = sg.V4.BlockStored([1], None, TOKENS, 16, None, "CPU_PINNED", cache_salt="t",
                           session_id="s9")  # fmt: skip
    (st_,) = decode_batch(_batch(sg.V4, [ev], rank=None)).events
    assert st_ == BlockStored((1,), None, 16, "CPU_PINNED", num_tokens=16,
                              first_extra_keys=(ExtraKey("cache_salt", "t"),),
                              session_id="s9", first_tokens=tuple(TOKENS))
    # omit_defaults: an unsalted store is vLLM's map, no cache_salt key at all
    plain = msgspec.msgpack.decode(sg.encode(sg.V4.BlockStored([1], None, [], 16, None)))
    assert plain == {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                     "token_ids": [], "block_size": 16, "lora_id": None}


def test_a_salted_array_store_puts_its_metadata_where_vllm_has_lora_name() -> None:
    ev = sg.V3.BlockStoredWithMetadata([1], None, TOKENS, 16, None, "GPU",
                                       metadata=sg.V3.BlockStoredMetadata("tenant"))
    assert msgspec.msgpack.decode(sg.encode(ev)) == [
        "BlockStored", [1], None, TOKENS, 16, None, "GPU", {"cache_salt": "tenant"}]
    (st_,) = decode_batch(_batch(sg.V3, [ev])).events
    assert isinstance(st_, BlockStored) and st_.lora_name is None
    assert st_.first_extra_keys == (ExtraKey("cache_salt", "tenant"),)


@st.composite
def _sglang_batch(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from(VERSIONS))
    events: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["stored", "stored", "removed", "cleared"]))
        hashes = draw(st.lists(I64, min_size=1, max_size=4))
        medium = draw(st.sampled_from((None, *sg.MEDIA)))
        if kind == "stored":
            salt = draw(st.one_of(st.none(), st.text(max_size=4)))
            kw = ({"session_id": draw(st.one_of(st.none(), st.text(max_size=3)))}
                  if version is sg.V4 else {})  # fmt: skip
            events.append(_stored(version, hashes, draw(st.one_of(st.none(), I64)), salt,
                                  medium, **kw))
        elif kind == "removed":
            events.append(_removed(version, hashes, medium))
        else:
            events.append(version.AllBlocksCleared())
    return _batch(version, events, draw(st.one_of(st.none(), st.integers(0, 7))))


@settings(max_examples=400, deadline=None)
@given(payload=_sglang_batch(), tokens=st.booleans())
def test_random_sglang_batches_decode_as_the_oracle(payload: bytes, tokens: bool) -> None:
    got = decode_batch(payload, tokens=tokens)
    assert got == decode_batch_reference(payload, tokens=tokens)
    for ev in got.events:  # signed int64 hashes fold into uint64 ids
        assert all(0 <= h < 2**64 for h in getattr(ev, "block_hashes", ()))


def test_the_framing_is_vllms_older_one() -> None:
    payload = _batch(sg.V4, [sg.V4.AllBlocksCleared()])
    topic, seq, body = sg.frames(41, sg.V4.EventBatch(1.0, [], 0), topic=b"kv")
    assert (topic, decode_seq(seq), decode_batch(body).events) == (b"kv", 41, ())
    reply = decode_replay(sg.replay_reply(7, payload))  # 3 frames, no topic
    assert (reply.seq, reply.topic, reply.payload, reply.end) == (7, None, payload, False)
    assert decode_replay(sg.replay_reply(-1, b"")).end


def test_the_bridge_maps_sglangs_media_and_salt() -> None:
    tr = Translator(worker=3, ns_template="{medium}", holders=False)
    h = [-5, 7]
    evs = decode_batch(_batch(sg.V4, [
        sg.V4.BlockStored(h, None, TOKENS * 2, 16, None, "GPU", cache_salt="t7"),
        sg.V4.BlockStored([9], 7, TOKENS, 16, None, "GPU"),  # continuation: inherits
        sg.V4.BlockStored([11], None, TOKENS, 16, None, "CPU_PINNED"),
        sg.V4.BlockStored([12], None, TOKENS, 16, None, "DISK"),
        sg.V4.BlockStored([13], None, TOKENS, 16, None, "EXTERNAL"),
    ])).events  # fmt: skip
    salted, cont, cpu, disk, external = (tr.event(e) for e in evs)
    ids = tuple(engine_hash(x) for x in h)
    assert salted.ops == (InsertOp("gpu/salt=t7", ids, None, block_meta(3, "GPU")),)
    assert cont.ops == (InsertOp("gpu/salt=t7", (9,), 7, block_meta(3, "GPU")),)
    assert cpu.ops == (InsertOp("cpu", (11,), None, (3 << 48) | (1 << 40)),)
    assert disk.ops == (InsertOp("disk", (12,), None, (3 << 48) | (2 << 40)),)
    assert (external.kind, external.reason) == ("ignored", "remote")  # a shared pool
