"""The shard map and its rule (sarpd/cluster/shardmap.py): both versions, the tables,
and the property every answer's exactness rests on: whatever two sequences share
past the heads lives on the shard a read of either is sent to."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.cluster.shardmap import (
    MAX_HEAD_DEPTH,
    Plan,
    ShardMap,
    Split,
    key_of,
    keys_of,
)
from sarpd.core.shards import shard_of
from sarpd.errors import BadRequest


def chain(tokens: list[int]) -> np.ndarray:
    """Prefix-chained ids of a sequence of small ints ((n, 2) uint64)."""
    out = np.zeros((len(tokens), 2), dtype=np.uint64)
    for i in range(len(tokens)):
        d = hashlib.blake2b(repr(tokens[: i + 1]).encode(), digest_size=16).digest()
        out[i] = np.frombuffer(d, dtype="<u8")
    return out


def v2(names: int = 4, buckets: int = 16) -> ShardMap:
    m = ShardMap.parse(json.dumps({"version": 2, "rule": "heads",
                                   "shards": [f"s{i}" for i in range(names)],
                                   "buckets": buckets}))
    for b in range(buckets):
        m = m.with_placement(b, b % names)
    return m


def test_v1_is_block_0_modulo() -> None:
    m = ShardMap.parse(b'["a", "b", "c"]')
    assert (m.version, m.rule, m.names) == (1, "block0", ("a", "b", "c"))
    for seq in ([1, 2, 3], [7], [9, 9]):
        ids = chain(seq)
        assert m.plan(ids) == Plan(shard_of(ids, 3), 0, 0)
    assert json.loads(m.dumps()) == ["a", "b", "c"]
    with pytest.raises(BadRequest, match="version 1 map"):
        m.with_split(Split((1,), 0, frozenset()))


@pytest.mark.parametrize("raw, needle", [
    (b"[]", "not a list of distinct shard names"),
    (b'["a", "a"]', "not a list of distinct shard names"),
    (b'{"version": 3}', "neither a list"),
    (b'{"version": 2, "rule": "heads", "shards": ["a"], "buckets": 0}', "buckets: 0"),
    (b"{", "not JSON"),
])
def test_bad_maps_name_the_problem(raw: bytes, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        ShardMap.parse(raw)


def test_v2_round_trip_and_tables() -> None:
    m = ShardMap.parse(b'{"version": 2, "rule": "heads", "shards": ["a", "b"], "buckets": 8}')
    assert (m.version, m.rule, m.buckets) == (2, "heads", 8)
    assert ShardMap.parse(m.dumps()) == m
    ids = chain([1, 2, 3])
    plan = m.plan(ids)
    assert plan.target is None and plan.unplaced == m.bucket_of(key_of(ids[0]))
    assert m.least_loaded() == 0
    m2 = m.with_placement(plan.unplaced, m.least_loaded())
    assert m2.plan(ids) == Plan(0, 0, 0) and m2.least_loaded() == 1
    assert m2.with_placement(plan.unplaced, 1) is m2  # placed once
    with pytest.raises(BadRequest, match="out of range"):
        m.with_placement(8, 0)
    split = Split(tuple(keys_of(ids[:2])), 1, frozenset({7}), {"a": 3})
    assert Split.from_json(json.loads(json.dumps(split.to_json())), 2) == split
    with pytest.raises(BadRequest, match="owner"):
        Split.from_json({**split.to_json(), "owner": 2}, 2)
    with pytest.raises(BadRequest, match="head"):
        Split.from_json({**split.to_json(), "head": []}, 2)


def test_a_split_spreads_branches_and_keeps_what_the_owner_held() -> None:
    m = v2(names=4, buckets=64)
    head = [5, 6, 7]
    kept_seq, other = chain([*head, 100, 1]), [chain([*head, 200 + i, 1]) for i in range(40)]
    owner = m.plan(kept_seq).target
    assert owner is not None and all(m.plan(s).target == owner for s in other)  # block 0
    m = m.with_split(Split(tuple(keys_of(kept_seq[:3])), owner,
                           frozenset({key_of(kept_seq[3])})))
    assert m.plan(kept_seq) == Plan(owner, 3, 3)
    targets = {m.plan(s).target for s in other}
    assert len(targets) == 4  # 40 branches over 4 shards
    assert all(m.plan(s).depth == 3 and m.plan(s).shared == 3 for s in other)
    inside = chain(head[:2])
    assert m.plan(inside) == Plan(None, 0, 2)  # inside the head: every shard
    assert m.read_shard(inside, m.plan(inside)) == int(inside[-1, 0]) % 4
    exactly = chain(head)
    assert m.plan(exactly).target is None  # ends where the head ends
    elsewhere = chain([5, 9, 7, 1])  # shares block 0 only
    assert m.plan(elsewhere).shared == 1 and m.plan(elsewhere).depth == 0


def test_the_deepest_split_decides() -> None:
    m = v2(names=8, buckets=256)
    outer = chain([1, 2])
    inner = chain([1, 2, 3, 4])
    m = m.with_split(Split(tuple(keys_of(outer)), 0, frozenset()))
    m = m.with_split(Split(tuple(keys_of(inner)), 5, frozenset()))
    deep = chain([1, 2, 3, 4, 9])
    assert m.plan(deep).depth == 4 and m.plan(deep).shared == 4
    assert m.plan(deep).target == m.placements[m.bucket_of(key_of(deep[4]))]
    mid = chain([1, 2, 3, 8])  # leaves the inner head inside it
    plan = m.plan(mid)
    assert (plan.depth, plan.shared) == (2, 3)
    assert plan.target == m.placements[m.bucket_of(key_of(mid[2]))]


def test_heads_deeper_than_the_limit_are_not_looked_at() -> None:
    m = v2(names=2, buckets=4)
    long = chain(list(range(MAX_HEAD_DEPTH + 3)))
    m = m.with_split(Split(tuple(keys_of(long[:4])), 1, frozenset()))
    assert m.plan(long).depth == 4


@st.composite
def forests(draw: st.DrawFn) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
    """Sequences over a tiny alphabet (so that they share prefixes and fan out), and
    splits: (sequence, depth, owner)."""
    seqs = draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7),
                         min_size=1, max_size=24))
    splits = draw(st.lists(st.tuples(st.integers(0, len(seqs) - 1), st.integers(1, 6),
                                     st.integers(0, 3)), max_size=5))
    return seqs, splits


@settings(max_examples=200, deadline=None)
@given(forests(), st.integers(0, 2**32))
def test_what_two_sequences_share_past_the_heads_is_on_the_read_shard(
        forest: tuple[list[list[int]], list[tuple[int, int, int]]], salt: int) -> None:
    seqs, splits = forest
    m = v2(names=4, buckets=8)
    ids = [chain([salt, *s]) for s in seqs]
    for which, depth, owner in splits:
        s = ids[which]
        if depth >= len(s):
            continue
        kept = {key_of(t[depth]) for t in ids[: which + 1]
                if len(t) > depth and key_of(t[depth - 1]) == key_of(s[depth - 1])}
        m = m.with_split(Split(tuple(keys_of(s[:depth])), owner, frozenset(kept)))
    plans = [m.plan(s) for s in ids]
    for s, p in zip(ids, plans, strict=True):
        assert all(m.head_blocks.get(k) == i for i, k in enumerate(keys_of(s[: p.shared])))
        assert p.target is not None or p.shared == len(s)
    for q, pq in zip(ids, plans, strict=True):
        read = m.read_shard(q, pq)
        for s, ps in zip(ids, plans, strict=True):
            k = 0
            while k < min(len(q), len(s)) and key_of(q[k]) == key_of(s[k]):
                k += 1
            # the blocks s shares with q: on every shard (inside heads), or on q's shard
            assert k <= ps.shared or ps.target == read, (k, ps, pq)
