"""The typed decoder (msgspec) against the reference (msgpack + Python) of
sarpd.events.schema: the same records, or the same error, on random and adversarial
payloads (both encodings at every level and mixed, short arrays, unknown fields and
events, int / negative / bytes / empty hashes, wrong types anywhere, tokens that are
not ints, typed and raw extra keys, lookahead tokens, ranks of any type)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.events.schema import (
    REMOVED_FIELDS,
    STORED_FIELDS,
    EventBatch,
    EventDecodeError,
    _typed,
    decode_batch,
    decode_batch_reference,
)
from tools.bench import vllm_schema as vs
from tools.bench.bridge import make_batches

_junk = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.binary(max_size=3),
                  st.floats(allow_nan=False), st.lists(st.integers(0, 3), max_size=2))
_uint = st.integers(0, 2**64 - 1)
_hash = st.one_of(_uint, st.integers(-(2**63), -1), st.binary(min_size=0, max_size=33))
_hashes = st.one_of(st.lists(_uint, max_size=6), st.lists(_hash, max_size=6), _junk)
_tokens = st.one_of(st.lists(st.integers(0, 2**32 - 1), max_size=40),
                    st.lists(st.one_of(st.integers(-3, 2**33), st.text(max_size=1)),
                             max_size=20), _junk)  # fmt: skip
_str = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "STORAGE", "LOCAL", "REMOTE", "x"]),
                 _junk)  # fmt: skip
_int = st.one_of(st.none(), st.integers(-2, 70), _junk)
_extra = st.one_of(st.none(), _junk, st.lists(st.one_of(st.none(), st.lists(st.one_of(
    st.text(max_size=4), st.fixed_dictionaries({"type": st.sampled_from(["lora", "cache_salt",
                                                                          "mm"]),
                                                "name": st.text(max_size=3)}),
    st.integers(0, 9)), max_size=3)), max_size=3))  # fmt: skip
_FIELD: dict[str, Any] = {
    "block_hashes": _hashes, "parent_block_hash": st.one_of(st.none(), _hash, _junk),
    "token_ids": _tokens, "block_size": st.one_of(st.integers(-1, 64), _junk),
    "lora_id": _int, "medium": _str, "lora_name": _str, "extra_keys": _extra,
    "group_idx": _int, "kv_cache_spec_kind": _junk, "kv_cache_spec_sliding_window": _junk,
    "locality": _str, "ownership": _str, "session_id": _str,
    "lookahead_token_ids": st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=3), _junk),
}  # fmt: skip

_name = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "STORAGE", "LOCAL", "REMOTE"]))
_FIELD_OK: dict[str, Any] = {  # well-typed values (the typed path's)
    "block_hashes": st.lists(_hash, max_size=6), "parent_block_hash": st.one_of(st.none(), _hash),
    "token_ids": st.one_of(st.none(), st.lists(st.integers(0, 2**32 - 1), max_size=40)),
    "block_size": st.integers(1, 32), "lora_id": st.one_of(st.none(), st.integers(0, 3)),
    "medium": _name, "lora_name": st.one_of(st.none(), st.text(max_size=3)),
    "extra_keys": _extra, "group_idx": st.one_of(st.none(), st.integers(0, 2)),
    "locality": _name, "ownership": _name, "session_id": _name,
    "lookahead_token_ids": st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=3)),
}  # fmt: skip


def _rarely(draw: st.DrawFn) -> bool:
    """True about one time in 16 (an adversarial choice among mostly valid ones)."""
    return draw(st.sampled_from(range(16))) == 15


@st.composite
def _event(draw: st.DrawFn) -> Any:
    tag = "Other" if _rarely(draw) else draw(st.sampled_from(
        ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]))  # fmt: skip
    order = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, ())
    n = draw(st.integers(0, len(order) + 1)) if _rarely(draw) else len(order)
    values = [draw(_FIELD.get(f, _junk) if _rarely(draw) else _FIELD_OK.get(f, _junk))
              for f in order[:n]]
    if draw(st.booleans()):  # array_like: tag first, fields in order, maybe more
        return [tag, *values, *draw(st.lists(_junk, max_size=1))]
    fields = {f: v for f, v in zip(order, values, strict=False) if draw(st.booleans())}
    return {"type": tag, **fields, **draw(st.dictionaries(st.sampled_from(["zz", "x"]), _junk,
                                                          max_size=1))}  # fmt: skip


@st.composite
def _payload(draw: st.DrawFn) -> bytes:
    mixed = _rarely(draw)
    events = draw(st.lists(_event(), min_size=0 if _rarely(draw) else 1, max_size=6))
    if not mixed:  # one encoding for every event, as engines send
        as_map = draw(st.booleans())
        events = [e for e in events if isinstance(e, dict) == as_map]
    ts = draw(_junk if _rarely(draw) else st.one_of(st.floats(0, 2e9), st.integers(0, 2**40)))
    rank = draw(st.one_of(st.none(), st.integers(-1, 7), _junk))
    if draw(st.booleans()):
        batch: Any = [ts, events, rank][: draw(st.integers(0, 3)) if _rarely(draw) else 3]
    else:
        batch = {"ts": ts, "events": events, "data_parallel_rank": rank}
    if _rarely(draw):
        return msgpack.packb(batch)[:-1]  # truncated
    return msgpack.packb(batch)


def _outcome(decode: Any, payload: bytes) -> EventBatch | str:
    try:
        return decode(payload)  # type: ignore[no-any-return]
    except EventDecodeError as exc:
        return f"error: {exc}"


@settings(max_examples=1500, deadline=None)
@given(payload=_payload())
def test_typed_decodes_as_the_reference(payload: bytes) -> None:
    assert _outcome(decode_batch, payload) == _outcome(decode_batch_reference, payload)


@settings(max_examples=300, deadline=None)
@given(hashes=st.lists(st.one_of(_uint, st.integers(-(2**63), -1)), max_size=8),
       parent=st.one_of(st.none(), _uint, st.binary(min_size=1, max_size=32)),
       tokens=st.lists(st.integers(0, 2**32 - 1), max_size=48),
       rank=st.one_of(st.none(), st.integers(0, 3)))  # fmt: skip
def test_vllms_current_schema_takes_the_typed_path(
    hashes: list[int], parent: int | bytes | None, tokens: list[int], rank: int | None
) -> None:
    events = [vs.block_stored(hashes, parent, tokens, group_idx=0, lookahead_token_ids=[1]),
              vs.block_removed(hashes), vs.AllBlocksCleared()]  # fmt: skip
    payload = vs.encode_events(events, rank=rank)
    assert _typed(payload) is not None
    assert decode_batch(payload) == decode_batch_reference(payload)


@pytest.mark.parametrize("encoding", ["array", "map", "current"])
def test_the_bench_batches_take_the_typed_path(encoding: str) -> None:
    payloads, _ = make_batches(20, 8, 4, 5, seed=3, encoding=encoding)
    for p in payloads:
        assert _typed(p) is not None and _typed(p) == decode_batch_reference(p)


def test_what_the_typed_path_leaves_to_the_reference() -> None:
    unknown = msgpack.packb([1.0, [["Unknown", 1]], 0])
    mixed = msgpack.packb([1.0, [["AllBlocksCleared"], {"type": "AllBlocksCleared"}]])
    empty_hash = msgpack.packb([1.0, [["BlockRemoved", [b""], None]]])
    for p in (unknown, mixed, empty_hash, b"", b"\xc1"):
        assert _typed(p) is None
    assert decode_batch(unknown).events[0].tag == "Unknown"  # type: ignore[union-attr]
    assert len(decode_batch(mixed).events) == 2
    with pytest.raises(EventDecodeError, match=r"events\[0\].block_hashes\[0\]: empty bytes"):
        decode_batch(empty_hash)
