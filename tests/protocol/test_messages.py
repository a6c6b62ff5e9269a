"""Every bad-input message of the server's validation, over random bad values of every
field of every op (raw msgpack, through the decoder and the test oracle: both give the
same answer), names the field and leaks no numpy, msgpack or Python
internals (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.errors import SarpError
from sarpd.model import Request
from sarpd.protocol.requests import parse_report
from sarpd.protocol.wire import BadMessage, Decoder, Limits
from tests.protocol import oracle
from tests.protocol.helpers import ID_A, SAFE_TEXT, assert_clean, pack

TOK32 = list(range(32))
U64_MAX = 2**64 - 1

# a valid request of each op, and the fields a bad value may go into
BASES: dict[str, dict[str, Any]] = {
    "match": {"op": "match", "tokens": TOK32, "ns": "n"},
    "match_h": {"op": "match", "hashes": [1, 2], "ns": "n"},
    "insert": {"op": "insert", "tokens": TOK32, "meta": 1, "ns": "n"},
    "insert_h": {"op": "insert", "hashes": [1, ID_A], "meta": [1, 2], "parent": 5},
    "remove": {"op": "remove", "tokens": TOK32, "from": 1, "meta": 3},
    "remove_ids": {"op": "remove", "ns": "n", "ids": [1, ID_A], "meta": 3},
    "clear": {"op": "clear", "ns": "n", "mask": 0xFF, "value": 1},
    "check": {"op": "check", "fix": False},
    "hello": {"op": "hello", "protocol": 2},
    "dump": {"op": "dump", "tokens": TOK32},
    "report": {"op": "report", "source": "bridge", "counters": {"events": 3}},
}
FIELDS: list[tuple[str, str]] = [
    ("match", "tokens"), ("match", "ns"), ("match", "with_ids"), ("match", "holders"),
    ("match", "spans"),
    ("match", "after_seq"), ("match", "after_seq_wait_ms"), ("match", "parent"),
    ("match_h", "hashes"), ("insert", "tokens"), ("insert", "meta"), ("insert", "parent"),
    ("insert", "ns"), ("insert_h", "hashes"), ("insert_h", "meta"), ("insert_h", "parent"),
    ("remove", "tokens"), ("remove", "from"), ("remove", "meta"), ("remove_ids", "ids"),
    ("remove_ids", "meta"), ("remove_ids", "ns"), ("clear", "ns"), ("clear", "mask"),
    ("clear", "value"), ("check", "fix"), ("hello", "protocol"), ("dump", "tokens"),
    ("dump", "hashes"), ("report", "source"), ("report", "counters"), ("match", "id"),
    ("match", "op"),
]

# what msgpack can carry: ints within -2**63..2**64-1, and every other kind
WIRE_INT = st.integers(min_value=-(2**63), max_value=U64_MAX)
LEAF = st.one_of(WIRE_INT, st.floats(), st.text(SAFE_TEXT, max_size=30), st.booleans(),
                 st.none(), st.binary(max_size=40))
VALUE = st.one_of(
    LEAF,
    st.lists(LEAF, max_size=6),
    st.lists(st.lists(WIRE_INT, max_size=3), max_size=3),
    st.dictionaries(st.text(SAFE_TEXT, max_size=5), LEAF, max_size=3),
    st.tuples(st.lists(st.integers(0, 2**32 - 1), max_size=20), LEAF).map(
        lambda t: [*t[0], t[1]]),  # a valid prefix, then one odd item
)


def decode_both(msg: dict[str, Any]) -> Request | BadMessage:
    """The request of `msg` by the decoder and by the test oracle (they must agree)."""
    frame = pack(msg)
    (fast,) = Decoder().feed(frame)
    full = oracle.decode_frame(frame, Limits())
    if isinstance(full, BadMessage):
        assert isinstance(fast, BadMessage) and fast.error.message == full.error.message
    else:
        assert not isinstance(fast, BadMessage), fast
    return full


ACROSS = {  # a bad value here may break a rule of these (e.g. meta: one per block)
    "tokens": ("meta: ", "tokens, hashes", "remove: "),
    "hashes": ("meta: ", "tokens, hashes", "remove: "),
    "ids": ("remove: ",),
}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELDS), VALUE)
def test_any_bad_value_of_any_field_is_named_cleanly(where: tuple[str, str], value: Any,
                                                    ) -> None:
    base, field = where
    msg = {"id": 9, **BASES[base], field: value}
    got = decode_both(msg)
    if not isinstance(got, BadMessage):
        return  # a value that happens to be valid (or nil: absent)
    message = got.error.message
    # rules across fields name the fields they tie together
    named = (field, *ACROSS.get(field, ()))
    assert any(n in message for n in named), (field, value, message)
    assert_clean(message, message.split(":")[0].split("[")[0].split(".")[0])
    assert got.error.code in ("bad_request", "too_large", "unknown_op"), got.error


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["tokens", "hashes", "ids", "meta"]),
       st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=4),
       st.one_of(st.integers(min_value=-(2**63), max_value=-1),
                 st.integers(min_value=2**32, max_value=U64_MAX), st.floats(),
                 st.text(SAFE_TEXT, max_size=10), st.booleans(), st.none(),
                 st.binary(max_size=15), st.lists(WIRE_INT, max_size=2)))
def test_a_bad_item_is_named_with_its_index(field: str, good: list[int], bad: Any) -> None:
    items = [*good, bad]
    if field == "tokens":
        msg = {"op": "match", "tokens": items}
    elif field == "hashes":
        msg = {"op": "match", "hashes": items}
    elif field == "ids":
        msg = {"op": "remove", "ns": "n", "ids": items}
    else:
        msg = {"op": "insert", "hashes": list(range(1, len(items) + 1)), "meta": items}
    got = decode_both({"id": 3, **msg})
    limit = 2**32 if field == "tokens" else 2**64
    if field != "tokens" and (type(bad) is int and 0 <= bad < limit):
        return  # valid after all
    assert isinstance(got, BadMessage), (msg, got)
    assert got.error.message.startswith(f"{field}[{len(good)}]: "), got.error.message
    assert_clean(got.error.message, field)


@pytest.mark.parametrize(("msg", "says"), [
    ({"op": "match", "tokens": [1, 2, 2**64 - 1]},
     "tokens[2]: 18446744073709551615 is not a uint32"),
    ({"op": "match", "tokens": ["a", "b"]}, "tokens[0]: 'a' is not a uint32"),
    ({"op": "match", "tokens": [1, [2]]}, "tokens[1]: [2] is not a uint32"),
    ({"op": "match", "tokens": "x" * 100}, "...xxxxxxxxxxxxxxxxxx' is not an array of uint32"),
    ({"op": "match", "hashes": [1, -(2**63)]}, "hashes[1]: -9223372036854775808 is not a uint64"),
    ({"op": "insert", "tokens": TOK32, "meta": [1, 1.5]}, "meta[1]: 1.5 is not a uint64"),
    ({"op": "insert", "tokens": TOK32, "meta": 0, "parent": b"x" * 8}, "parent: bin of 8 bytes"),
    ({"op": "match", "tokens": [], "holders": -1}, "holders: -1 is not a uint64"),
    ({"op": "hello", "protocol": "2"}, "protocol: '2' is not a uint >= 1"),
    ({"op": "report", "source": 5, "counters": {}}, "source: 5 is not a non-empty str"),
])
def test_the_messages_read_as_the_rule(msg: dict[str, Any], says: str) -> None:
    got = decode_both({"id": 1, **msg})
    assert isinstance(got, BadMessage) and says in got.error.message, got
    assert_clean(got.error.message, says.split(":")[0].split("[")[0])


def test_strings_that_are_not_utf8_are_named() -> None:
    """A str of bytes that are not UTF-8 (the decoder keeps them escaped)."""
    for field, extra in (("ns", {"op": "match", "tokens": []}),
                         ("source", {"op": "report", "counters": {}})):
        raw = bytearray(pack({"id": 1, **extra}))
        raw[0] += 1  # one more pair in the fixmap
        raw += pack(field) + b"\xa2\xff\xfe"  # a 2-byte str: not UTF-8
        (got,) = Decoder().feed(bytes(raw))
        assert isinstance(got, BadMessage), got
        assert f"{field}: " in got.error.message and "not valid UTF-8" in got.error.message
        assert_clean(got.error.message, field)


def test_report_counters_keep_ints() -> None:
    """Counters reported as ints stay ints (`sarpctl stats` prints them without decimals)."""
    rep = parse_report(1, {"source": "b", "counters": {"events": 12, "lag_s": 0.5}})
    assert rep.counters == {"events": 12, "lag_s": 0.5}
    assert type(rep.counters["events"]) is int
    with pytest.raises(SarpError) as info:
        parse_report(1, {"source": "b", "counters": {"x": [1]}})
    assert_clean(info.value.message, "counters.x")
