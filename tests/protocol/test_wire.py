"""The sans-I/O wire codec (sarpd.protocol.wire): stream framing and its limits,
response and request encoding, wire error codes."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import numpy as np
import pytest

from sarpd.errors import (
    BadRequest,
    Busy,
    FrameError,
    Internal,
    SarpError,
    TooLarge,
    Unavailable,
    UnknownOp,
    UnknownParent,
)
from sarpd.model import (
    CheckReport,
    InsertResult,
    Match,
    MatchResult,
    RemoveResult,
    SnapshotResult,
    ids_from_bytes,
)
from sarpd.protocol.wire import (
    Decoder,
    Limits,
    StreamError,
    encode_error,
    encode_ok,
    encode_request,
    encode_result,
    error_from_code,
)
from tests.protocol.helpers import ID_A, ID_B, SMALL, m, pack, u32, unpack

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


@pytest.mark.parametrize("n", [0, 1, 3, 64])
def test_match_and_insert_answers_are_bytes_of_the_generic_encoder(n: int) -> None:
    """The hot results build their response map at once: the same bytes as
    `encode_ok` of their fields (numpy-typed fields too, through `_plain`)."""
    meta = np.arange(n, dtype=np.uint64) * (2**63 // 7)
    ids = ids_from_bytes((ID_A + ID_B) * n)[:n]
    plain, full = MatchResult(n, meta), MatchResult(n, meta, ids, [(1, n)])
    for res, holders in ((plain, None), (full, [[1, n]])):
        fields: dict[str, Any] = {
            "blocks": n, "tokens": n * 32, "meta": meta.astype("<u8").tobytes()}
        if res.ids is not None:
            fields["ids"] = ids.astype("<u8").tobytes()
            fields["holders"] = holders
        assert encode_result(7, res, block_tokens=32) == encode_ok(7, fields)
    for blocks in (n, np.int64(n)):
        res = InsertResult(blocks=blocks, new_blocks=np.uint64(1), matched_blocks=2)  # type: ignore[arg-type]
        want = encode_ok(2**64 - 1, {"blocks": n, "new_blocks": 1, "matched_blocks": 2})
        assert encode_result(2**64 - 1, res) == want


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
