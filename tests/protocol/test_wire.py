"""The sans-I/O wire codec: request validation, stream framing, response encoding."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarpd.config import IndexConfig, ServerConfig
from sarpd.errors import (
    BadRequest,
    Busy,
    ConfigError,
    FrameError,
    Internal,
    SarpError,
    TooLarge,
    Unavailable,
    UnknownOp,
    UnknownParent,
)
from sarpd.model import (
    Check,
    CheckReport,
    Clear,
    Hello,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Ping,
    Remove,
    RemoveResult,
    Snapshot,
    SnapshotResult,
    Stats,
    ids_from_bytes,
)
from sarpd.protocol.wire import (
    BadMessage,
    Decoder,
    Limits,
    StreamError,
    encode_error,
    encode_ok,
    encode_request,
    encode_result,
    error_from_code,
)

ID_A = bytes(range(16))
ID_B = bytes(range(100, 116))
SMALL = Limits(max_sequence_tokens=64)  # max_ids 4, max_items 128


def pack(obj: Any) -> bytes:
    raw: bytes = msgpack.packb(obj, use_bin_type=True)
    return raw


def unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False)


def decode1(obj: Any, limits: Limits | None = None) -> Any:
    out = Decoder(limits).feed(pack(obj))
    assert len(out) == 1
    return out[0]


def u32(values: list[int]) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


def m(op: str, **fields: Any) -> dict[str, Any]:
    return {"id": 7, "op": op, **fields}


TOK32 = list(range(32))

# (message, expected code, text the error message must contain, expected id)
BAD_CASES: list[tuple[Any, str, str, int]] = [
    (5, "bad_request", "request: expected a map, got int", 0),
    ([1, 2], "bad_request", "request: expected a map, got array", 0),
    ({1: 2, "id": 3}, "bad_request", "request: map keys must be strings", 0),
    ({"op": "ping"}, "bad_request", "id: missing", 0),
    ({"id": -1, "op": "ping"}, "bad_request", "id:", 0),
    ({"id": "7", "op": "ping"}, "bad_request", "id:", 0),
    ({"id": True, "op": "ping"}, "bad_request", "id:", 0),
    ({"id": 1.0, "op": "ping"}, "bad_request", "id:", 0),
    ({"id": 7}, "bad_request", "op: missing", 7),
    ({"id": 7, "op": 3}, "bad_request", "op: expected a str", 7),
    ({"id": 7, "op": "nope"}, "unknown_op", "op: unknown op 'nope'", 7),
    ({"id": 7, "op": "MATCH", "tokens": []}, "unknown_op", "op:", 7),
    (m("match"), "bad_request", "tokens, hashes: missing", 7),
    (m("match", tokens=[], hashes=[]), "bad_request", "not both", 7),
    (m("match", tokens="abc"), "bad_request", "tokens: expected", 7),
    (m("match", tokens={"a": 1}), "bad_request", "tokens: expected", 7),
    (m("match", tokens=[1, "a"]), "bad_request", "tokens[1]: expected a uint32, got str", 7),
    (m("match", tokens=[1, True]), "bad_request", "tokens[1]: expected a uint32, got bool", 7),
    (m("match", tokens=[1, 1.5]), "bad_request", "tokens[1]", 7),
    (m("match", tokens=[1, None]), "bad_request", "tokens[1]", 7),
    (m("match", tokens=[0, -1]), "bad_request", "tokens[1]: -1 is not a uint32", 7),
    (m("match", tokens=[2**32]), "bad_request", "tokens[0]: 4294967296 is not a uint32", 7),
    (m("match", tokens=[3, 2**64 - 1]), "bad_request", "tokens[1]", 7),
    (m("match", tokens=[1, -(2**63)]), "bad_request", "tokens[1]", 7),
    (m("match", tokens=b"12345"), "bad_request", "tokens: bin of 5 bytes", 7),
    (m("match", hashes=b"x" * 17), "bad_request", "hashes: bin of 17 bytes", 7),
    (m("match", hashes=[b"x" * 15]), "bad_request", "hashes[0]: bin of 15 bytes", 7),
    (m("match", hashes=[1, -1]), "bad_request", "hashes[1]", 7),
    (m("match", hashes=[ID_A, -1]), "bad_request", "hashes[1]", 7),
    (m("match", hashes=[1, "a"]), "bad_request", "hashes[1]", 7),
    (m("match", hashes=[ID_A, 3.0]), "bad_request", "hashes[1]", 7),
    (m("match", hashes=[ID_A, True]), "bad_request", "hashes[1]", 7),
    (m("match", hashes={"a": 1}), "bad_request", "hashes: expected", 7),
    (m("match", hashes="abc"), "bad_request", "hashes: expected", 7),
    (m("match", hashes=7), "bad_request", "hashes: expected", 7),
    (m("match", tokens=[], ns=5), "bad_request", "ns: expected a str", 7),
    (m("match", tokens=[], ns=b"x"), "bad_request", "ns: expected a str", 7),
    (m("match", tokens=[], ns="x" * 1025), "bad_request", "ns: 1025 bytes exceeds max_ns_bytes", 7),
    (m("match", tokens=[], ns="é" * 600), "bad_request", "ns: 1200 bytes", 7),
    (m("match", tokens=[], with_ids="yes"), "bad_request", "with_ids: expected a bool", 7),
    (m("match", tokens=[], with_ids=1), "bad_request", "with_ids: expected a bool", 7),
    (m("match", tokens=[], parent=5), "bad_request", "parent: not allowed in match", 7),
    (m("insert", tokens=TOK32), "bad_request", "meta: missing", 7),
    (m("insert", tokens=TOK32, meta=[1]), "bad_request", "meta: 1 values for 2 blocks", 7),
    (m("insert", tokens=TOK32, meta=[1, 2, 3]), "bad_request", "meta: 3 values for 2 blocks", 7),
    (m("insert", tokens=TOK32[:31], meta=[1, 2]), "bad_request", "meta: 2 values for 1 block", 7),
    (m("insert", hashes=[1, 2, 3], meta=[1, 2]), "bad_request", "meta: 2 values for 3 blocks", 7),
    (m("insert", tokens=TOK32, meta=b"\0" * 8), "bad_request", "meta: 1 values for 2", 7),
    (m("insert", tokens=TOK32, meta=b"\0" * 12), "bad_request", "meta: bin of 12 bytes", 7),
    (m("insert", tokens=TOK32, meta=-1), "bad_request", "meta: -1 is not a uint64", 7),
    (m("insert", tokens=TOK32, meta=[-1, 0]), "bad_request", "meta[0]", 7),
    (m("insert", tokens=TOK32, meta=[1, "x"]), "bad_request", "meta[1]", 7),
    (m("insert", tokens=TOK32, meta=[1, False]), "bad_request", "meta[1]", 7),
    (m("insert", tokens=TOK32, meta=True), "bad_request", "meta: expected", 7),
    (m("insert", tokens=TOK32, meta=1.5), "bad_request", "meta: expected", 7),
    (m("insert", tokens=TOK32, meta={"a": 1}), "bad_request", "meta: expected", 7),
    (m("insert", tokens=TOK32, meta=0, parent=b"x" * 8), "bad_request", "parent: bin of 8", 7),
    (m("insert", tokens=TOK32, meta=0, parent=-5), "bad_request", "parent: -5", 7),
    (m("insert", tokens=TOK32, meta=0, parent="a"), "bad_request", "parent: expected", 7),
    (m("insert", tokens=TOK32, meta=0, parent=[ID_A]), "bad_request", "parent: expected", 7),
    (m("remove"), "bad_request", "remove: needs tokens or hashes", 7),
    (m("remove", ns="a"), "bad_request", "remove: needs tokens or hashes", 7),
    (m("remove", tokens=[], ids=[1]), "bad_request", "or ids, not both", 7),
    (m("remove", tokens=[], **{"from": -1}), "bad_request", "from: -1 is negative", 7),
    (m("remove", tokens=[], **{"from": "x"}), "bad_request", "from: expected a uint", 7),
    (m("remove", tokens=[], **{"from": True}), "bad_request", "from: expected a uint", 7),
    (m("remove", ids=[1], **{"from": 2}), "bad_request", "from: only with tokens", 7),
    (m("remove", tokens=[], parent=1), "bad_request", "parent: not allowed in remove", 7),
    (m("remove", ids=["a"]), "bad_request", "ids[0]", 7),
    (m("remove", ids=b"x" * 15), "bad_request", "ids: bin of 15 bytes", 7),
    (m("remove", ids=5), "bad_request", "ids: expected", 7),
    (m("clear"), "bad_request", "ns: missing", 7),
    (m("clear", ns=1), "bad_request", "ns: expected a str", 7),
    (m("clear", ns="a", mask=-1), "bad_request", "mask: -1 is negative", 7),
    (m("clear", ns="a", mask=1.0), "bad_request", "mask: expected a uint", 7),
    (m("clear", ns="a", value="x"), "bad_request", "value: expected a uint", 7),
    (m("clear", ns="a", mask=0xF0, value=0x0F), "bad_request", "value: 0xf has bits outside", 7),
    (m("clear", ns="a", tokens=[1]), "bad_request", "tokens: not allowed in clear", 7),
    (m("clear", ns="a", hashes=[1]), "bad_request", "hashes: not allowed in clear", 7),
    (m("clear", ns="a", ids=[1]), "bad_request", "ids: not allowed in clear", 7),
    (m("check", fix="yes"), "bad_request", "fix: expected a bool", 7),
    (m("check", fix=0), "bad_request", "fix: expected a bool", 7),
]


@pytest.mark.parametrize(("msg", "code", "text", "rid"), BAD_CASES)
def test_bad_request_yields_bad_message(msg: Any, code: str, text: str, rid: int) -> None:
    out = decode1(msg)
    assert isinstance(out, BadMessage), out
    assert out.id == rid
    assert out.error.code == code
    assert text in out.error.message
    assert isinstance(out.error, UnknownOp if code == "unknown_op" else BadRequest)


TOO_LARGE_CASES: list[tuple[Any, str]] = [
    (m("match", tokens=list(range(65))), "tokens: 65 tokens exceeds max_sequence_tokens (64)"),
    (m("match", tokens=u32(list(range(65)))), "tokens: 65 tokens exceeds max_sequence_tokens"),
    (m("insert", tokens=list(range(100)), meta=0), "tokens: 100 tokens exceeds"),
    (m("match", hashes=[1, 2, 3, 4, 5]), "hashes: 5 ids exceeds max_ids (4)"),
    (m("match", hashes=ID_A * 5), "hashes: 5 ids exceeds max_ids (4)"),
    (m("remove", ids=[ID_A] * 5), "ids: 5 ids exceeds max_ids (4)"),
]


@pytest.mark.parametrize(("msg", "text"), TOO_LARGE_CASES)
def test_too_long_sequences_are_too_large(msg: Any, text: str) -> None:
    out = decode1(msg, SMALL)
    assert isinstance(out, BadMessage)
    assert out.id == 7
    assert isinstance(out.error, TooLarge)
    assert out.error.code == "too_large"
    assert text in out.error.message


def test_sequence_at_the_limit_is_accepted() -> None:
    out = decode1(m("match", tokens=list(range(64))), SMALL)
    assert isinstance(out, Match)
    out = decode1(m("insert", hashes=[1, 2, 3, 4], meta=[1, 2, 3, 4]), SMALL)
    assert isinstance(out, Insert)


def test_invalid_utf8_in_ns_is_a_bad_request_not_a_stream_error() -> None:
    raw = pack(m("match", tokens=[], ns="QQ")).replace(b"\xa2QQ", b"\xa2\xff\xfe")
    dec = Decoder()
    out = dec.feed(raw) + dec.feed(pack({"id": 9, "op": "ping"}))
    assert isinstance(out[0], BadMessage) and "ns:" in out[0].error.message
    assert isinstance(out[1], Ping) and out[1].id == 9
    # an op with bad UTF-8 is an unknown op, and its error message stays encodable
    bad = dec.feed(b"\x82\xa2id\x05\xa2op\xa2\xff\xfe")[0]
    assert isinstance(bad, BadMessage) and bad.error.code == "unknown_op"
    assert unpack(encode_error(bad.id, bad.error))["error"]["code"] == "unknown_op"


def test_unknown_extra_fields_are_ignored_and_nil_is_absent() -> None:
    out = decode1(m("match", tokens=[], future_field={"x": [1, 2]}, k=None, with_ids=None))
    assert isinstance(out, Match) and out.with_ids is False
    out = decode1(m("ping", tokens="nonsense", parent="x"))
    assert isinstance(out, Ping)
    out = decode1(m("insert", tokens=TOK32, meta=3, parent=None))
    assert isinstance(out, Insert) and out.parent is None


# ----------------------------------------------------------------------- round trips


def test_round_trip_simple_ops() -> None:
    for op, cls in [("hello", Hello), ("ping", Ping), ("stats", Stats), ("snapshot", Snapshot)]:
        out = Decoder().feed(encode_request(41, op, {}))
        assert len(out) == 1 and type(out[0]) is cls and out[0].id == 41
    (chk,) = Decoder().feed(encode_request(2, "check", {"fix": True}))
    assert isinstance(chk, Check) and chk.fix is True and chk.id == 2
    (chk,) = Decoder().feed(encode_request(3, "check", {}))
    assert isinstance(chk, Check) and chk.fix is False


def test_round_trip_match_tokens_list_and_bin() -> None:
    tokens = [0, 1, 2**32 - 1, 70000] * 10
    for form in (tokens, u32(tokens)):
        (req,) = Decoder().feed(encode_request(5, "match", {"tokens": form, "ns": "m1"}))
        assert isinstance(req, Match) and req.id == 5 and req.with_ids is False
        assert req.seq.ns == "m1" and req.seq.hashes is None
        assert req.seq.tokens is not None and req.seq.tokens.dtype == np.uint32
        assert req.seq.tokens.tolist() == tokens
    (req,) = Decoder().feed(encode_request(6, "match", {"tokens": [], "with_ids": True}))
    assert isinstance(req, Match) and req.with_ids and req.seq.ns == ""
    assert req.seq.tokens is not None and req.seq.tokens.shape == (0,)


def test_round_trip_hashes_in_every_form() -> None:
    expect = ids_from_bytes(ID_A + ID_B)
    low = int.from_bytes(ID_A[:8], "little")
    assert expect[0, 0] == low
    forms: list[Any] = [ID_A + ID_B, [ID_A, ID_B]]
    for form in forms:
        (req,) = Decoder().feed(encode_request(1, "match", {"hashes": form}))
        assert isinstance(req, Match) and req.seq.hashes is not None
        assert req.seq.hashes.dtype == np.uint64 and req.seq.hashes.shape == (2, 2)
        assert (req.seq.hashes == expect).all()
    (req,) = Decoder().feed(encode_request(1, "match", {"hashes": [5, 2**64 - 1, ID_A]}))
    assert isinstance(req, Match) and req.seq.hashes is not None
    assert req.seq.hashes.tolist() == [[5, 0], [2**64 - 1, 0], expect[0].tolist()]
    (req,) = Decoder().feed(encode_request(1, "match", {"hashes": [7, 8]}))
    assert isinstance(req, Match) and req.seq.hashes is not None
    assert req.seq.hashes.tolist() == [[7, 0], [8, 0]]


def test_round_trip_insert_meta_forms_and_parent() -> None:
    base = {"tokens": list(range(40)), "ns": "n"}  # 2 whole blocks, 8 tokens ignored
    (req,) = Decoder().feed(encode_request(1, "insert", {**base, "meta": 9}))
    assert isinstance(req, Insert) and req.meta == 9 and req.parent is None
    for meta in ([3, 2**64 - 1], np.array([3, 2**64 - 1], dtype="<u8").tobytes()):
        (req,) = Decoder().feed(encode_request(2, "insert", {**base, "meta": meta}))
        assert isinstance(req, Insert) and isinstance(req.meta, np.ndarray)
        assert req.meta.dtype == np.uint64 and req.meta.tolist() == [3, 2**64 - 1]
    (req,) = Decoder().feed(encode_request(3, "insert", {**base, "meta": 0, "parent": ID_A}))
    assert isinstance(req, Insert) and req.parent is not None
    assert req.parent.shape == (1, 2) and (req.parent == ids_from_bytes(ID_A)).all()
    (req,) = Decoder().feed(encode_request(4, "insert", {"hashes": [1], "meta": [5], "parent": 77}))
    assert isinstance(req, Insert) and req.parent is not None
    assert req.parent.tolist() == [[77, 0]] and req.seq.hashes is not None


def test_round_trip_remove_and_clear() -> None:
    (req,) = Decoder().feed(encode_request(1, "remove", {"tokens": [1] * 32, "from": 1, "ns": "a"}))
    assert isinstance(req, Remove) and req.seq is not None and req.start == 1
    assert req.ids is None and req.seq.ns == "a" and req.ns == "a"
    (req,) = Decoder().feed(encode_request(2, "remove", {"hashes": [1, 2]}))
    assert isinstance(req, Remove) and req.start == 0 and req.seq is not None
    (req,) = Decoder().feed(encode_request(3, "remove", {"ns": "b", "ids": [ID_A, 9]}))
    assert isinstance(req, Remove) and req.seq is None and req.ns == "b"
    assert req.ids is not None and req.ids.shape == (2, 2) and req.ids[1].tolist() == [9, 0]
    (req,) = Decoder().feed(encode_request(4, "clear", {"ns": "c", "mask": 0xFF, "value": 0x12}))
    assert isinstance(req, Clear) and (req.ns, req.mask, req.value) == ("c", 0xFF, 0x12)
    (req,) = Decoder().feed(encode_request(5, "clear", {"ns": ""}))
    assert isinstance(req, Clear) and (req.ns, req.mask, req.value) == ("", 0, 0)


def test_decoded_arrays_are_writable_copies() -> None:
    raw = u32([1, 2, 3, 4])
    (req,) = Decoder().feed(encode_request(1, "match", {"tokens": raw}))
    assert isinstance(req, Match) and req.seq.tokens is not None
    req.seq.tokens[0] = 99  # would raise on a read-only view of the frame
    (req,) = Decoder().feed(encode_request(1, "match", {"hashes": ID_A}))
    assert isinstance(req, Match) and req.seq.hashes is not None
    req.seq.hashes[0, 0] = 1


# ----------------------------------------------------------------------------- framing


def _stream() -> bytes:
    return b"".join(
        [
            encode_request(1, "ping", {}),
            encode_request(2, "match", {"tokens": u32(list(range(64))), "ns": "x"}),
            pack(["not", "a", "map"]),
            encode_request(3, "insert", {"hashes": [ID_A, ID_B], "meta": [1, 2]}),
            encode_request(4, "nope", {}),
            encode_request(5, "clear", {"ns": "x"}),
        ]
    )


def _summary(out: list[Any]) -> list[tuple[str, int]]:
    return [(type(x).__name__, x.id) for x in out]


EXPECTED = [
    ("Ping", 1),
    ("Match", 2),
    ("BadMessage", 0),
    ("Insert", 3),
    ("BadMessage", 4),
    ("Clear", 5),
]


def test_many_requests_in_one_feed() -> None:
    assert _summary(Decoder().feed(_stream())) == EXPECTED
    raw = b"".join(encode_request(i, "ping", {}) for i in range(1, 1001))
    out = Decoder().feed(raw)
    assert [x.id for x in out] == list(range(1, 1001))


def test_byte_by_byte_feeding() -> None:
    dec, out = Decoder(), []
    for b in _stream():
        out += dec.feed(bytes([b]))
    assert _summary(out) == EXPECTED


def test_random_splits_and_buffer_types() -> None:
    rng = random.Random(5)
    raw = _stream() * 3
    for _ in range(20):
        dec, out, pos = Decoder(), [], 0
        while pos < len(raw):
            n = rng.randint(0, 40)
            chunk = raw[pos : pos + n]
            out += dec.feed(rng.choice([bytes, bytearray, memoryview])(chunk))
            pos += n
        assert _summary(out) == EXPECTED * 3


def test_oversized_frame_is_a_fatal_too_large() -> None:
    limits = Limits(max_frame_size=1024)
    frame = encode_request(1, "match", {"tokens": bytes(2000)})
    with pytest.raises(FrameError) as info:
        Decoder(limits).feed(frame)
    assert info.value.code == "too_large"
    assert "max_frame_size (1024)" in info.value.message
    dec = Decoder(limits)  # same when it trickles in; the decoder stays dead afterwards
    with pytest.raises(FrameError):
        for i in range(0, len(frame), 100):
            dec.feed(frame[i : i + 100])
    with pytest.raises(FrameError) as again:
        dec.feed(encode_request(2, "ping", {}))
    assert again.value.code == "too_large"


def test_stream_error_keeps_requests_decoded_before_it() -> None:
    dec = Decoder()
    with pytest.raises(StreamError) as info:
        dec.feed(encode_request(1, "ping", {}) + pack({"op": "x"}) + b"\xc1")
    assert isinstance(info.value, FrameError) and info.value.code == "bad_request"
    assert _summary(info.value.decoded) == [("Ping", 1), ("BadMessage", 0)]
    with pytest.raises(StreamError) as again:
        dec.feed(encode_request(2, "ping", {}))
    assert again.value.decoded == [] and again.value.code == "bad_request"


def test_frame_exactly_at_the_limit() -> None:
    frame = encode_request(1, "match", {"tokens": bytes(400)})
    follow = encode_request(2, "ping", {})
    out = Decoder(Limits(max_frame_size=len(frame))).feed(frame + follow + frame)
    assert _summary(out) == [("Match", 1), ("Ping", 2), ("Match", 1)]
    with pytest.raises(FrameError) as info:
        Decoder(Limits(max_frame_size=len(frame) - 1)).feed(follow + frame)
    assert info.value.code == "too_large"
    assert f"{len(frame)} bytes" in info.value.message


def test_large_feed_of_small_frames_is_not_too_large() -> None:
    frame = encode_request(1, "ping", {})
    out = Decoder(Limits(max_frame_size=64)).feed(frame * 500)
    assert len(out) == 500


def test_an_unfinished_message_builds_no_objects() -> None:
    # 300,000 tokens of 3 bytes each: built as they arrive they would be ~10 MB of
    # Python ints; the decoder keeps only the bytes until the message is complete.
    tokens = [1000 + i % 60000 for i in range(300_000)]
    raw = pack({"id": 1, "op": "match", "tokens": tokens})
    dec = Decoder()
    tracemalloc.start()
    try:
        for i in range(0, len(raw) - 1, 65536):
            assert dec.feed(raw[i : min(i + 65536, len(raw) - 1)]) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20
    (req,) = dec.feed(raw[-1:])
    assert isinstance(req, Match) and req.seq.tokens is not None
    assert req.seq.tokens.tolist() == tokens


def test_declared_huge_containers_wait_for_their_bytes_up_to_the_frame_limit() -> None:
    assert Decoder().feed(b"\xdd\x00\x20\x00\x00" * 1000) == []
    for header in (b"\xdd\xff\xff\xff\xff", b"\xdf\x00\x01\x00\x00", b"\xc6\xff\xff\xff\xff"):
        with pytest.raises(FrameError) as info:
            Decoder(Limits(max_frame_size=2**16)).feed(header + b"\x00" * 2**16)
        assert info.value.code == "too_large", header
        assert "max_frame_size (65536)" in info.value.message


def test_message_wide_budgets() -> None:
    with pytest.raises(FrameError) as info:
        Decoder().feed(pack(m("ping", junk=[[]] * 5000)))
    assert info.value.code == "too_large" and "max_containers" in info.value.message
    with pytest.raises(FrameError) as info:
        Decoder(SMALL).feed(pack(m("ping", a=[0] * 100, b=[0] * 100)))
    assert info.value.code == "too_large" and "max_items (128)" in info.value.message
    with pytest.raises(FrameError) as info:
        Decoder(SMALL).feed(pack(m("ping", a=[0] * 129)))
    assert info.value.code == "too_large" and "max_array_len" in info.value.message
    # the budgets are per message: many messages each under them are fine
    out = Decoder(SMALL).feed(pack(m("ping", a=[0] * 100)) * 50)
    assert len(out) == 50


def test_garbage_bytes_are_a_fatal_bad_request() -> None:
    dec = Decoder()
    with pytest.raises(FrameError) as info:
        dec.feed(encode_request(1, "ping", {}) + b"\xc1\x00")
    assert info.value.code == "bad_request" and "not valid msgpack" in info.value.message
    with pytest.raises(FrameError):
        dec.feed(b"")
    with pytest.raises(FrameError) as deep:
        Decoder().feed(b"\x91" * 5000 + b"\x00")
    assert deep.value.code == "bad_request"


def test_limits_from_config() -> None:
    cfg = ServerConfig(max_frame_size=4096, index=IndexConfig(max_sequence_tokens=1024))
    lim = Limits.from_config(cfg)
    assert (lim.max_frame_size, lim.max_sequence_tokens, lim.block_tokens) == (4096, 1024, 16)
    assert lim.max_ids == 64 and lim.max_items == 2048
    assert Limits().max_ids == 65536
    assert Limits(max_ids=10).max_ids == 10
    with pytest.raises(ConfigError, match="max_frame_size"):
        Limits(max_frame_size=0)


# ---------------------------------------------------------------------------- encoding


def test_encode_ok_error_and_request() -> None:
    assert unpack(encode_ok(3, {"a": 1, "id": 99, "ok": False})) == {"id": 3, "ok": True, "a": 1}
    err = unpack(encode_error(4, UnknownParent("parent: 0x5 is not indexed")))
    assert err == {
        "id": 4,
        "ok": False,
        "error": {"code": "unknown_parent", "message": "parent: 0x5 is not indexed"},
    }
    fe = unpack(encode_error(0, FrameError("frame: x", code="bad_request")))
    assert fe["error"]["code"] == "bad_request" and fe["id"] == 0
    odd = unpack(encode_error(1, BadRequest("op: unknown 'p\udcffng'")))
    assert "p\\udcffng" in odd["error"]["message"]
    req = unpack(encode_request(9, "insert", {"meta": 0, "parent": None, "tokens": b"\0" * 4}))
    assert req == {"id": 9, "op": "insert", "meta": 0, "tokens": b"\0" * 4}


def test_encode_result_for_every_result_type() -> None:
    meta = np.array([1, 2**64 - 1], dtype=np.uint64)
    ids = ids_from_bytes(ID_A + ID_B)
    got = unpack(encode_result(1, MatchResult(blocks=2, meta=meta)))
    assert got == {
        "id": 1,
        "ok": True,
        "blocks": 2,
        "tokens": 32,
        "meta": meta.astype("<u8").tobytes(),
    }
    got = unpack(encode_result(1, MatchResult(blocks=2, meta=meta, ids=ids), block_tokens=32))
    assert got["tokens"] == 64 and got["ids"] == ID_A + ID_B
    assert np.frombuffer(got["meta"], "<u8").tolist() == [1, 2**64 - 1]
    got = unpack(encode_result(2, InsertResult(blocks=4, new_blocks=1, matched_blocks=3)))
    assert got == {"id": 2, "ok": True, "blocks": 4, "new_blocks": 1, "matched_blocks": 3}
    assert unpack(encode_result(3, RemoveResult(removed=5)))["removed"] == 5
    got = unpack(encode_result(4, SnapshotResult(segment_id=17, seconds=0.25)))
    assert (got["segment_id"], got["seconds"]) == (17, 0.25)
    got = unpack(encode_result(5, CheckReport(segments=3, routing_points=12, problems=["p"])))
    assert got == {
        "id": 5,
        "ok": True,
        "segments": 3,
        "routing_points": 12,
        "problems": ["p"],
        "fixed": 0,
        "clean": False,
    }
    assert unpack(encode_result(6, CheckReport()))["clean"] is True
    stats = {"blocks": np.int64(5), "bytes_per_block": np.float64(1.5), "backend": "memory"}
    assert unpack(encode_result(7, stats)) == {
        "id": 7,
        "ok": True,
        "blocks": 5,
        "bytes_per_block": 1.5,
        "backend": "memory",
    }
    assert unpack(encode_result(8, None)) == {"id": 8, "ok": True}
    assert unpack(encode_result(9, Busy("queue full")))["error"]["code"] == "busy"
    with pytest.raises(TypeError, match="cannot encode"):
        encode_result(10, object())


def test_error_from_code_maps_every_code() -> None:
    classes: list[type[SarpError]] = [
        BadRequest,
        UnknownOp,
        UnknownParent,
        TooLarge,
        Busy,
        Unavailable,
        Internal,
    ]
    for cls in classes:
        err = error_from_code(cls.code, "msg")
        assert type(err) is cls and err.message == "msg"
    odd = error_from_code("brand_new", "later protocol")
    assert type(odd) is SarpError and odd.code == "brand_new" and odd.message == "later protocol"


# -------------------------------------------------------------------------------- fuzz

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
_values = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), inner, max_size=5)
    ),
    max_leaves=30,
)
_field_values = (
    _values
    | st.binary(max_size=64).map(lambda b: b[: len(b) // 16 * 16])
    | st.lists(st.integers(0, 2**32), max_size=40)
)
_requests = st.fixed_dictionaries(
    {
        "id": st.integers(-2, 2**64 - 1) | _leaf,
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
        | _leaf,
    },
    optional={
        k: _field_values
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


def _feed_all(dec: Decoder, raw: bytes, cut: int) -> list[Any]:
    out: list[Any] = []
    try:
        out += dec.feed(raw[:cut])
        out += dec.feed(raw[cut:])
    except FrameError as exc:
        assert exc.code in ("too_large", "bad_request")
        unpack(encode_error(0, exc))
    return out


def _check_outputs(out: list[Any]) -> None:
    for item in out:
        if isinstance(item, BadMessage):
            assert item.error.code in ("bad_request", "unknown_op", "too_large"), item
            assert unpack(encode_error(item.id, item.error))["ok"] is False
        else:
            assert item.id >= 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), cut=st.integers(0, 300))
def test_fuzz_arbitrary_bytes(raw: bytes, cut: int) -> None:
    _check_outputs(_feed_all(Decoder(Limits(max_frame_size=128, max_sequence_tokens=64)), raw, cut))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values | _requests, cut=st.integers(0, 200))
def test_fuzz_msgpack_values(value: Any, cut: int) -> None:
    raw = pack(value)
    out = _feed_all(Decoder(SMALL), raw + raw, cut)
    _check_outputs(out)
