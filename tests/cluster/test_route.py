"""Where a cluster client sends a request (sarpd/cluster/route.py): block 0's internal
id from every wire form of a sequence, the shard rule, broadcasts and their merge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sarpd.client.fields import ids_field, tokens_bin
from sarpd.cluster import route
from sarpd.cluster.shardmap import ShardMap
from sarpd.core.ids import salt_ids, token_ids
from sarpd.core.shards import shard_of
from sarpd.errors import BadRequest, QuotaExceeded, UnknownParent

BT = 16
NAMES = ["s0", "s1", "s2"]


def test_block_0_from_every_wire_form() -> None:
    toks = np.arange(40, dtype=np.uint32)
    want = token_ids("t", toks[:BT], BT)
    got = route.first_block({"ns": "t", "tokens": tokens_bin(toks)}, BT)
    assert got is not None and (got == want).all()
    assert route.first_block({"ns": "t", "tokens": tokens_bin(toks[:BT - 1])}, BT) is None
    ids = np.array([[5, 0], [6, 0]], dtype=np.uint64)
    salted = salt_ids("h", ids[:1])
    for form in (ids_field(ids, "hashes"), [5, 6], [b"\x05" + b"\x00" * 15]):
        got = route.first_block({"ns": "h", "hashes": form}, BT)
        assert got is not None and (got == salted).all(), form
    assert route.first_block({"ns": "h", "hashes": []}, BT) is None
    with pytest.raises(BadRequest, match=r"hashes\[0\]"):
        route.first_block({"ns": "h", "hashes": [-1]}, BT)


def test_targets() -> None:
    toks = tokens_bin(np.arange(64, dtype=np.uint32))
    ids = token_ids("", np.arange(64, dtype=np.uint32), BT)
    home = NAMES[shard_of(ids, 3) or 0]
    for op in ("match", "insert", "remove", "dump"):
        assert route.target(op, {"ns": "", "tokens": toks}, NAMES, BT) == home
    assert route.target("insert", {"ns": "", "tokens": toks, "parent": b"x" * 16},
                        NAMES, BT) is None
    assert route.target("remove", {"ns": "", "ids": b"x" * 16}, NAMES, BT) is None
    assert route.target("clear", {"ns": ""}, NAMES, BT) is None
    assert route.target("hello", {}, NAMES, BT) == "s0"
    assert route.target("match", {"ns": "", "tokens": b""}, NAMES, BT) == "s0"


def test_merges() -> None:
    took = {"blocks": 2, "new_blocks": 2, "matched_blocks": 0, "seq": 4}
    assert route.merge("insert", [UnknownParent("p"), took, UnknownParent("p")]) == took
    lost = route.merge("insert", [UnknownParent("a"), UnknownParent("b")])
    assert isinstance(lost, UnknownParent)
    quota = QuotaExceeded("q")
    assert route.merge("insert", [UnknownParent("a"), quota]) is quota
    assert route.merge("clear", [{"removed": 2}, {"removed": 3}]) == {"removed": 5}
    assert route.merge("remove", [{"removed": 1}, quota]) is quota


def test_shard_maps_are_checked() -> None:
    assert ShardMap.parse(b'["a", "b"]').names == ("a", "b")
    for bad in ([], ["a", "a"], "a", [1], [""]):
        with pytest.raises(BadRequest, match="shard map"):
            ShardMap.parse(json.dumps(bad))
    assert route.request_subject("s1") == "sarp.req.s1" and route.queue_group("s1") == "sarp-s1"
