"""Branchy workloads (tools/bench/branchy.py): deterministic, linear in scale, and
branching where a capped matcher loses (inside windows, many siblings of one parent)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.bench.prefixes import common_prefix
from tools.bench.api import Turn
from tools.bench.branchy import SHAPES, BranchyWorkload
from tools.bench.runner import run_bench
from tools.bench.workloads import get_workload


def turns(name: str, scale: int = 1, seed: int = 0) -> list[Turn]:
    return list(get_workload(name, scale, seed).turns())


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_registered_deterministic_and_seeded(name: str) -> None:
    a, b, other = turns(name), turns(name), turns(name, seed=1)
    assert a and len(a) == len(b)
    assert all(np.array_equal(x.sequence, y.sequence) for x, y in zip(a, b, strict=True))
    assert [len(t.sequence) for t in a] != [len(t.sequence) for t in other]
    assert all(np.array_equal(t.prompt, t.sequence) for t in a)  # prompts are indexed
    assert name in BranchyWorkload(name).describe()


@pytest.mark.parametrize("name", ["branchy", "retries"])
def test_size_grows_with_scale(name: str) -> None:
    one, two = len(turns(name)), len(turns(name, scale=2))
    assert 1.5 * one < two < 3 * one


def test_branches_leave_sessions_inside_windows_and_siblings_share_parents() -> None:
    ts = turns("retries")
    first: dict[int, Turn] = {}
    for t in ts:
        first.setdefault(t.session, t)
    starts = list(first.values())
    # a branch's first turn shares a prefix with an earlier session's, cut anywhere;
    # siblings of one parent share the id of the block they branch after
    inside, at_edge = 0, 0
    parents: Counter[int] = Counter()
    for i, t in enumerate(starts[1:], 1):
        shared = max(common_prefix(t.prompt, s.prompt) for s in starts[:i])
        if shared:
            parents[int(t.prompt[shared - 1])] += 1
        inside += shared % 64 != 0
        at_edge += shared % 64 == 0
    assert inside > 3 * at_edge  # cuts inside 64-block windows are the common case
    assert max(parents.values()) >= 8  # many siblings of one parent


def test_unknown_name_and_bad_scale_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown branchy workload"):
        BranchyWorkload("nope")
    with pytest.raises(ValueError, match="scale must be >= 1"):
        BranchyWorkload("branchy", scale=0)


def test_sarp_reuses_exactly_what_the_exact_index_does(tmp_path: Path) -> None:
    wl = get_workload("retries")
    res = run_bench(wl, ["sarp", "dram-blockhash"], "rocksdb", tmp_path, batch=16)
    by = res.by_name()
    assert by["sarp"].tokens_reused == by["dram-blockhash"].tokens_reused > 0
