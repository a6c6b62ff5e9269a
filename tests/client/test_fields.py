"""The client's request fields (sarpd.client.fields) checked by the server's Decoder,
and every bad value named cleanly (property-tested)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.client.fields import (
    decode_match,
    ids_field,
    meta_field,
    one_id_field,
    seq_fields,
    tokens_bin,
    uint_arg,
)
from sarpd.errors import BadRequest
from sarpd.model import Insert, Match, MatchResult, Remove, Request, ids_from_bytes
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    encode_request,
    encode_result,
)
from tests.protocol.helpers import SAFE_TEXT, assert_clean

ID_A = bytes(range(16))
ID_B = bytes(range(100, 116))

ID_B = bytes(range(100, 116))

# --------------------------------------------------------------- encoding vs Decoder


def decoded(op: str, fields: dict[str, Any]) -> Request | BadMessage:
    (req,) = Decoder().feed(encode_request(1, op, fields))
    return req


def test_tokens_are_sent_as_uint32_bin_in_every_input_form() -> None:
    values = [0, 5, 2**32 - 1, 17] * 8
    forms: list[Any] = [
        values,
        tuple(values),
        np.array(values, dtype=np.uint32),
        np.array(values, dtype=np.int64),
        np.array(values, dtype=np.uint64),
        np.array(values, dtype="<u4").tobytes(),
    ]
    for form in forms:
        raw = tokens_bin(form)
        assert raw == np.array(values, dtype="<u4").tobytes()
        req = decoded("match", seq_fields(form, None, "n"))
        assert isinstance(req, Match) and req.seq.tokens is not None
        assert req.seq.tokens.tolist() == values and req.seq.ns == "n"
    assert tokens_bin([]) == b""


@pytest.mark.parametrize(("tokens", "text"), [
    ([1, -1], "tokens[1]: -1 is not a uint32"),
    ([2**32], "tokens[0]: 4294967296 is not a uint32"),
    ([1.5], "tokens[0]: 1.5 is not a uint32"),
    ([[1]], "tokens[0]: [1] is not a uint32"),
    ([1, 2, 99999999999999999999999], "tokens[2]: 99999999999999999999999 is not a uint32"),
    (["a", "b"], "tokens[0]: 'a' is not a uint32"),
    (np.array(["a", "b"]), "tokens[0]: 'a' is not a uint32"),
    (np.array([1, 99999999999999999999999], dtype=object), "tokens[1]: 9999999"),
    (np.array([0.5]), "tokens[0]: 0.5 is not a uint32"),
    (np.array([3, -2]), "tokens[1]: -2 is not a uint32"),
    (np.zeros((2, 2), dtype=np.uint32), "tokens: an array of 2 dimensions is not"),
    ("abc", "tokens: 'abc' is not an array of uint32"),
    (7, "tokens: 7 is not an array of uint32"),
    (b"abc", "tokens: bin of 3 bytes is not a multiple of 4"),
])
def test_bad_tokens_fail_in_the_client(tokens: Any, text: str) -> None:
    with pytest.raises(BadRequest) as info:
        tokens_bin(tokens)
    assert text in info.value.message


def test_ids_in_every_input_form() -> None:
    expect = ids_from_bytes(ID_A + ID_B)
    forms: list[Any] = [ID_A + ID_B, bytearray(ID_A + ID_B), expect, [ID_A, ID_B]]
    for form in forms:
        req = decoded("match", seq_fields(None, form, ""))
        assert isinstance(req, Match) and req.seq.hashes is not None
        assert (req.seq.hashes == expect).all()
    engine = np.array([3, 2**64 - 1], dtype=np.uint64)
    assert ids_field(engine, "hashes") == [3, 2**64 - 1]
    req = decoded("remove", {"ns": "e", "ids": ids_field(engine, "ids")})
    assert isinstance(req, Remove) and req.ids is not None
    assert req.ids.tolist() == [[3, 0], [2**64 - 1, 0]]
    with pytest.raises(BadRequest, match="hashes"):
        ids_field(np.zeros((2, 3), dtype=np.uint64), "hashes")


def test_insert_fields_meta_and_parent() -> None:
    tokens = list(range(48))
    for meta in (7, [1, 2, 3], np.array([1, 2, 3], dtype=np.uint64), np.arange(1, 4)):
        fields = {**seq_fields(tokens, None, ""), "meta": meta_field(meta)}
        req = decoded("insert", fields)
        assert isinstance(req, Insert)
        got = req.meta if isinstance(req.meta, int) else req.meta.tolist()
        assert got in (7, [1, 2, 3])
    for parent in (ID_A, ids_from_bytes(ID_A), ids_from_bytes(ID_A)[0], 99):
        fields = {"hashes": [5], "meta": 0, "parent": one_id_field(parent, "parent")}
        req = decoded("insert", fields)
        assert isinstance(req, Insert) and req.parent is not None
        want = [[99, 0]] if isinstance(parent, int) else ids_from_bytes(ID_A).tolist()
        assert req.parent.tolist() == want
    with pytest.raises(BadRequest, match="parent"):
        one_id_field(ids_from_bytes(ID_A + ID_B), "parent")


def test_decode_match() -> None:
    meta = np.array([1, 2**64 - 1], dtype=np.uint64)
    raw = encode_result(3, MatchResult(blocks=2, meta=meta, ids=ids_from_bytes(ID_A + ID_B)))
    got = decode_match(msgpack.unpackb(raw, raw=False))
    assert got["meta"] == [1, 2**64 - 1] and got["ids"] == [ID_A, ID_B]
    assert got["blocks"] == 2 and got["tokens"] == 32


# ------------------------------------------- property: every bad value is named cleanly

BIG = st.integers(min_value=2**64, max_value=2**300)
NEG = st.integers(min_value=-(2**300), max_value=-1)
NOT_INT = st.one_of(
    st.floats(), st.text(SAFE_TEXT, max_size=30), st.booleans(), st.none(),
    st.binary(max_size=40), st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(0, 9), max_size=2),
    st.tuples(st.floats(), st.none()),
)


def bad_uint(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(min_value=limit, max_value=2**300), NEG, NOT_INT)


def as_form(items: list[Any], form: str) -> Any:
    if form == "tuple":
        return tuple(items)
    if form == "array":
        arr = np.empty(len(items), dtype=object)
        for i, v in enumerate(items):
            arr[i] = v
        return arr
    return items


def expect_bad(fn: Callable[[], object], field: str) -> str:
    with pytest.raises(BadRequest) as info:
        fn()
    assert_clean(info.value.message, field)
    return info.value.message


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=6), bad_uint(2**32),
       st.sampled_from(["list", "tuple", "array"]))
def test_a_bad_token_is_named_with_its_index(good: list[int], bad: Any, form: str) -> None:
    message = expect_bad(lambda: tokens_bin(as_form([*good, bad], form)), "tokens")
    assert message.startswith(f"tokens[{len(good)}]: ")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.integers(), st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                 st.none(), st.binary(max_size=40).filter(lambda b: len(b) % 4 != 0),
                 st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(), max_size=2),
                 st.frozensets(st.integers(0, 9), max_size=2)))
def test_bad_tokens_values_are_named(value: Any) -> None:
    expect_bad(lambda: tokens_bin(value), "tokens")


BAD_ID = st.one_of(BIG, NEG, st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                   st.none(), st.binary(max_size=40).filter(lambda b: len(b) != 16),
                   st.lists(st.integers(0, 9), max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**64 - 1), st.binary(min_size=16, max_size=16)),
                max_size=5), BAD_ID, st.sampled_from(["hashes", "ids"]),
       st.sampled_from(["list", "tuple", "array"]))
def test_a_bad_id_is_named_with_its_index(good: list[Any], bad: Any, name: str,
                                          form: str) -> None:
    message = expect_bad(lambda: ids_field(as_form([*good, bad], form), name), name)
    assert message.startswith(f"{name}[{len(good)}]: ")


@settings(max_examples=150, deadline=None)
@given(BAD_ID.filter(lambda v: not isinstance(v, list)))
def test_a_bad_parent_is_named(value: Any) -> None:
    expect_bad(lambda: one_id_field(value, "parent"), "parent")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=5), bad_uint(2**64),
       st.sampled_from(["list", "tuple", "array"]),
       st.one_of(BIG, NEG, st.floats(), st.text(SAFE_TEXT, max_size=20), st.booleans(),
                 st.none(), st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(),
                                            max_size=2)))
def test_bad_meta_is_named(good: list[int], bad: Any, form: str, scalar: Any) -> None:
    message = expect_bad(lambda: meta_field(as_form([*good, bad], form)), "meta")
    assert message.startswith(f"meta[{len(good)}]: ")
    expect_bad(lambda: meta_field(scalar), "meta")


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["from", "holders", "mask", "value", "protocol", "meta"]),
       bad_uint(2**64))
def test_bad_uint_arguments_are_named(name: str, value: Any) -> None:
    expect_bad(lambda: uint_arg(name, value), name)


@settings(max_examples=100, deadline=None)
@given(st.text(SAFE_TEXT, min_size=1, max_size=8),
       st.one_of(BIG, st.integers(max_value=-(2**63) - 1)), st.integers(0, 3))
def test_an_int_no_field_can_carry_is_named_by_its_path(field: str, big: int, depth: int) -> None:
    nested: Any = big
    suffix = ""
    for i in range(depth):  # the outermost container's accessor comes first in the path
        if i % 2:
            nested, suffix = [0, nested], f"[1]{suffix}"
        else:
            nested, suffix = {"k": nested}, f".k{suffix}"
    message = expect_bad(lambda: encode_request(1, "match", {field: nested}), field)
    assert message.startswith(f"{field}{suffix}: ") and "is out of range" in message

