"""The one decoder (sarpd.events.schema, msgspec) against the oracle
(tests/events/schema_oracle.py, msgpack + Python): the same records, or both reject,
on random and adversarial payloads (array or map at every level and mixed, short
arrays, missing and unknown fields, unknown events, int / negative / bytes / empty
hashes, wrong types anywhere, tokens that are not ints, typed and raw extra keys,
lookahead tokens, ranks of any type, maps keyed by non-strings, SGLang's salts), with
and without token ids kept."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.events.schema import _WHOLE, EventBatch, EventDecodeError, decode_batch
from tests.events.schema_oracle import REMOVED_FIELDS, STORED_FIELDS, decode_batch_reference
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
# SGLang's salt: a map in lora_name's array slot (BlockStoredWithMetadata), or by name
_salt = st.one_of(st.none(), st.text(max_size=3), _junk)
_metadata = st.one_of(st.fixed_dictionaries({"cache_salt": _salt}),
                      st.dictionaries(st.sampled_from(["cache_salt", "x"]), _salt, max_size=2))
_FIELD: dict[str, Any] = {
    "block_hashes": _hashes, "parent_block_hash": st.one_of(st.none(), _hash, _junk),
    "token_ids": _tokens, "block_size": st.one_of(st.integers(-1, 64), _junk),
    "lora_id": _int, "medium": _str, "lora_name": st.one_of(_str, _metadata),
    "extra_keys": _extra, "group_idx": _int, "kv_cache_spec_kind": _junk,
    "kv_cache_spec_sliding_window": _junk, "locality": _str, "ownership": _str,
    "session_id": _str,
    "lookahead_token_ids": st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=3), _junk),
}  # fmt: skip

_name = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "STORAGE", "LOCAL", "REMOTE",
                                              "CPU_PINNED", "DISK", "EXTERNAL"]))
_FIELD_OK: dict[str, Any] = {  # well-typed values (the whole-batch path's)
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


def _odd_keys(draw: st.DrawFn) -> dict[Any, Any]:
    """Now and then, keys that are not strings (msgpack allows them; nothing reads them)."""
    if not _rarely(draw):
        return {}
    return draw(st.dictionaries(st.one_of(st.integers(-2, 2), st.binary(max_size=2)), _junk,
                                max_size=2))  # fmt: skip


@st.composite
def _event(draw: st.DrawFn) -> Any:
    tag = "Other" if _rarely(draw) else draw(st.sampled_from(
        ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]))  # fmt: skip
    order = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, ())
    n = draw(st.integers(0, len(order) + 1)) if _rarely(draw) else len(order)
    values = [draw(_FIELD.get(f, _junk) if _rarely(draw) else _FIELD_OK.get(f, _junk))
              for f in order[:n]]
    if draw(st.booleans()):  # array_like: tag first, fields in order, maybe more
        if tag == "BlockStored" and len(values) > 6 and draw(st.booleans()):
            values[6] = draw(_metadata)  # SGLang's BlockStoredWithMetadata
        return [tag, *values, *draw(st.lists(_junk, max_size=1))]
    fields = {f: v for f, v in zip(order, values, strict=False) if draw(st.booleans())}
    if tag == "BlockStored" and draw(st.booleans()):
        fields["cache_salt"] = draw(_salt if _rarely(draw) else st.text(max_size=3))
    return {"type": tag, **fields, **draw(st.dictionaries(st.sampled_from(["zz", "x"]), _junk,
                                                          max_size=1)), **_odd_keys(draw)}


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
        batch = {"ts": ts, "events": events, "data_parallel_rank": rank, **_odd_keys(draw)}
    if _rarely(draw):
        return msgpack.packb(batch)[:-1]  # truncated
    return msgpack.packb(batch)


def _outcome(decode: Any, payload: bytes, tokens: bool) -> EventBatch | str:
    try:
        return decode(payload, tokens=tokens)  # type: ignore[no-any-return]
    except EventDecodeError:
        return "rejected"


@settings(max_examples=1500, deadline=None)
@given(payload=_payload(), tokens=st.booleans())
def test_the_decoder_decodes_as_the_oracle(payload: bytes, tokens: bool) -> None:
    assert _outcome(decode_batch, payload, tokens) == _outcome(decode_batch_reference, payload,
                                                               tokens)  # fmt: skip


def _whole_batch(payload: bytes) -> bool:
    """Today's vLLM shape (an array batch of map events) decodes in one msgspec call."""
    try:
        _WHOLE[True][0].decode(payload)
    except msgspec.DecodeError:  # a ValidationError too
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(hashes=st.lists(st.one_of(_uint, st.integers(-(2**63), -1)), max_size=8),
       parent=st.one_of(st.none(), _uint, st.binary(min_size=1, max_size=32)),
       tokens=st.lists(st.integers(0, 2**32 - 1), max_size=48),
       rank=st.one_of(st.none(), st.integers(0, 3)))  # fmt: skip
def test_vllms_current_schema_decodes_whole(
    hashes: list[int], parent: int | bytes | None, tokens: list[int], rank: int | None
) -> None:
    events = [vs.block_stored(hashes, parent, tokens, group_idx=0, lookahead_token_ids=[1]),
              vs.block_removed(hashes), vs.AllBlocksCleared()]  # fmt: skip
    payload = vs.encode_events(events, rank=rank)
    assert _whole_batch(payload)
    for keep in (False, True):
        assert decode_batch(payload, tokens=keep) == decode_batch_reference(payload, tokens=keep)


@pytest.mark.parametrize("encoding", ["array", "map", "current"])
def test_the_bench_batches_decode_as_the_oracle(encoding: str) -> None:
    payloads, _ = make_batches(20, 8, 4, 5, seed=3, encoding=encoding)
    for p in payloads:
        assert decode_batch(p) == decode_batch_reference(p)
    if encoding == "current":
        assert all(_whole_batch(p) for p in payloads)


def test_what_the_whole_batch_shapes_leave_to_the_events() -> None:
    """The shapes that once went to the reference: decoded event by event now."""
    unknown = msgpack.packb([1.0, [["Unknown", 1]], 0])
    mixed = msgpack.packb([1.0, [["AllBlocksCleared"], {"type": "AllBlocksCleared"}]])
    int_keys = msgpack.packb({"ts": 1, 7: 0, "events": [{"type": "AllBlocksCleared", 1: 2}]})
    for p in (unknown, mixed, int_keys):
        assert not _whole_batch(p)
        assert decode_batch(p) == decode_batch_reference(p)
    assert decode_batch(unknown).events[0].tag == "Unknown"  # type: ignore[union-attr]
    assert len(decode_batch(mixed).events) == 2


@pytest.mark.parametrize(("payload", "path"), [
    (msgpack.packb([1.0, [["BlockRemoved", [b""], None]]]),
     r"an empty bytes hash - at `\$\.events\[0\]\.block_hashes\[0\]`"),
    (msgpack.packb([1.0, [["BlockRemoved", [1, b""], None]]]), r"block_hashes\[1\]`"),
    (msgpack.packb([1.0, [["BlockStored", [1], b"", [], 16]]]),
     r"an empty bytes hash - at `\$\.events\[0\]\.parent_block_hash`"),
    (msgpack.packb([1.0, [["BlockStored", [1], None, [], None]]]),
     r"`int` > 0, got None - at `\$\.events\[0\]\.block_size`"),
    (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "block_size": -3}]]),
     r"`int` > 0, got -3 - at `\$\.events\[0\]\.block_size`"),
    (msgpack.packb([1.0, [["AllBlocksCleared"], ["BlockStored", [1], None, [], 16, "x"]]]),
     r"Expected `int \| null`, got `str` - at `\$\.events\[1\]\.lora_id`"),
    (msgpack.packb({"events": []}), r"at `\$\.ts`"),
    (msgpack.packb([1.0]), r"at `\$\.events`"),
    (msgpack.packb([1.0, None]), r"at `\$\.events`"),
    (msgpack.packb({"ts": "x", "events": []}), r"got `str` - at `\$\.ts`"),
    (msgpack.packb(["x", []]), r"got `str` - at `\$\.ts`"),
    (msgpack.packb({1: 2, "ts": 1.0, "events": [[3]]}),
     r"expected a tagged array or a map with `type` - at `\$\.events\[0\]`"),
    (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "block_size": 16,
                            "cache_salt": 5}]]), r"got `int` - at `\$\.events\[0\]\.cache_salt`"),
    (msgpack.packb([1.0, [["BlockStored", [1], None, [], 16, None, None, {"cache_salt": 5}]]]),
     r"at `\$\.events\[0\]\.lora_name\.cache_salt`"),
])  # fmt: skip
def test_errors_name_the_field(payload: bytes, path: str) -> None:
    """Every shape the whole-batch decoding declined, and each check after it: the
    message has the path of the field (msgspec's, re-rooted, array slots named)."""
    with pytest.raises(EventDecodeError, match=path):
        decode_batch(payload)
    with pytest.raises(EventDecodeError):
        decode_batch_reference(payload)
