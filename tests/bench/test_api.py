"""The harness's vocabulary (tools.bench.api): turns, recovery results, and every
index the harness knows implementing `BenchIndex`."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from tools.bench.api import BLOCK_TOKENS, BenchIndex, RecoveryResult, Turn, fastest
from tools.bench.runner import index_factories


def test_turn_is_a_frozen_record_compared_by_identity() -> None:
    ids = np.arange(1, 5, dtype=np.uint64)
    t = Turn(session=2, ns="a", prompt=ids[:2], sequence=ids)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.session = 3  # type: ignore[misc]
    assert t == t and t != Turn(2, "a", ids[:2], ids)  # arrays: no elementwise __eq__
    rec = RecoveryResult(0.5, 0.75)
    assert rec.detail == "" and rec.spawn_s == 0.75 and BLOCK_TOKENS == 16


def protocol_members() -> set[str]:
    return {n for n, v in vars(BenchIndex).items()
            if not n.startswith("_") and inspect.isfunction(v)}


@pytest.mark.parametrize("name", list(index_factories()))
def test_every_index_implements_bench_index(name: str) -> None:
    index = index_factories()[name]()
    members = protocol_members()
    assert members >= {"open", "match_many", "insert_many", "flush", "recover",
                       "memory_bytes", "routing_bytes", "backend_reads", "disk_bytes", "close"}
    for m in members:
        assert callable(getattr(index, m)), f"{name} lacks {m}"
        want = list(inspect.signature(getattr(BenchIndex, m)).parameters)[1:]
        got = list(inspect.signature(getattr(index, m)).parameters)
        assert got[: len(want)] == want, f"{name}.{m}{got} vs {want}"
    assert isinstance(index.name, str) and index.name


def test_fastest_takes_each_timings_minimum_and_says_how_many() -> None:
    runs = [RecoveryResult(0.30, 0.50, "a"), RecoveryResult(0.10, 0.90, "b"),
            RecoveryResult(0.20, 0.40, "c")]
    best = fastest(runs)
    assert (best.seconds, best.spawn_s) == (0.10, 0.40)
    assert best.detail == "b; fastest of 3 recoveries"
    assert fastest([RecoveryResult(1.0, 2.0)]).detail == "one recovery"
    with pytest.raises(ValueError, match="no recovery"):
        fastest([])
