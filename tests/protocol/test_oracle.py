"""The daemon's one decoding path (`sarpd.protocol.wire.Decoder`) against the test
oracle (tests/protocol/oracle.py: the validation sarpd had before issue 23): on random
valid and invalid requests, streamed in pieces, both give the same requests, the same
errors with the same codes and messages, the same stream errors; and msgspec's typed
read (`requests.read_frame`) does take the common requests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarpd.errors import FrameError
from sarpd.model import Hello
from sarpd.protocol.requests import negotiate, read_frame
from sarpd.protocol.wire import BadMessage, Decoder, Limits
from tests.protocol import oracle
from tests.protocol.helpers import ID_A, ID_B, pack

U64 = 2**64 - 1
LIMITS = [
    Limits(),
    Limits(max_sequence_tokens=128, max_ns_bytes=8, max_match_holders=4),  # max_ids 8
    Limits(max_sequence_tokens=64, max_str_bytes=48, max_map_len=16, max_depth=4),
]


class Raw(bytes):
    """A value already encoded (for what `msgpack.packb` will not write: bad UTF-8)."""


def frame(pairs: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map of `pairs` as given: duplicate and non-str keys allowed."""
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(pack(k) + (v if isinstance(v, Raw) else pack(v)) for k, v in pairs)


def equal(a: object, b: object) -> bool:
    """Requests equal field by field (arrays by dtype, shape and value); errors by
    id, type, code and message."""
    if type(a) is not type(b):
        return False
    if isinstance(a, BadMessage) and isinstance(b, BadMessage):
        return (a.id == b.id and type(a.error) is type(b.error)
                and (a.error.code, a.error.message) == (b.error.code, b.error.message))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    names = [n for cls in type(a).__mro__ for n in getattr(cls, "__slots__", ())]
    if not names:
        return a == b
    return all(equal(getattr(a, n), getattr(b, n)) for n in names)


def by_oracle(raw: bytes, limits: Limits) -> list[Any]:
    """What the oracle gives for the stream `raw`, frame by frame (a stream error ends
    the list with ("stream", code, message))."""
    unpacker, protocol, start = msgpack.Unpacker(max_buffer_size=2**31), 1, 0
    got: list[Any] = []
    unpacker.feed(raw)
    while start < len(raw):
        unpacker.skip()
        end = unpacker.tell()
        try:
            one = oracle.decode_frame(raw[start:end], limits, protocol, end)
        except FrameError as exc:
            return [*got, ("stream", exc.code, exc.message)]
        protocol = negotiate(one.protocol) if isinstance(one, Hello) else protocol
        got.append(one)
        start = end
    return got


def both(raw: bytes, limits: Limits, cuts: Sequence[int] = ()) -> tuple[list[Any], list[Any]]:
    """What the oracle and the daemon's decoder give for the stream `raw` (the decoder
    fed in pieces at `cuts`); a stream error ends each list with ("stream", code,
    message)."""
    dec, got = Decoder(limits), list[Any]()
    bounds = [0, *sorted(c % (len(raw) + 1) for c in cuts), len(raw)]
    try:
        for lo, hi in itertools.pairwise(bounds):
            got += dec.feed(raw[lo:hi])
    except FrameError as exc:
        got += [*getattr(exc, "decoded", []), ("stream", exc.code, exc.message)]
    return by_oracle(raw, limits), got


# ------------------------------------------------------------------ strategies

big = st.integers(2**32, U64)  # msgpack's 0xcf form: the numpy fast read
small = st.integers(0, 2**32 - 1)  # shorter encodings
bad_int = st.sampled_from([-1, -(2**63), 2**32, U64])
id16 = st.sampled_from([ID_A, ID_B]) | st.binary(min_size=16, max_size=16)
junk = st.sampled_from([None, True, False, 1.5, "x", b"", b"abc", [], {}, [[1]], {"a": 1},
                        msgpack.ExtType(1, b"x"), Raw(b"\xa2\xff\xfe")])  # last: bad UTF-8


def id_list(max_size: int) -> st.SearchStrategy[list[Any]]:
    return st.one_of(
        st.lists(big, max_size=max_size),
        st.lists(big | small, max_size=max_size),
        st.lists(big | id16, max_size=max_size),
        st.lists(big | junk | bad_int, max_size=4),
    )


def hashes_value(max_ids: int) -> st.SearchStrategy[Any]:
    n = st.integers(0, max_ids + 2)
    return st.one_of(
        id_list(max_ids + 2),
        n.map(lambda k: b"\x01" * 16 * k),
        st.binary(max_size=40),
        junk,
    )


def tokens_value(max_tokens: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(0, max_tokens // 4 + 2).map(lambda k: b"\x02\x00\x00\x00" * 4 * k),
        st.binary(max_size=70),
        st.lists(small, max_size=40),
        st.lists(small | bad_int | junk, max_size=4),
        junk,
    )


def meta_value() -> st.SearchStrategy[Any]:
    return st.one_of(big, small, bad_int, st.lists(big | small, max_size=10),
                     st.lists(junk | bad_int, max_size=3), st.binary(max_size=24), junk)


FIELDS = ["id", "op", "ns", "hashes", "tokens", "meta", "parent", "with_ids", "holders", "spans",
          "from", "ids", "bogus", 7, "mask", "value", "protocol", "fix", "after_seq", "source",
          "counters", "route"]


@st.composite
def request_pairs(draw: st.DrawFn, limits: Limits) -> list[tuple[Any, Any]]:
    """A map of a request: mostly a well-formed match or insert, each field sometimes
    missing, nil, of the wrong type or out of range, sometimes unknown or repeated."""
    values: dict[Any, st.SearchStrategy[Any]] = {
        "id": st.integers(0, U64) | bad_int | junk,
        "op": st.sampled_from(["match", "insert", "remove", "ping", "hello", "nope", "clear",
                               "check", "dump", "report"]) | junk,
        "ns": st.sampled_from(["", "a", "ns-0", "ü" * 3, "x" * 9, "y" * 2000]) | junk,
        "hashes": hashes_value(limits.max_ids),
        "tokens": tokens_value(limits.max_sequence_tokens),
        "meta": meta_value(),
        "parent": big | small | id16 | bad_int | junk,
        "with_ids": st.booleans() | junk,
        "spans": st.booleans() | junk,
        "holders": st.integers(0, limits.max_match_holders + 1) | bad_int | junk,
        "from": small | junk, "ids": hashes_value(limits.max_ids), "bogus": junk,
        7: junk, "mask": small | bad_int | junk, "value": small | bad_int | junk,
        "protocol": small | bad_int | junk, "fix": st.booleans() | junk,
        "after_seq": st.dictionaries(st.sampled_from(["s0", "", "x" * 70]),
                                     small | bad_int | junk, max_size=3) | junk,
        "source": st.sampled_from(["b", "", "x" * 200]) | junk,
        "route": st.integers(0, 4097) | bad_int | junk,
        "counters": st.dictionaries(st.sampled_from(["a", "B", "lag_s"]),
                                    small | st.floats() | junk, max_size=3) | junk,
    }
    op = draw(st.sampled_from(["match", "insert"]))
    seq = draw(st.sampled_from(["hashes", "tokens"]))
    pairs: list[tuple[Any, Any]] = [("id", draw(st.integers(0, U64))), ("op", op)]
    if seq == "hashes":
        pairs.append(("hashes", draw(id_list(min(limits.max_ids, 64)))))
    else:
        pairs.append(("tokens", draw(st.lists(small, max_size=40))))
    if op == "insert":
        pairs.append(("meta", draw(big | small)))
    for _ in range(draw(st.integers(0, 3))):  # change, drop, add or repeat a field
        key = draw(st.sampled_from(FIELDS))
        action = draw(st.sampled_from(["set", "drop", "nil"]))
        pairs = [p for p in pairs if p[0] != key] if action != "set" or draw(st.booleans()) \
            else pairs
        if action == "set":
            pairs.append((key, draw(values[key])))
        elif action == "nil":
            pairs.append((key, None))
    return draw(st.permutations(pairs))


SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("limits", LIMITS, ids=["default", "small", "tiny-str"])
@SETTINGS
@given(data=st.data())
def test_the_decoder_answers_exactly_as_the_oracle(limits: Limits, data: st.DataObject
                                                      ) -> None:
    msgs = data.draw(st.lists(request_pairs(limits), min_size=1, max_size=4))
    if data.draw(st.booleans()):  # a protocol-2 connection: inserts add a holder
        msgs.insert(0, [("id", 1), ("op", "hello"), ("protocol", 2)])
    raw = b"".join(frame(p) for p in msgs)
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=3))
    full, fast = both(raw, limits, cuts)
    assert len(full) == len(fast)
    for a, b in zip(full, fast, strict=True):
        assert equal(a, b), (a, b)


CHUNKED = Limits(max_sequence_tokens=128, max_ns_bytes=8, max_frame_size=600)


@SETTINGS
@given(data=st.data())
def test_a_stream_decodes_as_its_frames_one_by_one(data: st.DataObject) -> None:
    """The builder gets only the bytes of the messages it builds (fast-path ones it
    never sees): a stream of fast and full-path messages, fed whole (more bytes than
    max_frame_size: several chunks in one feed) or in pieces, decodes as each of its
    frames alone in a fresh decoder."""
    msgs = data.draw(st.lists(request_pairs(CHUNKED), min_size=1, max_size=12))
    frames = [frame(p) for p in msgs]
    frames = [f for f in frames if len(f) <= CHUNKED.max_frame_size]
    want = [Decoder(CHUNKED).feed(f) for f in frames]
    raw = b"".join(frames)
    cuts = data.draw(st.lists(st.integers(0, 10**6), max_size=4))
    got, dec = [], Decoder(CHUNKED)
    for lo, hi in itertools.pairwise([0, *sorted(c % (len(raw) + 1) for c in cuts), len(raw)]):
        got += dec.feed(raw[lo:hi])
    assert dec.buffered == 0
    flat = [r for one in want for r in one]
    assert len(got) == len(flat) == len(frames)
    for a, b in zip(flat, got, strict=True):
        assert equal(a, b), (a, b)


@SETTINGS
@given(value=st.recursive(junk | big | st.text(max_size=5),
                          lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=3), inner, max_size=3)),
       wrap=st.booleans())
def test_any_value_decodes_alike(value: Any, wrap: bool) -> None:
    obj = {"id": 3, "op": "match", "hashes": value} if wrap else value
    full, fast = both(pack(obj), LIMITS[0])
    assert len(full) == len(fast) and all(map(equal, full, fast))


def test_equal_tells_requests_apart() -> None:
    """The comparison the property tests rely on does see a difference."""
    a, b = Decoder().feed(frame([("id", 1), ("op", "match"), ("hashes", [2**40])]) +
                          frame([("id", 1), ("op", "match"), ("hashes", [2**40 + 1])]))
    assert equal(a, a) and not equal(a, b)
    e1, e2 = (Decoder().feed(frame([("id", 1), ("op", "match"), ("hashes", h)]))[0]
              for h in ("x", 1.5))
    assert isinstance(e1, BadMessage) and equal(e1, e1) and not equal(e1, e2)


# ------------------------------------------------------------ the typed read is taken


@pytest.mark.parametrize("pairs", [
    [("id", 1), ("op", "match"), ("hashes", [2**63, 2**40, U64])],
    [("id", 1), ("op", "match"), ("hashes", [5, 2**40]), ("ns", "a"), ("with_ids", True)],
    [("id", U64), ("op", "match"), ("hashes", ID_A + ID_B), ("holders", 3)],
    [("id", 1), ("op", "match"), ("tokens", b"\x01\x00\x00\x00" * 33)],
    [("id", 1), ("op", "insert"), ("hashes", [2**40, 2**41]), ("meta", 9)],
    [("id", 1), ("op", "insert"), ("hashes", [ID_A, 2**41]), ("meta", [1, 2]),
     ("parent", ID_B)],
    [("id", 1), ("op", "insert"), ("tokens", list(range(40))), ("meta", b"\x00" * 16),
     ("ns", None)],
    [("id", 1), ("op", "match"), ("hashes", [2**40] * 5000)],  # array16, 45 kB
    [("id", 1), ("op", "match"), ("tokens", list(range(20_000)))],  # past 64 KiB
    [("id", 1), ("op", "ping"), ("protocol", None)],  # any op
    [("id", 1), ("op", "match"), ("hashes", [1]), ("parent", 1)],  # a rule refuses it
])
def test_common_requests_take_the_typed_read(pairs: list[tuple[Any, Any]]) -> None:
    raw = frame(pairs)
    assert read_frame(raw, Limits()) is not None
    (got,) = Decoder().feed(raw)
    assert equal(got, oracle.decode_frame(raw, Limits()))


@pytest.mark.parametrize("pairs", [
    [("id", 1), ("op", "match"), ("hashes", [1]), ("bogus", 1)],  # unknown field
    [("id", 1), ("op", "match"), ("hashes", [1, "x"])],  # a value of another type
    [("id", 1), ("op", "match"), ("tokens", [1.5])],
    [("id", 1), ("op", "match"), ("ns", Raw(b"\xa2\xff\xfe"))],  # bad UTF-8
    [(1, 1), ("op", "match"), ("hashes", [1])],  # a non-str key
])
def test_other_shapes_are_built_under_the_budgets(pairs: list[tuple[Any, Any]]) -> None:
    raw = frame(pairs)
    assert read_frame(raw, Limits()) is None
    (got,) = Decoder().feed(raw)
    assert equal(got, oracle.decode_frame(raw, Limits()))


@pytest.mark.parametrize(("limits", "pairs"), [
    (Limits(max_depth=1), [("id", 1), ("op", "match"), ("tokens", [1])]),
    (Limits(max_containers=1), [("id", 1), ("op", "match"), ("tokens", [1])]),
    (Limits(max_sequence_tokens=16), [("id", 1), ("op", "match"), ("tokens", [1] * 40)]),
    (Limits(max_str_bytes=8), [("id", 1), ("op", "match"), ("ns", "x" * 9)]),
    (Limits(max_map_len=2), [("id", 1), ("op", "match"), ("tokens", [1])]),
    (Limits(max_map_len=3), [("id", 1), ("op", "match"), ("after_seq", {"a": 1, "b": 2,
                                                                         "c": 3, "d": 4})]),
    # a repeated field in a frame longer than max_str_bytes: both values count (130 items
    # of max_items 128) though the typed read keeps the last
    (Limits(max_sequence_tokens=64, max_str_bytes=64),
     [("id", 1), ("op", "match"), ("tokens", [1] * 63), ("tokens", [2] * 63)]),
])
def test_a_frame_that_may_pass_a_budget_is_built_under_them(limits: Limits, pairs: list[
        tuple[Any, Any]]) -> None:
    """The typed read declines what the budgets must judge; the answer is the oracle's."""
    raw = frame(pairs)
    assert read_frame(raw, limits) is None
    full, got = both(raw, limits)
    assert len(full) == len(got) == 1 and equal(full[0], got[0]), (full, got)


def test_a_repeated_field_of_a_short_frame_is_read_as_the_build_reads_it() -> None:
    """The last value wins, as in a built map; a short frame cannot pass a budget."""
    raw = frame([("id", 1), ("op", "match"), ("hashes", [1]), ("hashes", [2**40])])
    f = read_frame(raw, Limits())
    assert f is not None and f.hashes.tolist() == [[2**40, 0]]
    full, got = both(raw, Limits())
    assert len(full) == len(got) == 1 and equal(full[0], got[0]), (full, got)


def test_decoder_holds_no_view_of_the_callers_buffer() -> None:
    """The fast path reads frames in place, but never keeps the buffer past feed()."""
    one = frame([("id", 1), ("op", "match"), ("hashes", [2**40])])
    buf = bytearray(one)
    dec = Decoder()
    first = dec.feed(buf)
    buf.extend(frame([("id", 2), ("op", "match"), ("hashes", [2**41])]))  # resizable
    second = dec.feed(buf[len(one):])
    assert [r.id for r in first] == [1] and [r.id for r in second] == [2]


def test_a_frame_split_across_feeds_takes_the_full_path_alike() -> None:
    raw = frame([("id", 1), ("op", "insert"), ("hashes", [2**40, 2**50]), ("meta", 3)])
    whole = Decoder().feed(raw)
    dec = Decoder()
    parts = dec.feed(raw[:10]) + dec.feed(raw[10:])
    assert len(whole) == len(parts) == 1 and equal(whole[0], parts[0])
