"""A log entry's bytes: round trips of every write form (hypothesis) and clear errors
for bad entries, the same as the request validation gives."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.cluster.entry import ENTRY_VERSION, SplitHead, Write, decode, encode, encode_split
from sarpd.errors import BadRequest, TooLarge
from sarpd.model import Clear, IdArray, Insert, Match, Remove, SeqSpec
from sarpd.protocol.requests import BadMessage, Limits, parse_message

LIMITS = Limits(max_sequence_tokens=4096)
U64 = st.integers(0, 2**64 - 1)
NS = st.text(max_size=8)


def _ids(n_min: int = 0, n_max: int = 6) -> st.SearchStrategy[IdArray]:
    return st.lists(st.tuples(U64, U64), min_size=n_min, max_size=n_max).map(
        lambda rows: np.array(rows, dtype=np.uint64).reshape(-1, 2))


def _seq() -> st.SearchStrategy[SeqSpec]:
    tokens = st.lists(st.integers(0, 2**32 - 1), max_size=70).map(
        lambda t: np.array(t, dtype=np.uint32))
    return st.one_of(
        st.builds(lambda ns, t: SeqSpec(ns=ns, tokens=t), NS, tokens),
        st.builds(lambda ns, h: SeqSpec(ns=ns, hashes=h), NS, _ids()),
    )


def _blocks(seq: SeqSpec) -> int:
    if seq.tokens is not None:
        return len(seq.tokens) // LIMITS.block_tokens
    assert seq.hashes is not None
    return len(seq.hashes)


@st.composite
def inserts(draw: st.DrawFn) -> Insert:
    seq = draw(_seq())
    n = _blocks(seq)
    meta = draw(st.one_of(U64, st.lists(U64, min_size=n, max_size=n).map(
        lambda m: np.array(m, dtype=np.uint64))))
    parent = draw(st.one_of(st.none(), _ids(1, 1)))
    route = None if parent is not None else draw(st.none() | st.integers(0, 4096))
    return Insert(0, seq=seq, meta=meta, parent=parent, add_holder=draw(st.booleans()),
                  route=route)


removes = st.one_of(
    st.builds(lambda seq, start, m, r: Remove(0, seq=seq, start=start, ns=seq.ns, meta=m,
                                              route=r),
              _seq(), st.integers(0, 2**64 - 1), st.none() | U64, st.none() | st.integers(0, 9)),
    st.builds(lambda ns, ids, m: Remove(0, ns=ns, ids=ids, meta=m), NS, _ids(), st.none() | U64),
)
clears = st.builds(lambda ns, mask, bits: Clear(0, ns=ns, mask=mask, value=mask & bits),
                   NS, U64, U64)


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all()))
    if isinstance(a, SeqSpec) and isinstance(b, SeqSpec):
        return all(_same(getattr(a, f), getattr(b, f)) for f in ("ns", "tokens", "hashes"))
    return type(a) is type(b) and a == b


def _assert_same(a: Write, b: Write) -> None:
    assert type(a) is type(b)
    for name in a.__slots__:
        assert _same(getattr(a, name), getattr(b, name)), name


@settings(max_examples=300, deadline=None)
@given(st.one_of(inserts(), removes, clears))
def test_every_write_round_trips(req: Write) -> None:
    raw = encode(req, LIMITS)
    _assert_same(decode(raw, LIMITS), req)
    assert encode(decode(raw, LIMITS), LIMITS) == raw  # one canonical form


def test_the_layout_is_the_documented_map() -> None:
    req = Insert(7, seq=SeqSpec(ns="n", tokens=np.arange(16, dtype=np.uint32)), meta=3,
                 add_holder=True)
    obj = msgpack.unpackb(encode(req, LIMITS))
    assert obj == {"v": ENTRY_VERSION, "p": 2, "op": "insert", "ns": "n",
                   "tokens": np.arange(16, dtype="<u4").tobytes(), "meta": 3}


def _raw(**fields: Any) -> bytes:
    out: bytes = msgpack.packb({"v": ENTRY_VERSION, "p": 1, **fields})
    return out


@pytest.mark.parametrize(("raw", "error", "message"), [
    (b"\xc1", BadRequest, "entry: not one msgpack value"),
    (msgpack.packb([1, 2]), BadRequest, "entry: expected a map with str keys"),
    (msgpack.packb({1: 2}), BadRequest, "entry: not one msgpack value .*map key"),
    (msgpack.packb({b"v": 1}), BadRequest, "entry: expected a map with str keys"),
    (_raw(op="clear", ns="a") + b"\x00", BadRequest, "entry: not one msgpack value"),
    (msgpack.packb({"v": 2, "p": 1, "op": "clear", "ns": "a"}), BadRequest,
     r"entry v: 2 is not a known entry version \(1\)"),
    (msgpack.packb({"p": 1, "op": "clear", "ns": "a"}), BadRequest, "entry v: None"),
    (msgpack.packb({"v": 1, "p": 3, "op": "clear", "ns": "a"}), BadRequest,
     r"entry p: 3 is not a protocol version \(1\.\.2\)"),
    (_raw(op="match", tokens=[1] * 16), BadRequest,
     r"entry op: 'match' is not a write \(insert, remove, clear\)"),
    (_raw(op="insert", tokens=b"\x00" * 6, meta=1), BadRequest,
     "tokens: bin of 6 bytes is not a multiple of 4"),
    (_raw(op="insert", tokens=b"\x00" * 64, meta=[1, 2]), BadRequest,
     "meta: 2 values for 1 blocks"),
    (_raw(op="insert", tokens=b"\x00" * 4 * 4097, meta=1), TooLarge, "max_sequence_tokens"),
    (_raw(op="clear", ns="a", mask=1, value=2), BadRequest, "value: 0x2 has bits outside mask"),
    (_raw(op="remove", ns="a", ids=b"\x00" * 16, tokens=[1]), BadRequest,
     "give either tokens/hashes"),
    (_raw(op="clear", ns="x" * 1025), BadRequest, r"ns: 1025 bytes exceeds max_ns_bytes \(1024\)"),
    (_raw(op="clear", ns="a", x=[[[[[[[[[[1]]]]]]]]]]), TooLarge,
     r"nesting depth over 8 exceeds max_depth \(8\)"),
])
def test_bad_entries_are_refused_naming_the_field(raw: bytes, error: type[Exception],
                                                  message: str) -> None:
    with pytest.raises(error, match=message):
        decode(raw, LIMITS)


def test_a_bad_field_gets_the_request_validations_own_error() -> None:
    fields = {"op": "remove", "ns": "a", "ids": b"\x00" * 15}
    expected = parse_message({"id": 0, **fields}, LIMITS)
    assert isinstance(expected, BadMessage)
    with pytest.raises(BadRequest) as got:
        decode(_raw(**fields), LIMITS)
    assert got.value.message == expected.error.message


def test_an_entry_over_the_frame_limit_is_too_large() -> None:
    small = Limits(max_frame_size=64)
    with pytest.raises(TooLarge, match=r"entry: \d+ bytes exceeds max_frame_size \(64\)"):
        decode(_raw(op="clear", ns="a" * 80), small)


def test_encode_refuses_what_the_replicas_would_refuse() -> None:
    with pytest.raises(BadRequest, match="ns: 2000 bytes exceeds max_ns_bytes"):
        encode(Clear(0, ns="x" * 2000), LIMITS)
    with pytest.raises(BadRequest, match="value: 0x4 has bits outside mask 0x1"):
        encode(Clear(0, ns="a", mask=1, value=4), LIMITS)
    with pytest.raises(BadRequest, match="entry op: Match is not a write"):
        encode(Match(0, seq=SeqSpec(ns="")), LIMITS)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="entry remove: needs seq or ids"):
        encode(Remove(0, ns="a"), LIMITS)


@settings(max_examples=100, deadline=None)
@given(ns=NS, ids=_ids(1, 40))
def test_a_split_entry_round_trips(ns: str, ids: IdArray) -> None:
    got = decode(encode_split(ns, ids), LIMITS)
    assert isinstance(got, SplitHead) and got.ns == ns
    assert got.ids.dtype == np.uint64 and (got.ids == ids).all()


@pytest.mark.parametrize(("fields", "message"), [
    ({"ns": 7, "hashes": b"\0" * 16}, "entry split ns: '7' is not a str"),
    ({"ns": "", "hashes": b"\0" * 15}, "entry split hashes: not a bin of 1..4096 16-byte ids"),
    ({"ns": "", "hashes": b""}, "entry split hashes: not a bin of 1..4096 16-byte ids"),
    ({"ns": "", "hashes": [1, 2]}, "entry split hashes: not a bin of 1..4096 16-byte ids"),
])
def test_bad_split_entries_are_refused_naming_the_field(fields: dict[str, Any],
                                                         message: str) -> None:
    raw = msgpack.packb({"v": ENTRY_VERSION, "p": 1, "op": "split", **fields})
    with pytest.raises(BadRequest) as err:
        decode(raw, LIMITS)
    assert str(err.value) == message
    with pytest.raises(BadRequest, match=r"outside 1\.\.4096"):
        encode_split("", np.zeros((0, 2), dtype=np.uint64))
