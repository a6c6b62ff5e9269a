"""Segment-Hash and Segment-Hash-Head (tools.bench.baselines.segment_hash) against
the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.baselines.harness import (
    check_exact_on_memory_backend_other_seed,
    check_exact_with_recovery,
    check_first_insert_wins_and_namespaces,
    check_hot_shared_prefix,
)

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
