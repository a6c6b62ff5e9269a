"""Request validation (sarpd.protocol.requests): each decoded message -> a typed
request, or a `BadMessage` naming the field and the limit; `Limits`; `report`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sarpd.config import IndexConfig, ServerConfig
from sarpd.errors import BadRequest, ConfigError, TooLarge, UnknownOp
from sarpd.model import (
    AFTER_SEQ_WAIT_MS,
    Check,
    Clear,
    Hello,
    Insert,
    Match,
    Ping,
    Remove,
    Snapshot,
    Stats,
    ids_from_bytes,
)
from sarpd.protocol.requests import (
    MAX_REPORT_COUNTERS,
    BadMessage,
    Limits,
    OddMap,
    parse_message,
    parse_report,
    too_deep,
)
from sarpd.protocol.wire import Decoder, encode_error, encode_request
from tests.protocol.helpers import ID_A, ID_B, SMALL, decode1, m, pack, u32, unpack

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
    ({"id": 7, "op": 3}, "bad_request", "op: 3 is not a str", 7),
    ({"id": 7, "op": "nope"}, "unknown_op", "op: unknown op 'nope'", 7),
    ({"id": 7, "op": "MATCH", "tokens": []}, "unknown_op", "op:", 7),
    (m("match"), "bad_request", "tokens, hashes: missing", 7),
    (m("match", tokens=[], hashes=[]), "bad_request", "not both", 7),
    (m("match", tokens="abc"), "bad_request", "tokens: 'abc' is not an array of uint32", 7),
    (m("match", tokens={"a": 1}), "bad_request", "tokens: {'a': 1} is not", 7),
    (m("match", tokens=[1, "a"]), "bad_request", "tokens[1]: 'a' is not a uint32", 7),
    (m("match", tokens=[1, True]), "bad_request", "tokens[1]: True is not a uint32", 7),
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
    (m("match", hashes={"a": 1}), "bad_request", "hashes: {'a': 1} is not a bin", 7),
    (m("match", hashes="abc"), "bad_request", "hashes: 'abc' is not", 7),
    (m("match", hashes=7), "bad_request", "hashes: 7 is not", 7),
    (m("match", tokens=[], ns=5), "bad_request", "ns: 5 is not a str", 7),
    (m("match", tokens=[], ns=b"x"), "bad_request", "ns: b'x' is not a str", 7),
    (m("match", tokens=[], ns="x" * 1025), "bad_request", "ns: 1025 bytes exceeds max_ns_bytes", 7),
    (m("match", tokens=[], ns="é" * 600), "bad_request", "ns: 1200 bytes", 7),
    (m("match", tokens=[], with_ids="yes"), "bad_request", "with_ids: 'yes' is not a bool", 7),
    (m("match", tokens=[], with_ids=1), "bad_request", "with_ids: 1 is not a bool", 7),
    (m("match", tokens=[], spans="yes"), "bad_request", "spans: 'yes' is not a bool", 7),
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
    (m("insert", tokens=TOK32, meta=True), "bad_request", "meta: True is not a uint64", 7),
    (m("insert", tokens=TOK32, meta=1.5), "bad_request", "meta: 1.5 is not a uint64", 7),
    (m("insert", tokens=TOK32, meta={"a": 1}), "bad_request", "meta: {'a': 1} is not a uint64", 7),
    (m("insert", tokens=TOK32, meta=0, parent=b"x" * 8), "bad_request", "parent: bin of 8", 7),
    (m("insert", tokens=TOK32, meta=0, parent=-5), "bad_request", "parent: -5", 7),
    (m("insert", tokens=TOK32, meta=0, parent="a"), "bad_request",
     "parent: 'a' is not a uint64 or a 16-byte bin", 7),
    (m("insert", tokens=TOK32, meta=0, parent=[ID_A]), "bad_request",
     "is not a uint64 or a 16-byte bin", 7),
    (m("remove"), "bad_request", "remove: needs tokens or hashes", 7),
    (m("remove", ns="a"), "bad_request", "remove: needs tokens or hashes", 7),
    (m("remove", tokens=[], ids=[1]), "bad_request", "or ids, not both", 7),
    (m("remove", tokens=[], **{"from": -1}), "bad_request", "from: -1 is not a uint64", 7),
    (m("remove", tokens=[], **{"from": "x"}), "bad_request", "from: 'x' is not a uint64", 7),
    (m("remove", tokens=[], **{"from": True}), "bad_request", "from: True is not a uint64", 7),
    (m("remove", ids=[1], **{"from": 2}), "bad_request", "from: only with tokens", 7),
    (m("remove", tokens=[], parent=1), "bad_request", "parent: not allowed in remove", 7),
    (m("remove", ids=["a"]), "bad_request", "ids[0]", 7),
    (m("remove", ids=b"x" * 15), "bad_request", "ids: bin of 15 bytes", 7),
    (m("remove", ids=5), "bad_request", "ids: 5 is not a bin", 7),
    (m("clear"), "bad_request", "ns: missing", 7),
    (m("clear", ns=1), "bad_request", "ns: 1 is not a str", 7),
    (m("clear", ns="a", mask=-1), "bad_request", "mask: -1 is not a uint64", 7),
    (m("clear", ns="a", mask=1.0), "bad_request", "mask: 1.0 is not a uint64", 7),
    (m("clear", ns="a", value="x"), "bad_request", "value: 'x' is not a uint64", 7),
    (m("clear", ns="a", mask=0xF0, value=0x0F), "bad_request", "value: 0xf has bits outside", 7),
    (m("clear", ns="a", tokens=[1]), "bad_request", "tokens: not allowed in clear", 7),
    (m("clear", ns="a", hashes=[1]), "bad_request", "hashes: not allowed in clear", 7),
    (m("clear", ns="a", ids=[1]), "bad_request", "ids: not allowed in clear", 7),
    (m("check", fix="yes"), "bad_request", "fix: 'yes' is not a bool", 7),
    (m("check", fix=0), "bad_request", "fix: 0 is not a bool", 7),
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


def test_limits_from_config() -> None:
    cfg = ServerConfig(max_frame_size=4096, index=IndexConfig(max_sequence_tokens=1024))
    lim = Limits.from_config(cfg)
    assert (lim.max_frame_size, lim.max_sequence_tokens, lim.block_tokens) == (4096, 1024, 16)
    assert lim.max_ids == 64 and lim.max_items == 2048
    assert Limits().max_ids == 65536
    assert Limits(max_ids=10).max_ids == 10
    with pytest.raises(ConfigError, match="max_frame_size"):
        Limits(max_frame_size=0)


# ------------------------------------------------------------- parse_message directly


def test_parse_message_types_a_request_and_keeps_its_id_on_errors() -> None:
    req = parse_message({"id": 3, "op": "match", "tokens": [1, 2]}, SMALL)
    assert isinstance(req, Match) and req.id == 3
    assert req.seq.tokens is not None and req.seq.tokens.tolist() == [1, 2]
    bad = parse_message({"id": 4, "op": "match"}, SMALL)
    assert isinstance(bad, BadMessage) and bad.id == 4 and isinstance(bad.error, BadRequest)
    odd = parse_message(OddMap([(1, 2), ("id", 5)]), SMALL)
    assert isinstance(odd, BadMessage) and odd.id == 0
    assert odd.error.message == "request: map keys must be strings"


def test_too_deep_names_the_limit_and_keeps_the_id() -> None:
    def nest(depth: int) -> object:
        obj: object = 1
        for _ in range(depth):
            obj = [obj]
        return obj

    assert too_deep({"id": 9, "op": "ping", "x": nest(6)}, 8) is None  # 7 levels
    deep = too_deep({"id": 9, "op": "ping", "x": nest(8)}, 8)  # 9 levels
    assert isinstance(deep, BadMessage) and deep.id == 9
    assert isinstance(deep.error, TooLarge) and "exceeds max_depth (8)" in deep.error.message
    odd = too_deep(OddMap([(1, nest(3))]), 2)  # an odd map's keys and values count too
    assert isinstance(odd, BadMessage) and odd.id == 0
    assert too_deep(nest(20_000), 8) is not None  # iterative: no recursion limit


# --------------------------------------------------------------------- report (extension)


@pytest.mark.parametrize(("fields", "error", "says"), [
    ({"counters": {}}, BadRequest, "source: None is not a non-empty str"),
    ({"source": "", "counters": {}}, BadRequest, "source"),
    ({"source": "x" * 129, "counters": {}}, TooLarge, "129 bytes exceeds 128"),
    ({"source": "b"}, BadRequest, "counters: None is not a map"),
    ({"source": "b", "counters": {"Bad-Name": 1}}, BadRequest, "is not [a-z]"),
    ({"source": "b", "counters": {"gaps": "3"}}, BadRequest,
     "counters.gaps: '3' is not a finite number"),
    ({"source": "b", "counters": {"lag_s": float("nan")}}, BadRequest, "counters.lag_s"),
    ({"source": "b", "counters": {f"c{i}": i for i in range(MAX_REPORT_COUNTERS + 1)}}, TooLarge,
     f"{MAX_REPORT_COUNTERS + 1} entries exceeds {MAX_REPORT_COUNTERS}"),
])
def test_malformed_reports_name_the_field(fields: dict[str, object], error: type[Exception],
                                          says: str) -> None:
    with pytest.raises(error) as exc:
        parse_report(1, fields)
    assert says in str(exc.value)


def test_a_report_decodes_to_float_counters() -> None:
    (req,) = Decoder().feed(
        encode_request(5, "report", {"source": "bridge", "counters": {"gaps": 2, "lag_s": 0.5}})
    )
    assert not isinstance(req, BadMessage)
    rep = parse_report(5, {"source": "bridge", "counters": {"gaps": 2, "lag_s": 0.5}})
    assert (rep.id, rep.source, dict(rep.counters)) == (5, "bridge", {"gaps": 2.0, "lag_s": 0.5})
    assert type(req) is type(rep) and req.id == 5


def test_hello_negotiates_protocol_2_for_the_requests_after_it() -> None:
    """A decoder speaks protocol 1 until a hello asks for 2: inserts before it keep
    "the first insert wins", inserts after it add holders (PROTOCOL.md "Holders")."""
    dec = Decoder()
    ins = {"tokens": list(range(16)), "meta": 5}
    before, hello, after = dec.feed(encode_request(1, "insert", ins)
                                    + encode_request(2, "hello", {"protocol": 7})
                                    + encode_request(3, "insert", ins))
    assert isinstance(before, Insert) and before.add_holder is False
    assert isinstance(hello, Hello) and hello.protocol == 7 and dec.protocol == 2
    assert isinstance(after, Insert) and after.add_holder is True
    (bad,) = Decoder().feed(encode_request(4, "hello", {"protocol": 0}))
    assert isinstance(bad, BadMessage) and "is not a uint >= 1" in bad.error.message


def test_match_holders_and_remove_meta_fields() -> None:
    tokens = list(range(32))
    (req,) = Decoder().feed(encode_request(1, "match", {"tokens": tokens, "holders": 1024}))
    assert isinstance(req, Match) and req.holders == 1024
    (req,) = Decoder().feed(encode_request(1, "match", {"tokens": tokens}))
    assert isinstance(req, Match) and req.holders == 0
    (big,) = Decoder().feed(encode_request(2, "match", {"tokens": tokens, "holders": 1025}))
    assert isinstance(big, BadMessage) and isinstance(big.error, TooLarge)
    assert "holders: 1,025 exceeds max_match_holders (1,024)" in big.error.message
    (zero,) = Decoder().feed(encode_request(3, "match", {"tokens": tokens, "holders": 0}))
    assert isinstance(zero, BadMessage) and zero.error.code == "bad_request"
    (rm,) = Decoder().feed(encode_request(4, "remove", {"tokens": tokens, "meta": 2**64 - 1}))
    assert isinstance(rm, Remove) and rm.meta == 2**64 - 1
    (rm,) = Decoder().feed(encode_request(5, "remove", {"ns": "a", "ids": [ID_A]}))
    assert isinstance(rm, Remove) and rm.meta is None


def test_match_after_seq_and_its_wait() -> None:
    """Cluster mode's `after_seq` (shard -> uint) and `after_seq_wait_ms` (PROTOCOL.md):
    parsed through the full path (the fast path takes no such frame), checked by name."""
    tokens = list(range(32))
    (req,) = Decoder().feed(encode_request(1, "match", {
        "tokens": tokens, "after_seq": {"s0": 12, "s1": 0}, "after_seq_wait_ms": 250}))
    assert isinstance(req, Match) and req.after_seq == (("s0", 12), ("s1", 0))
    assert req.after_seq_wait_ms == 250
    (plain,) = Decoder().feed(encode_request(2, "match", {"tokens": tokens}))
    assert isinstance(plain, Match) and plain.after_seq == ()
    assert plain.after_seq_wait_ms == AFTER_SEQ_WAIT_MS == 1000
    bad = [({"after_seq": [1, 2]}, "after_seq: [1, 2] is not a map of shard name -> uint64"),
           ({"after_seq": {"s0": -1}}, "after_seq['s0']: -1 is not a uint64"),
           ({"after_seq": {"s0": "7"}}, "after_seq['s0']: '7' is not a uint64"),
           ({"after_seq": {"": 1}}, "after_seq: shard name '' is not a str of 1..64 bytes"),
           ({"after_seq": {"x" * 65: 1}}, "is not a str of 1..64 bytes"),
           ({"after_seq_wait_ms": 60_001}, "after_seq_wait_ms: 60,001 exceeds 60,000"),
           ({"after_seq_wait_ms": -5}, "after_seq_wait_ms: -5 is not a uint64")]
    for i, (fields, message) in enumerate(bad, 3):
        (got,) = Decoder().feed(encode_request(i, "match", {"tokens": tokens, **fields}))
        assert isinstance(got, BadMessage) and got.error.code == "bad_request", fields
        assert message in got.error.message, (fields, got.error.message)
    many = {f"s{i}": 1 for i in range(1025)}  # past the frame's map limit by default
    (big,) = Decoder(Limits(max_map_len=2048)).feed(
        encode_request(20, "match", {"tokens": tokens, "after_seq": many}))
    assert isinstance(big, BadMessage) and isinstance(big.error, TooLarge)
