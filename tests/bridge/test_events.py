"""The bridge's sans-I/O parts: decoding vLLM EventBatch payloads (both encodings,
versions with fewer or more fields), the id mapping, namespaces, metadata bits, the
ops, and the position file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
from sarpd.bridge.mapping import (
    TIER_MASK,
    WORKER_MASK,
    ClearOp,
    InsertOp,
    RemoveOp,
    Translator,
    block_meta,
    worker_clear,
)
from sarpd.bridge.stats import load_position, save_position
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


def test_meta_bits_and_clear_masks() -> None:
    assert block_meta(3, "GPU") == block_meta(3, None) == 3 << 48
    assert block_meta(3, "cpu") == (3 << 48) | (1 << 40)
    assert block_meta(65535, "LocalDisk") == (65535 << 48) | (2 << 40)
    assert block_meta(1, "tape") == (1 << 48) | (255 << 40)
    mask, value = worker_clear(3)
    assert (mask, value) == (WORKER_MASK, 3 << 48)
    assert block_meta(3, "CPU") & mask == value and block_meta(4, "GPU") & mask != value
    mask, value = worker_clear(3, "CPU")
    assert mask == WORKER_MASK | TIER_MASK
    assert block_meta(3, "CPU") & mask == value and block_meta(3, "GPU") & mask != value


def _batch(*events: dict[str, object]) -> list[object]:
    return list(decode_batch(encode_batch(list(events))).events)


def test_translator_namespaces_follow_lora_salt_and_parent() -> None:
    tr = Translator(worker=2, ns_template="llama/w{worker}")
    toks = list(range(32))
    first, cont, lora, cpu = (
        tr.event(e)
        for e in _batch(
            stored([1, 2], None, toks, extra_keys=[["t7"], None]),  # salted, block 0
            stored([3], 2, toks[:16]),  # continuation: the parent's namespace
            stored([4], None, toks[:16], lora_name="sql", extra_keys=[["sql"]]),
            stored([5], None, toks[:16], medium="CPU"),
        )
    )
    meta = 2 << 48
    assert first.ops == (InsertOp("llama/w2/salt=t7", (1, 2), None, meta),)
    assert cont.ops == (InsertOp("llama/w2/salt=t7", (3,), 2, meta),)
    assert lora.ops == (InsertOp("llama/w2/lora=sql", (4,), None, meta),)
    assert cpu.kind == "ignored"  # another tier, and no namespace per tier
    # removals go where each block was stored, one remove per namespace
    (rm,) = (tr.event(e) for e in _batch(removed([1, 4, 9])))
    assert rm.kind == "removed"
    assert set(rm.ops) == {
        RemoveOp("llama/w2/salt=t7", (1,)),
        RemoveOp("llama/w2/lora=sql", (4,)),
        RemoveOp("llama/w2", (9,)),
    }
    (cl,) = (tr.event(e) for e in _batch(cleared()))
    assert cl.kind == "cleared"
    assert {op.ns for op in cl.ops if isinstance(op, ClearOp)} == {
        "llama/w2", "llama/w2/salt=t7", "llama/w2/lora=sql"
    }  # fmt: skip
    assert all(isinstance(op, ClearOp) and op.value == meta for op in cl.ops)


def test_translator_after_restart_removes_in_every_known_namespace() -> None:
    tr = Translator(worker=0, known=["", "salt=a", "lora=x"])
    assert not tr.trust_map
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert sorted(op.ns for op in rm.ops) == ["", "lora=x", "salt=a"]
    tr.event(_batch(cleared())[0])  # after a clear the map is complete again
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert rm.ops == (RemoveOp("", (7,)),)


def test_translator_filters_groups_and_unknown_events() -> None:
    tr = Translator(worker=1, group=0)
    evs = _batch(stored([1], None, [0] * 16, group_idx=1), {"type": "Other", "x": 1})
    assert [(t.kind, t.ops) for t in map(tr.event, evs)] == [("ignored", ()), ("ignored", ())]
    with pytest.raises(BadRequest, match="worker"):
        Translator(worker=70000)
    with pytest.raises(BadRequest, match="ns"):
        Translator(worker=1, ns_template="m/{rank}")
    assert Translator(worker=1, ns_template="{{x}}/{medium}").base_ns("CPU") == "{x}/cpu"


def test_position_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pos.json"
    assert load_position(path, "tcp://e:1", 3).last_seq is None
    save_position(path, "tcp://e:1", 3, 41, {"b", "a"})
    pos = load_position(path, "tcp://e:1", 3)
    assert (pos.last_seq, pos.namespaces) == (41, ("a", "b"))
    assert not (tmp_path / "sub" / "pos.json.tmp").exists()
    # another engine or worker: start afresh rather than skip its events
    assert load_position(path, "tcp://other:1", 3).last_seq is None
    assert load_position(path, "tcp://e:1", 4).last_seq is None
    path.write_text(json.dumps({"format": 9}))
    with pytest.raises(BadRequest, match="format"):
        load_position(path, "tcp://e:1", 3)


def test_translator_tiers_and_unanchored_stores() -> None:
    """Other tiers are indexed only with a namespace per tier; stores without parent
    and tokens (offloading connectors) never: their positions are unknown."""
    shared, per_tier = Translator(worker=1), Translator(worker=1, ns_template="{medium}")
    cpu_store = stored([5], None, [0] * 16, medium="CPU")
    cpu_remove = removed([5], medium="CPU")
    bare = stored([6, 7], None, [], medium="CPU")
    kinds = [shared.event(e).kind for e in _batch(cpu_store, cpu_remove, bare)]
    assert kinds == ["ignored", "ignored", "ignored"]
    st, rm, br = (per_tier.event(e) for e in _batch(cpu_store, cpu_remove, bare))
    assert st.ops == (InsertOp("cpu", (5,), None, (1 << 48) | (1 << 40)),)
    assert rm.ops == (RemoveOp("cpu", (5,)),)
    assert br.kind == "ignored"
    (gpu,) = (per_tier.event(e) for e in _batch(stored([8], None, [0] * 16)))
    assert gpu.ops == (InsertOp("gpu", (8,), None, 1 << 48),)
