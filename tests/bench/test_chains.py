"""Prefix-chained block ids (tools.bench.chains)."""

from __future__ import annotations

import numpy as np

from tests.bench.prefixes import common_prefix
from tools.bench.chains import chain_ids, chain_segments, mix64, root_state, token_ids


def test_chain_ids_are_prefix_determined() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(1, 32_000, size=16 * 40 + 7, dtype=np.uint64)
    b = a.copy()
    b[16 * 25 + 3] += np.uint64(1)  # differs inside block 25
    ia, ib = token_ids(a, 1), token_ids(b, 1)
    assert len(ia) == 40  # the partial tail is not a block
    assert common_prefix(ia, ib) == 25
    assert not set(ia[25:].tolist()) & set(ib[25:].tolist())
    assert common_prefix(token_ids(a, 1), token_ids(a, 2)) == 0
    assert len(chain_ids(np.empty(0, dtype=np.uint64), 1)) == 0


def test_segments_chain_like_separate_sequences() -> None:
    """chain_segments of concatenated segments = chain_ids of each segment alone."""
    rng = np.random.default_rng(7)
    content = rng.integers(0, 2**63, size=30, dtype=np.uint64)
    lengths = np.array([5, 0, 12, 13], dtype=np.int64)
    root = root_state(3, 4)
    together = chain_segments(content, lengths, root)
    starts = np.cumsum(lengths) - lengths
    apart = [chain_ids(content[s : s + n], root) for s, n in zip(starts, lengths, strict=True)]
    assert (together == np.concatenate(apart)).all()
    assert (together != 0).all()


def test_mix64_is_a_bijection_and_roots_differ_by_key() -> None:
    x = np.arange(1 << 12, dtype=np.uint64)
    assert len(set(mix64(x).tolist())) == len(x)
    roots = {root_state(a, b) for a in range(8) for b in range(8)}
    assert len(roots) == 64
    assert root_state(1, 2) == root_state(1, 2) != root_state(2, 1)
