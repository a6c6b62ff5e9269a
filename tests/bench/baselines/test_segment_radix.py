"""Segment-Radix (tools.bench.baselines.segment_radix) against the oracle: capped,
with cap changes, after a crash (change log) and without a snapshot (full scan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.baselines.harness import (
    Runner,
    check_exact_on_memory_backend_other_seed,
    check_exact_with_recovery,
    check_first_insert_wins_and_namespaces,
    check_hot_shared_prefix,
    run_sessions,
    sessions,
    verify_all,
)
from tools.bench.baselines._radix_store import SNAPSHOT
from tools.bench.baselines.segment_radix import SegmentRadix

NAMES = ("segment-radix",)


@pytest.mark.parametrize("name", NAMES)
def test_exact_with_recovery(name: str, tmp_path: Path) -> None:
    check_exact_with_recovery(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_exact_on_memory_backend_other_seed(name: str, tmp_path: Path) -> None:
    check_exact_on_memory_backend_other_seed(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_first_insert_wins_and_namespaces(name: str, tmp_path: Path) -> None:
    check_first_insert_wins_and_namespaces(name, tmp_path)


@pytest.mark.parametrize("cap", [None, 8_000, 16_000])
def test_hot_shared_prefix(cap: int | None, tmp_path: Path) -> None:
    check_hot_shared_prefix("segment-radix", cap, tmp_path)


@pytest.mark.parametrize("cap", [0, 3000, 20000])
def test_segment_radix_capped_is_exact(cap: int, tmp_path: Path) -> None:
    index = SegmentRadix(cap_bytes=cap)
    assert index.recovery_options()["cap_bytes"] == cap
    index.open(tmp_path / "radix", "rocksdb", 1 << 20)
    try:
        r = run_sessions(index, seed=23, steps=50, recover_at=30)
        walk = index.routing_bytes()
        assert walk == index.estimated_bytes()
        assert index.check() == []
        assert walk <= max(cap, 200)  # the root alone is ~150 B
        assert index.total_nodes() > index.resident_nodes()
        if cap == 0:
            assert index.resident_nodes() == 0
        verify_all(index, r)
    finally:
        index.close()


def test_segment_radix_cap_changes_and_crash_recovery(tmp_path: Path) -> None:
    data = tmp_path / "radix"
    index = SegmentRadix(cap_bytes=None)
    index.open(data, "rocksdb", 1 << 20)
    steps = list(sessions(31, 70))
    r = Runner(index)
    for step in steps[:25]:
        r.step(step)
    full = index.resident_nodes()
    assert full == index.total_nodes()
    index.set_memory_cap(10_000)  # lowering evicts now
    assert 0 < index.resident_nodes() < full and index.routing_bytes() <= 10_000
    assert index.check() == []
    for step in steps[25:40]:
        r.step(step)
    index.set_memory_cap(None)  # raising reloads the top from the backend
    assert index.resident_nodes() == index.total_nodes()
    for step in steps[40:50]:
        r.step(step)
    index.flush()  # snapshot; then more inserts that only the change log holds
    for step in steps[50:60]:
        r.step(step)
    index.backend.close()  # a crash: no snapshot at close
    index._backend, index._data_dir = None, None
    again = SegmentRadix(cap_bytes=50_000)
    again.open(data, "rocksdb", 1 << 20)
    assert "change-log records replayed" in again.load_detail
    assert "0 change-log" not in again.load_detail
    r.index = again
    verify_all(again, r)
    for step in steps[60:65]:
        r.step(step)
    again.close()
    (data / SNAPSHOT).unlink()  # no snapshot: a full scan of the edges
    third = SegmentRadix(cap_bytes=None)
    third.open(data, "rocksdb", 1 << 20)
    assert "full scan" in third.load_detail
    r.index = third
    for step in steps[65:]:
        r.step(step)
    res = third.fit_cap(target_s=60.0, probes=1)  # a generous target: no cap needed
    assert res.seconds > 0 and third.cap_bytes is None
    res = third.fit_cap(target_s=1e-6, probes=1)  # unreachable: cap 0
    assert third.cap_bytes == 0 and third.resident_nodes() == 0
    r.index = third
    verify_all(third, r)
    third.close()


def filled(tmp_path: Path, cap: int | None = None, steps: int = 60) -> tuple[SegmentRadix, Runner]:
    index = SegmentRadix(cap_bytes=cap)
    index.open(tmp_path / "radix", "rocksdb", 1 << 20)
    r = Runner(index)
    for step in sessions(41, steps):
        r.step(step)
    return index, r


class Model:
    """A recovery time that grows with the resident tree (a fixed part plus 1 ms per
    node), counting its calls: fit_cap then fits on something deterministic."""

    def __init__(self, index: SegmentRadix, fixed_s: float = 0.0) -> None:
        self.index, self.fixed_s, self.calls = index, fixed_s, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.fixed_s + 1e-3 * self.index.resident_nodes()


def test_fit_cap_finds_the_cap_for_a_target_on_the_tree_it_holds(tmp_path: Path) -> None:
    index, r = filled(tmp_path)
    try:
        total = index.total_nodes()
        assert total > 40 and index.resident_nodes() == total
        model = Model(index)
        fit = index.fit_cap(1e-3 * total, measure=model)  # the whole tree meets it
        assert fit.cap_bytes is None and index.cap_bytes is None and fit.reached
        assert fit.resident_nodes == fit.total_nodes == total and model.calls == 1
        assert "cap none" in fit.describe()
        model.calls = 0
        fit = index.fit_cap(1e-3 * total / 2, probes=10, measure=model)  # half of it
        assert fit.cap_bytes is not None and 0 < fit.cap_bytes < fit.whole_bytes
        assert index.cap_bytes == fit.cap_bytes and fit.reached
        assert 0.4 * total <= fit.resident_nodes == index.resident_nodes() <= total / 2
        assert fit.seconds == 1e-3 * fit.resident_nodes and model.calls <= 10 + 2
        assert f"{fit.resident_nodes:,} of {total:,} nodes resident" in fit.describe()
        assert index.routing_bytes() <= fit.cap_bytes and index.check() == []
        verify_all(index, r)
        index.close()
        again = SegmentRadix(cap_bytes=fit.cap_bytes)  # the cap's snapshot, reopened
        again.open(tmp_path / "radix", "rocksdb", 1 << 20)
        assert again.resident_nodes() == fit.resident_nodes
        r.index = index = again
        verify_all(again, r)
    finally:
        index.close()


def test_fit_cap_reports_an_unreachable_target_at_cap_0(tmp_path: Path) -> None:
    index, r = filled(tmp_path, steps=30)
    try:
        model = Model(index, fixed_s=0.5)  # more than the target, whatever the cap
        fit = index.fit_cap(0.1, probes=50, measure=model)
        assert fit.cap_bytes == 0 == index.cap_bytes and not fit.reached
        assert fit.seconds == 0.5 and fit.resident_nodes == index.resident_nodes() == 0
        assert model.calls == 2  # the whole tree, then cap 0: no search
        assert "cap 0 B: the target 0.100 s is unreachable" in fit.describe()
        assert "recovery 0.500 s even at cap 0" in fit.describe()
        verify_all(index, r)
    finally:
        index.close()


def test_an_uncapped_snapshot_loads_under_the_cap(tmp_path: Path) -> None:
    index, r = filled(tmp_path)  # uncapped, as a preload writes it
    total = index.total_nodes()
    full = index.routing_bytes()
    index.close()  # the snapshot holds every node
    capped = SegmentRadix(cap_bytes=full // 3)
    capped.open(tmp_path / "radix", "rocksdb", 1 << 20)
    try:
        assert "from the snapshot" in capped.load_detail
        assert 0 < capped.resident_nodes() < total == capped.total_nodes()
        assert capped.routing_bytes() <= full // 3 and capped.check() == []
        assert capped.load_detail.startswith(f"{capped.resident_nodes()} of {total} nodes")
        r.index = capped
        verify_all(capped, r)
    finally:
        capped.close()
