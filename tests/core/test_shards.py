"""The shard rule (sarpd/core/shards.py): by the first block's internal id, so the
namespace and the first block decide it, every continuation of a sequence lands with
it, and shards fill evenly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core.ids import salt_ids, token_ids
from sarpd.core.shards import MAX_SHARDS, check_shards, shard_of

BT = 16


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=BT, max_size=6 * BT),
       st.integers(1, 64), st.sampled_from(["", "a", "tenant-7"]))
def test_every_continuation_of_a_sequence_has_its_shard(tokens: list[int], shards: int,
                                                       ns: str) -> None:
    toks = np.array(tokens, dtype=np.uint32)
    full = shard_of(token_ids(ns, toks, BT), shards)
    first_block = shard_of(token_ids(ns, toks[:BT], BT), shards)
    assert full is not None and full == first_block and 0 <= full < shards


def test_the_namespace_and_the_first_block_decide() -> None:
    toks = np.arange(BT * 2, dtype=np.uint32)
    by_ns = {shard_of(token_ids(f"ns{i}", toks, BT), 64) for i in range(200)}
    assert len(by_ns) > 32  # the same tokens in other namespaces spread out
    ids = np.zeros((3, 2), dtype=np.uint64)
    ids[:, 0] = [5, 6, 7]
    assert shard_of(salt_ids("x", ids), 8) == shard_of(salt_ids("x", ids[:1]), 8)


def test_shards_fill_evenly() -> None:
    rng = np.random.default_rng(1)
    counts = np.zeros(8, dtype=np.int64)
    for _ in range(4000):
        toks = rng.integers(0, 2**32, BT, dtype=np.uint64).astype(np.uint32)
        s = shard_of(token_ids("", toks, BT), 8)
        assert s is not None
        counts[s] += 1
    assert counts.min() > 0.8 * 500 and counts.max() < 1.2 * 500


def test_no_block_no_shard_and_the_count_is_checked() -> None:
    assert shard_of(np.empty((0, 2), np.uint64), 4) is None
    for bad in (0, -1, MAX_SHARDS + 1):
        with pytest.raises(ValueError, match=rf"shards: {bad} is outside 1\.\.{MAX_SHARDS}"):
            check_shards(bad)
    check_shards(1)
    check_shards(MAX_SHARDS)
