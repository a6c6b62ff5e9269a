"""Spotting heads worth splitting (sarpd/cluster/learner.py): a system prompt's
fan-out is proposed once it has the branches and the traffic; a fan-out inside one
session, a head already split and a cold head are not."""

from __future__ import annotations

import numpy as np
import pytest

from sarpd.cluster.learner import SplitLearner
from sarpd.cluster.shardmap import key_of
from tests.cluster.test_shardmap import chain


class Index:
    """What a shard's index answers as `matched`: the longest stored prefix."""

    def __init__(self) -> None:
        self.stored: set[int] = set()

    def insert(self, ids: np.ndarray) -> int:
        keys = [key_of(r) for r in ids]
        m = 0
        while m < len(keys) and keys[m] in self.stored:
            m += 1
        self.stored.update(keys)
        return m


def test_a_shared_prompt_is_proposed_once_it_fans_out_with_traffic() -> None:
    learner, index = SplitLearner(4, children=4, hot_share=0.25, min_inserts=8), Index()
    prompt = list(range(10))
    proposals = []
    for session in range(12):
        for turn in range(3):
            ids = chain([*prompt, 1000 + session, *list(range(turn + 1))])
            got = learner.observe("ns", ids, index.insert(ids))
            if got is not None:
                proposals.append((session, turn, got))
    assert len(proposals) == 1  # proposed once, then forgotten as a candidate
    session, turn, got = proposals[0]
    assert got.ns == "ns" and len(got.head) == len(prompt)
    assert key_of(got.head[-1]) == key_of(chain(prompt)[-1])
    assert session >= 3  # four branches at least: the first chain and three more
    assert learner.observe("ns", chain([*prompt, 5000]), len(prompt)) is None


def test_a_fan_out_inside_one_session_with_little_traffic_is_left_alone() -> None:
    learner, index = SplitLearner(2, children=3, hot_share=0.5, min_inserts=4), Index()
    for session in range(200):  # busy shard: sessions on their own roots
        ids = chain([session, 1, 2, 3])
        learner.observe("ns", ids, index.insert(ids))
    history = [9999, 1, 2, 3, 4]
    for regen in range(5):  # one session regenerates a turn five times
        ids = chain([*history, 7000 + regen])
        assert learner.observe("ns", ids, index.insert(ids)) is None
    assert len(learner) >= 1  # a candidate, counted, not proposed


def test_heads_already_split_and_declined_ones() -> None:
    learner, index = SplitLearner(2, children=2, hot_share=0.0, min_inserts=1), Index()
    base = chain([1, 2, 3])
    split = {key_of(base[-1])}
    index.insert(chain([1, 2, 3, 4]))
    assert learner.observe("ns", chain([1, 2, 3, 5]), 3, split) is None
    got = learner.observe("ns", chain([1, 2, 3, 6]), 3)
    assert got is not None
    assert learner.observe("ns", chain([1, 2, 3, 7]), 3) is None  # proposed already
    learner.declined(key_of(base[-1]))
    assert learner.observe("ns", chain([1, 2, 3, 8]), 3) is not None


def test_candidates_are_bounded() -> None:
    """A prefix diverged from once is remembered (most are a chain extended), a second
    time counted; both are bounded."""
    learner = SplitLearner(2, children=50, max_candidates=64)
    for i in range(500):
        learner.observe("ns", chain([i, 1, 2]), 2)
    assert len(learner) == 0
    for i in range(500):
        for _ in range(2):
            learner.observe("ns", chain([10_000 + i, 1, 2]), 2)
    assert 0 < len(learner) <= 64


@pytest.mark.parametrize("kwargs, needle", [({"children": 1}, "children"),
                                            ({"hot_share": 2.0}, "hot_share")])
def test_bad_settings(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        SplitLearner(2, **kwargs)  # type: ignore[arg-type]


def test_a_fan_out_inside_the_heads_a_sequence_passes_is_not_proposed() -> None:
    """Blocks before `region_from` are inside heads (their branches live on other
    shards): a divergence there is holes in a head, not this shard's fan-out."""
    learner = SplitLearner(2, children=2, hot_share=0.0, min_inserts=1)
    ids = chain([1, 2, 3, 4, 5])
    assert learner.observe("ns", ids, 1, region_from=3) is None
    assert learner.observe("ns", ids, 3, region_from=3) is None
    assert learner.observe("ns", ids, 4, region_from=3) is not None  # its region
