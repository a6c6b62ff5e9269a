"""Segment-Hash and Segment-Hash-Head (tools.bench.baselines.segment_hash) against
the oracle, their key layouts and what a match reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.bench.baselines.harness import (
    arr,
    chain,
    check_exact_on_memory_backend_other_seed,
    check_exact_with_recovery,
    check_first_insert_wins_and_namespaces,
    check_hot_shared_prefix,
    opened,
)
from tools.bench.baselines._common import BackendBaseline, be_key, be_keys, salted
from tools.bench.baselines.segment_hash import HEAD, LOC, SEG

NAMES = ("segment-hash", "segment-hash-head")


@pytest.mark.parametrize("name", NAMES)
def test_exact_with_recovery(name: str, tmp_path: Path) -> None:
    check_exact_with_recovery(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_exact_on_memory_backend_other_seed(name: str, tmp_path: Path) -> None:
    check_exact_on_memory_backend_other_seed(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_first_insert_wins_and_namespaces(name: str, tmp_path: Path) -> None:
    check_first_insert_wins_and_namespaces(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_hot_shared_prefix(name: str, tmp_path: Path) -> None:
    check_hot_shared_prefix(name, None, tmp_path)


def test_segment_hash_layout_and_one_round_for_an_indexed_prompt(tmp_path: Path) -> None:
    """A segment per window keyed by its last block and a locator per new block; an
    indexed prompt is matched in ONE multi-get (block 63's key, every tail position's);
    a prompt that leaves a segment inside its window is matched by the locator."""
    rng = np.random.default_rng(4)
    seq = chain(0, 100, rng)
    q = salted(arr(seq), "x")
    with opened("segment-hash", tmp_path / "sh") as index:
        assert isinstance(index, BackendBaseline)
        index.insert_many([arr(seq)], ["x"], [arr(list(range(100)))])
        keys = [k for k, _ in index.backend.scan(b"", b"\xff" * 9)]
        assert [k for k in keys if k[:1] == SEG] == sorted(be_keys(q[[63, 99]], SEG))
        assert sorted(k for k in keys if k[:1] == LOC) == sorted(be_keys(q, LOC))
        before = index.backend_reads()
        assert index.match_many([arr(seq)], ["x"])[0].tolist() == list(range(100))
        assert index.backend_reads() - before == 1 + 36
        branch = seq[:20] + chain(seq[19], 30, rng)
        assert index.match_many([arr(branch)], ["x"])[0].tolist() == list(range(20))


def test_segment_hash_head_scans_one_head_per_window(tmp_path: Path) -> None:
    """Segments under `H + head id + last id`; a branch inside a window is a second
    segment under the same head (a copy of the shared part); a match scans one head
    range per window it reaches."""
    rng = np.random.default_rng(5)
    seq = chain(0, 100, rng)
    branch = seq[:20] + chain(seq[19], 30, rng)
    q, qb = salted(arr(seq), "x"), salted(arr(branch), "x")
    with opened("segment-hash-head", tmp_path / "shh") as index:
        assert isinstance(index, BackendBaseline)
        index.insert_many([arr(seq), arr(branch)], ["x", "x"],
                          [arr(list(range(100))), arr(list(range(500, 550)))])
        keys = sorted(k for k, _ in index.backend.scan(b"", b"\xff" * 17))
        assert keys == sorted([be_key(HEAD, int(q[0]), int(q[63])),
                               be_key(HEAD, int(q[64]), int(q[99])),
                               be_key(HEAD, int(qb[0]), int(qb[49]))])
        before = index.backend_reads()
        got = index.match_many([arr(seq), arr(branch)], ["x", "x"])
        assert got[0].tolist() == list(range(100))
        assert got[1].tolist() == list(range(20)) + list(range(520, 550))
        assert index.backend_reads() - before == 2 + 1
