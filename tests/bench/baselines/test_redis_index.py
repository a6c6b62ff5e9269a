"""The Redis block hash (tools.bench.baselines.redis_index) on a real redis-server,
against the oracle (skipped without the binary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.baselines.harness import (
    check_exact_with_recovery,
    check_first_insert_wins_and_namespaces,
    needs_redis,
)

NAMES = ("redis",)


@needs_redis
@pytest.mark.parametrize("name", NAMES)
def test_exact_with_recovery(name: str, tmp_path: Path) -> None:
    check_exact_with_recovery(name, tmp_path)


@needs_redis
@pytest.mark.parametrize("name", NAMES)
def test_first_insert_wins_and_namespaces(name: str, tmp_path: Path) -> None:
    check_first_insert_wins_and_namespaces(name, tmp_path)
