"""sarpd/indexer/api.py: request decoding (errors name the field, Dynamo's statuses by
class), the walk over tiers against a brute-force model, and the answers' shapes as
Dynamo 1.6.1's indexer gave them (docs/HTTP.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.errors import BadRequest, TooLarge
from sarpd.indexer import api
from sarpd.indexer.ingest import DEVICE, DISK, HOST, holder
from tests.oracle import spans_of


def dec(kind: type[api.T], body: object, max_items: int = 100) -> api.T:
    return api.decode(json.dumps(body).encode(), kind, max_items)


def test_decode_names_the_field_and_the_limit() -> None:
    q = dec(api.Query, {"token_ids": [1, 2], "model_name": "m", "extra": 1})
    assert (q.token_ids, q.routing_group, q.lora_name) == ([1, 2], "default", None)
    cases: list[tuple[type[api.Register | api.Query | api.QueryByHash | api.Unregister],
                      object, type[Exception], str]] = [
        (api.Query, {"model_name": "m"}, api.FieldError, "missing required field `token_ids`"),
        (api.Query, {"token_ids": [-1], "model_name": "m"}, api.FieldError, "$.token_ids[0]"),
        (api.Query, {"token_ids": [2**32], "model_name": "m"}, api.FieldError, "$.token_ids[0]"),
        (api.Query, {"token_ids": [1.5], "model_name": "m"}, api.FieldError, "$.token_ids[0]"),
        (api.Query, {"token_ids": [1] * 101, "model_name": "m"}, TooLarge,
         "token_ids: 101 items exceeds the limit (100)"),
        (api.Query, {"token_ids": [], "model_name": "m" * 1025}, TooLarge,
         "model_name: 1025 bytes exceeds the limit (1024)"),
        (api.Query, {"token_ids": [], "model_name": "a\u0000b"}, api.FieldError,
         "model_name: contains a NUL"),
        (api.QueryByHash, {"block_hashes": [2**63], "model_name": "m"}, api.FieldError,
         "$.block_hashes[0]"),
        (api.QueryByHash, {"block_hashes": [], "model_name": "m", "cache_salt": ""}, BadRequest,
         "cache_salt is not accepted by /query_by_hash"),
        (api.Register, {"instance_id": 2**64, "endpoint": "tcp://h:1", "model_name": "m",
                        "block_size": 16}, api.FieldError, "instance_id: 18446744073709551616"),
        (api.Register, {"instance_id": 1, "endpoint": "tcp://h:1", "model_name": "m",
                        "block_size": 16, "dp_rank": -1}, api.FieldError, "$.dp_rank"),
        (api.Unregister, {"instance_id": 1}, api.FieldError, "`model_name`"),
        (api.Unregister, [1, 2], api.FieldError, "Expected `object`, got `array`"),
    ]
    for kind, body, exc, words in cases:
        with pytest.raises(exc) as info:
            dec(kind, body)
        assert words in str(info.value), (body, str(info.value))
    with pytest.raises(BadRequest, match="body: JSON is malformed") as bad:
        api.decode(b"{bad", api.Query, 10)
    assert not isinstance(bad.value, api.FieldError)  # 400, not 422
    r = dec(api.Register, {"instance_id": 2**64 - 1, "endpoint": "e", "model_name": "m",
                           "block_size": 16, "additionalsalt": "x", "tenant_id": "t"})
    assert (r.instance_id, r.dp_rank, r.replay_endpoint) == (2**64 - 1, 0, None)


def brute(held: dict[tuple[int, int], set[int]], ranks: dict[int, tuple[int, int]]
          ) -> dict[int, api.Reach]:
    """Dynamo's walk per rank, block by block."""
    out: dict[int, api.Reach] = {}
    for slot, (inst, rank) in ranks.items():
        g = 0
        while g in held.get((slot, DEVICE), set()):
            g += 1
        c = g
        while c in held.get((slot, HOST), set()):
            c += 1
        d = c
        while d in held.get((slot, DISK), set()):
            d += 1
        if d:
            old = out.get(inst, api.Reach({}, 0, 0))
            out[inst] = api.Reach({**old.dp, rank: g}, max(old.cpu, c), max(old.disk, d))
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), slots=st.integers(1, 4))
def test_reach_is_the_block_by_block_walk(data: st.DataObject, n: int, slots: int) -> None:
    ranks = {s: (s // 2, s % 2) for s in range(slots)}  # two ranks an instance
    held = {(s, t): set(data.draw(st.lists(st.integers(0, n - 1), max_size=n)))
            for s in range(slots) for t in (DEVICE, HOST, DISK)}
    blocks = [{holder(s, t) for (s, t), pos in held.items() if i in pos} for i in range(n)]
    got = api.reach(spans_of(blocks), ranks)
    assert got == brute(held, ranks)


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40)), max_size=8,
                     unique_by=lambda r: r[0]),
       known=st.integers(0, 8), size=st.sampled_from([1, 16, 64]))
def test_device_answer_is_the_walks_answer_on_device_runs(
        runs: list[tuple[int, int]], known: int, size: int) -> None:
    """Holders all on the device tier (several ranks an instance, some slots not
    registered, runs of 0): the same answer as `answer(reach(...))` of their spans."""
    ranks = {s: (100 + s // 3, s % 3) for s in range(known)}
    holders = [(holder(s, DEVICE), n) for s, n in runs]
    spans = [(meta, 0, n) for meta, n in holders if n]
    want = api.answer(api.reach(spans, ranks), size)
    got = api.device_answer(holders, ranks, size)
    assert json.dumps(got) == json.dumps(want)  # the same keys in the same order


def test_reach_skips_unknown_slots() -> None:
    spans = [(holder(3, DEVICE), 0, 2)]
    assert api.reach(spans, {}) == {}


def test_answers_as_dynamo_gave_them() -> None:
    """F1.2 (two ranks), F1.3 (a CPU-only instance), F1.7 (a rank reached only below)."""
    reach = {2: api.Reach({0: 2, 1: 5}, 5, 5), 1: api.Reach({0: 3}, 3, 3),
             4: api.Reach({0: 0}, 4, 4), 5: api.Reach({0: 2, 1: 0}, 3, 3)}
    assert api.answer(reach, 16) == {
        "scores": {"2": {"0": 32, "1": 80}, "1": {"0": 48}, "5": {"0": 32}},
        "frequencies": [],
        "instances": {
            "2": {"longest_matched": 80, "gpu": 80, "dp": {"0": 32, "1": 80}, "cpu": 80,
                  "disk": 80},
            "1": {"longest_matched": 48, "gpu": 48, "dp": {"0": 48}, "cpu": 48, "disk": 48},
            "4": {"longest_matched": 64, "gpu": 0, "dp": {"0": 0}, "cpu": 64, "disk": 64},
            "5": {"longest_matched": 48, "gpu": 32, "dp": {"0": 32, "1": 0}, "cpu": 48,
                  "disk": 48},
        }}
    assert api.answer({}, 16) == {"scores": {}, "frequencies": [], "instances": {}}


def test_workers_answer_merges_ranks_and_takes_the_worst_status() -> None:
    rows = [api.Listed(7, "w", "default", 16, 0, "tcp://a:1", "active"),
            api.Listed(7, "w", "default", 16, 1, "tcp://a:2", "failed", "boom"),
            api.Listed(8, "w", "default", 16, 0, "tcp://b:1", "pending")]
    got = api.workers_answer(rows)
    assert got == [
        {"instance_id": 7, "source": "zmq", "status": "failed", "model_name": "w",
         "routing_group": "default", "block_size": 16,
         "endpoints": {"0": "tcp://a:1", "1": "tcp://a:2"},
         "listeners": {"0": {"endpoint": "tcp://a:1", "status": "active"},
                       "1": {"endpoint": "tcp://a:2", "status": "failed",
                             "last_error": "boom"}}},
        {"instance_id": 8, "source": "zmq", "status": "pending", "model_name": "w",
         "routing_group": "default", "block_size": 16, "endpoints": {"0": "tcp://b:1"},
         "listeners": {"0": {"endpoint": "tcp://b:1", "status": "pending"}}}]


def test_dump_is_dynamo_s_stored_events_parents_first() -> None:
    blocks = {11: (b"i" * 16, 0b001, 101, None, 0, 0), 12: (b"j" * 16, 0b011, 102, 11, 1, 0),
              13: (b"k" * 16, 0b100, 103, 12, 2, 0)}
    doc = api.dump({("m", "g"): 16, ("empty", "default"): 16}, [("m", "g", 7, 1, blocks)])
    assert doc["empty:default"] == {"block_size": 16, "events": []}
    events = doc["m:g"]["events"]
    assert [(e["storage_tier"], e["event"]["event_id"],
             e["event"]["data"]["stored"]["parent_hash"],
             e["event"]["data"]["stored"]["blocks"]) for e in events] == [
        ("device", 0, None, [{"block_hash": 11, "tokens_hash": 101, "mm_extra_info": None}]),
        ("device", 1, 11, [{"block_hash": 12, "tokens_hash": 102, "mm_extra_info": None}]),
        ("host_pinned", 0, 11, [{"block_hash": 12, "tokens_hash": 102, "mm_extra_info": None}]),
        ("disk", 0, 12, [{"block_hash": 13, "tokens_hash": 103, "mm_extra_info": None}])]
    assert {(e["worker_id"], e["event"]["dp_rank"], e["residency_domain"]) for e in events} == \
        {(7, 1, "worker")}
    assert all(e["event"]["data"]["stored"]["start_position"] is None for e in events)
