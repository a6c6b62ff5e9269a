"""DRAM- and SSD-BlockHash (tools.bench.baselines.blockhash) against the oracle, and
what each reads and keeps in memory."""

from __future__ import annotations

import sys
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
from tools.bench.baselines._common import engine_memory
from tools.bench.baselines.blockhash import DramBlockHash

NAMES = ("dram-blockhash", "ssd-blockhash")


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


def test_ssd_blockhash_reads_every_id_of_a_batch_once(tmp_path: Path) -> None:
    """A match is ONE multi-get of every id of every prompt, the first miss ending
    each prompt's match; nothing is kept in memory but the engine's."""
    rng = np.random.default_rng(2)
    a = chain(0, 100, rng)
    b = a[:30] + chain(a[29], 20, rng)
    with opened("ssd-blockhash", tmp_path / "ssd") as index:
        index.insert_many([arr(a)], ["x"], [arr(list(range(100)))])
        before = index.backend_reads()
        got = index.match_many([arr(b), arr(a), arr(a)], ["x", "x", "y"])
        assert [g.tolist() for g in got] == [list(range(30)), list(range(100)), []]
        assert index.backend_reads() - before == 250
        assert index.routing_bytes() == 0


def test_dram_blockhash_counts_its_dict_and_rebuilds_it_on_open(tmp_path: Path) -> None:
    """memory_bytes counts the dict's entries on top of the engine's; a match reads
    nothing from the backend; a reopen scans the per-block store into a new dict."""
    ids = chain(0, 1000, np.random.default_rng(3))
    metas = list(range(1000, 2000))  # not CPython's shared small ints: counted
    with opened("dram-blockhash", tmp_path / "dram") as index:
        assert isinstance(index, DramBlockHash)
        empty = index.memory_bytes() - engine_memory(index.backend)
        index.insert_many([arr(ids)], ["x"], [arr(metas)])
        held = index.memory_bytes() - engine_memory(index.backend)
        assert len(index) == 1000
        assert held - empty >= 1000 * 2 * sys.getsizeof(1000)  # a key and a value object each
        reads = index.backend_reads()
        assert index.match_many([arr(ids)], ["x"])[0].tolist() == metas
        assert index.backend_reads() == reads
    with opened("dram-blockhash", tmp_path / "dram") as again:
        assert isinstance(again, DramBlockHash)
        assert len(again) == 1000 and again.load_detail == "1000 entries loaded into the dict"
        assert again.match_many([arr(ids[:600])], ["x"])[0].tolist() == metas[:600]
