"""The Redis block hash (tools.bench.baselines.redis_index): its RESP packing, and on
a real redis-server (skipped without the binary) against the oracle, what a match
reads and the memory it reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

from tests.bench.baselines.harness import (
    arr,
    chain,
    check_exact_with_recovery,
    check_first_insert_wins_and_namespaces,
    needs_redis,
    opened,
)
from tools.bench.baselines.redis_index import resp_command

NAMES = ("redis",)


@needs_redis
@pytest.mark.parametrize("name", NAMES)
def test_exact_with_recovery(name: str, tmp_path: Path) -> None:
    check_exact_with_recovery(name, tmp_path)


@needs_redis
@pytest.mark.parametrize("name", NAMES)
def test_first_insert_wins_and_namespaces(name: str, tmp_path: Path) -> None:
    check_first_insert_wins_and_namespaces(name, tmp_path)


def test_resp_command_packs_as_redis_py_does() -> None:
    """Ids as 8-byte big-endian arguments, metas little-endian, column after column:
    the bytes redis-py's own packer makes of the same arguments."""
    ids = np.array([1, 2**64 - 1, 5], np.uint64)
    metas = np.array([7, 8, 2**63], np.uint64)
    head = [b"EVALSHA", b"abc", b"3"]
    args = head + [int(i).to_bytes(8, "big") for i in ids]
    args += [int(m).to_bytes(8, "little") for m in metas]
    want = b"".join(redis.connection.Connection().pack_command(*args))
    assert resp_command(head, ids, metas) == want
    assert resp_command([b"MGET"], np.zeros(0, np.uint64)) == b"*1\r\n$4\r\nMGET\r\n"


@needs_redis
def test_a_match_reads_one_key_per_id_and_memory_is_redis_own(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    seq = chain(0, 1000, rng)
    with opened("redis", tmp_path / "redis") as index:
        empty = index.memory_bytes()
        index.insert_many([arr(seq)], ["x"], [arr(list(range(1000)))])
        before = index.backend_reads()
        got = index.match_many([arr(seq[:700] + chain(seq[699], 5, rng))], ["x"])
        assert got[0].tolist() == list(range(700))
        assert index.backend_reads() - before == 705  # ONE MGET of every id
        assert index.memory_bytes() > empty > 0  # INFO used_memory grew with the keys
