"""Hostile input: hypothesis fuzzers on the frame decoder and the request validator
(`sarpd.protocol.wire`). Every input must end in typed requests, per-request errors
(`BadMessage`) or one stream error (`FrameError`) whose response encodes: never
another exception, a hang (pytest-timeout), or a crash.

Default suite: a few hundred examples per fuzzer (seconds). The long run is
`@pytest.mark.slow` (excluded by default); scale it with SARP_FUZZ_EXAMPLES:

    SARP_FUZZ_EXAMPLES=200000 python -m pytest -p no:cacheprovider -q -m slow \
        tests/protocol/test_fuzz.py

The documented limits (PROTOCOL.md, "Limits") are also checked against a real
daemon: nesting depth, string length, and that the connection survives a
per-request error.
"""

from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarpd.errors import FrameError
from sarpd.model import Clear, Insert, Match, Remove, Request
from sarpd.protocol.wire import BadMessage, Decoder, Limits, encode_error, parse_message
from tests.daemon_helpers import RawConn, SarpdProc
from tests.protocol.helpers import SMALL, pack, unpack

LIMITS = Limits(max_frame_size=4096, max_sequence_tokens=256, max_ns_bytes=16, max_str_bytes=64)
CODES = {"bad_request", "unknown_op", "too_large"}
LONG = int(os.environ.get("SARP_FUZZ_EXAMPLES", "20000"))
OPS = ["hello", "ping", "match", "insert", "remove", "clear", "stats", "snapshot", "check",
       "dump"]

_leaf = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=80) | st.binary(max_size=80)
)
# deep and wide: nesting far past max_depth, containers past the message budgets
_deep = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 3), inner, max_size=3),
    max_leaves=60,
)
_field = (
    _deep
    | st.binary(max_size=96).map(lambda b: b[: len(b) // 16 * 16])
    | st.binary(max_size=64).map(lambda b: b[: len(b) // 4 * 4])
    | st.lists(st.integers(-1, 2**32), max_size=300)
    | st.lists(st.binary(min_size=15, max_size=17), max_size=5)
    | st.text(max_size=20)
    | st.integers(0, 2**64 - 1)
)
_request = st.fixed_dictionaries(
    {"id": st.integers(0, 2**64 - 1) | _leaf, "op": st.sampled_from(OPS) | _leaf},
    optional={k: _field for k in ("tokens", "hashes", "ids", "meta", "parent", "ns", "from",
                                  "mask", "value", "with_ids", "fix", "zz")},
)


def nested(depth: int, leaf: object = 1) -> object:
    obj = leaf
    for _ in range(depth):
        obj = [obj]
    return obj


def check_clean(raw: bytes, cuts: list[int]) -> list[Request | BadMessage]:
    """Feed `raw` in pieces; assert every outcome is clean; the decoded items."""
    dec = Decoder(LIMITS)
    out: list[Request | BadMessage] = []
    pos = 0
    try:
        for cut in [*sorted(c % (len(raw) + 1) for c in cuts), len(raw)]:
            out += dec.feed(raw[pos:cut])
            pos = max(pos, cut)
    except FrameError as exc:
        assert exc.code in ("too_large", "bad_request"), exc
        assert msgpack.unpackb(encode_error(0, exc))["ok"] is False
    for item in out:
        if isinstance(item, BadMessage):
            assert item.error.code in CODES, item
            assert msgpack.unpackb(encode_error(item.id, item.error))["ok"] is False
        else:
            check_request(item)
    return out


def check_request(req: Request) -> None:
    """An accepted request respects every limit."""
    assert 0 <= req.id < 2**64
    seq = getattr(req, "seq", None)
    if seq is not None:
        assert len(seq.ns.encode()) <= LIMITS.max_ns_bytes
        if seq.tokens is not None:
            assert len(seq.tokens) <= LIMITS.max_sequence_tokens
        if seq.hashes is not None:
            assert len(seq.hashes) <= LIMITS.max_ids
    if isinstance(req, Insert) and not isinstance(req.meta, int):
        assert len(req.meta) == (
            len(req.seq.tokens) // 16 if req.seq.tokens is not None else len(req.seq.hashes)
        )
    if isinstance(req, Remove | Clear):
        assert len(req.ns.encode()) <= LIMITS.max_ns_bytes


def mutate(raw: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Byte edits: (kind, position, byte): 0 flip, 1 insert, 2 delete."""
    buf = bytearray(raw)
    for kind, pos, byte in edits:
        if not buf:
            break
        i = pos % len(buf)
        if kind == 0:
            buf[i] ^= byte or 1
        elif kind == 1:
            buf.insert(i, byte)
        else:
            del buf[i]
    return bytes(buf)


_edits = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.integers(0, 255)),
                  max_size=6)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=LONG, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(value=_deep | _request, cuts=st.lists(st.integers(0, 10**6), max_size=3))
def test_fuzz_values_decode_cleanly(value: Any, cuts: list[int]) -> None:
    raw = msgpack.packb(value, use_bin_type=True)
    check_clean(raw + raw, cuts)


@FAST
@given(value=_request, edits=_edits, cuts=st.lists(st.integers(0, 10**6), max_size=2))
def test_fuzz_mutated_requests_decode_cleanly(value: Any, edits: Any, cuts: list[int]) -> None:
    check_clean(mutate(msgpack.packb(value, use_bin_type=True), edits), cuts)


@FAST
@given(value=_request, key=st.sampled_from(["id", "tokens", "meta", "from", "mask", "parent"]),
       big=st.integers() | st.lists(st.integers(), max_size=3))
def test_fuzz_request_validator(value: dict[str, Any], key: str, big: Any) -> None:
    """The validator alone, on already-built maps (also those the decoder's budgets
    would have refused, and ints msgpack cannot carry): a request or a per-request
    error, never an exception."""
    value[key] = big
    out = parse_message(value, LIMITS)
    if isinstance(out, BadMessage):
        assert out.error.code in CODES, out
    else:
        check_request(out)


def test_nesting_deeper_than_max_depth_is_a_per_request_too_large() -> None:
    for key in ("id", "op", "ns", "tokens", "zz"):
        msg = {"id": 5, "op": "match", "tokens": [1], key: nested(100)}
        (out,) = Decoder(LIMITS).feed(msgpack.packb(msg))
        assert isinstance(out, BadMessage) and out.error.code == "too_large", (key, out)
        assert f"max_depth ({LIMITS.max_depth})" in out.error.message
        assert out.id == (0 if key == "id" else 5)
    shallow = {"id": 6, "op": "match", "tokens": nested(5)}  # a bad field, not too deep
    (out,) = Decoder(LIMITS).feed(msgpack.packb(shallow))
    assert isinstance(out, BadMessage) and out.error.code == "bad_request"


def test_long_strings_are_refused_by_name() -> None:
    with pytest.raises(FrameError, match=r"max_str_bytes \(64\)"):
        Decoder(LIMITS).feed(msgpack.packb({"id": 1, "op": "x" * 65}))
    (out,) = Decoder(LIMITS).feed(msgpack.packb({"id": 1, "op": "match", "ns": "n" * 17,
                                                 "tokens": []}))
    assert isinstance(out, BadMessage) and "max_ns_bytes (16)" in out.error.message


def test_accepted_requests_are_typed() -> None:
    (m,) = Decoder(LIMITS).feed(msgpack.packb({"id": 1, "op": "match", "tokens": [1] * 32}))
    assert isinstance(m, Match) and len(m.seq.tokens) == 32


@pytest.mark.slow
@SLOW
@given(value=_deep | _request, edits=_edits, cuts=st.lists(st.integers(0, 10**6), max_size=3))
def test_fuzz_long_run(value: Any, edits: Any, cuts: list[int]) -> None:
    raw = msgpack.packb(value, use_bin_type=True)
    check_clean(raw, cuts)
    check_clean(mutate(raw, edits), cuts)
    if isinstance(value, dict):
        out = parse_message(value, LIMITS)
        assert not isinstance(out, BadMessage) or out.error.code in CODES


# ----------------------------------------- small fuzzers (from the wire codec's tests)

_small_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
_small_values = st.recursive(
    _small_leaf,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), inner, max_size=5)
    ),
    max_leaves=30,
)
_small_fields = (
    _small_values
    | st.binary(max_size=64).map(lambda b: b[: len(b) // 16 * 16])
    | st.lists(st.integers(0, 2**32), max_size=40)
)
_small_requests = st.fixed_dictionaries(
    {
        "id": st.integers(-2, 2**64 - 1) | _small_leaf,
        "op": st.sampled_from(
            [
                "hello",
                "ping",
                "match",
                "insert",
                "remove",
                "clear",
                "stats",
                "snapshot",
                "check",
                "nope",
            ]
        )
        | _small_leaf,
    },
    optional={
        k: _small_fields
        for k in (
            "tokens",
            "hashes",
            "ids",
            "meta",
            "parent",
            "ns",
            "from",
            "mask",
            "value",
            "with_ids",
            "fix",
            "x",
        )
    },
)


def _feed_in_two(dec: Decoder, raw: bytes, cut: int) -> list[Any]:
    out: list[Any] = []
    try:
        out += dec.feed(raw[:cut])
        out += dec.feed(raw[cut:])
    except FrameError as exc:
        assert exc.code in ("too_large", "bad_request")
        unpack(encode_error(0, exc))
    return out


def _check_small_outputs(out: list[Any]) -> None:
    for item in out:
        if isinstance(item, BadMessage):
            assert item.error.code in ("bad_request", "unknown_op", "too_large"), item
            assert unpack(encode_error(item.id, item.error))["ok"] is False
        else:
            assert item.id >= 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), cut=st.integers(0, 300))
def test_fuzz_arbitrary_bytes(raw: bytes, cut: int) -> None:
    dec = Decoder(Limits(max_frame_size=128, max_sequence_tokens=64))
    _check_small_outputs(_feed_in_two(dec, raw, cut))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_small_values | _small_requests, cut=st.integers(0, 200))
def test_fuzz_msgpack_small_values(value: Any, cut: int) -> None:
    raw = pack(value)
    out = _feed_in_two(Decoder(SMALL), raw + raw, cut)
    _check_small_outputs(out)


def test_hostile_messages_against_a_real_daemon(shared_sarpd: SarpdProc) -> None:
    with RawConn(shared_sarpd.socket) as conn:
        conn.send({"id": 7, "op": "match", "tokens": [1], "ns": nested(1000)})
        got = conn.recv()
        assert got["id"] == 7 and got["error"]["code"] == "too_large"
        assert "max_depth" in got["error"]["message"]
        assert conn.call("ping", 8)["ok"]  # per-request: the connection lives on
        conn.send_raw(b"\x91" * 5000 + b"\x01")  # past msgpack's own stack: stream error
        got = conn.recv()
        assert got["id"] == 0 and got["error"]["code"] == "bad_request"
        assert conn.closed_by_server()
    with RawConn(shared_sarpd.socket) as conn:
        conn.send({"id": 9, "op": "p" * 70_000})
        got = conn.recv()
        assert got["error"]["code"] == "too_large" and "max_str_bytes" in got["error"]["message"]
        assert conn.closed_by_server()
    with RawConn(shared_sarpd.socket) as conn:
        assert conn.call("ping")["ok"]
