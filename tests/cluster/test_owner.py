"""A replica's decisions on splits (sarpd/cluster/owner.py): the fence answers `moved`
exactly when the request's route is shallower than a split of this shard that the
sequence passes and goes beyond; the learner sees only inserts this shard took whole."""

from __future__ import annotations

import numpy as np
import pytest

from sarpd.cluster.learner import SplitLearner
from sarpd.cluster.owner import Owner
from sarpd.cluster.shardmap import ShardMap, Split, keys_of
from sarpd.core.ids import salt_ids
from sarpd.errors import Moved
from sarpd.model import IdArray, Insert, InsertResult, Match, Remove, SeqSpec

NAMES = ("s0", "s1")


def ids(*los: int) -> IdArray:
    return np.array([[lo, 0] for lo in los], dtype=np.uint64)


def seq(*los: int) -> SeqSpec:
    """A sequence whose internal ids are `ids(*los)` (the caller ids are salted)."""
    return SeqSpec("n", hashes=salt_ids("n", ids(*los)))


def owner() -> Owner:
    o = Owner(ShardMap(NAMES, 2), "s1", lambda s, n: salt_ids(s.ns, s.hashes[:n]),
              SplitLearner(2, children=2, min_inserts=1))
    o.adopt(Split(tuple(keys_of(ids(1, 2, 3))), 1, frozenset()))
    return o


@pytest.mark.parametrize(("los", "route", "moved"), [
    ((1, 2, 3, 4), 0, True),  # passes the split at depth 3, sender knew none
    ((1, 2, 3, 4), 3, False),  # the sender knew it
    ((1, 2, 3), 0, False),  # ends at the head: still the old region
    ((1, 2, 9, 4), 0, False),  # leaves the head before its end
    ((1, 2, 3, 4), None, False),  # no route: not sent by a map
])
def test_the_fence(los: tuple[int, ...], route: int | None, moved: bool) -> None:
    o = owner()
    for req in (Match(1, seq(*los), route=route), Insert(1, seq(*los), 7, route=route),
                Remove(1, seq(*los), ns="n", route=route)):
        got = o.fence(req)
        assert isinstance(got, Moved) if moved else got is None
        if moved:
            assert str(got).startswith(f"route: depth {route}, but shard s1 split")


def test_the_learner_sees_inserts_taken_whole_from_their_region() -> None:
    o = owner()
    whole = [Insert(1, seq(1, 2, 3, 4, 5 + i), 7, route=3) for i in range(3)]
    part = Insert(1, seq(1, 2, 3, 4, 9), 7)  # a head part: no route
    assert o.observe(part, InsertResult(5, 1, 4)) is None
    assert o.learner.inserts == 0
    got = [o.observe(w, InsertResult(5, 1, 4)) for w in whole]
    assert o.learner.inserts == 3
    props = [p for p in got if p is not None]  # at 2 branches: the first divergence
    assert len(props) == 1 and keys_of(props[0].head) == keys_of(ids(1, 2, 3, 4))
    with pytest.raises(ValueError, match="rule block0 has no splits"):
        Owner(ShardMap(NAMES), "s0", lambda s, n: ids())


def test_an_insert_is_hashed_once_for_its_fence_and_its_learner() -> None:
    calls: list[int] = []

    def seq_ids(s: SeqSpec, n: int) -> IdArray:
        calls.append(n)
        return salt_ids(s.ns, s.hashes[:n])

    o = Owner(ShardMap(NAMES, 2), "s1", seq_ids)
    o.adopt(Split(tuple(keys_of(ids(1, 2, 3))), 1, frozenset()))
    req = Insert(1, seq(1, 2, 3, 4, 5), 7, route=3)
    assert o.fence(req) is None
    o.observe(req, InsertResult(5, 1, 4))
    assert calls == [4097]
    o.fence(Insert(1, seq(1, 2, 3, 4, 6), 7, route=3))  # another sequence: hashed
    assert calls == [4097, 4097]
