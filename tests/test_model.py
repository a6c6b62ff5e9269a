"""The request and result types (sarpd.model): the id layout, frozen records, and the
results' derived fields."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sarpd.model import (
    Check,
    CheckReport,
    Clear,
    Dump,
    Hello,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Ping,
    Remove,
    RemoveResult,
    Report,
    Request,
    SeqSpec,
    Snapshot,
    SnapshotResult,
    Stats,
    ids_from_bytes,
    ids_to_bytes,
)


@given(st.lists(st.binary(min_size=16, max_size=16), max_size=20))
def test_ids_bytes_round_trip(ids: list[bytes]) -> None:
    raw = b"".join(ids)
    arr = ids_from_bytes(raw)
    assert arr.shape == (len(ids), 2) and arr.dtype == np.uint64
    assert ids_to_bytes(arr) == raw


def test_id_layout_is_little_endian_low_then_high() -> None:
    raw = (5).to_bytes(8, "little") + (7).to_bytes(8, "little")
    arr = ids_from_bytes(raw)
    assert arr.tolist() == [[5, 7]]  # column 0: the low 64 bits (the routing key)
    assert ids_to_bytes(np.array([[2**64 - 1, 1]], dtype=np.uint64)) == b"\xff" * 8 + b"\x01" + (
        b"\x00" * 7
    )


def test_ids_from_bytes_is_a_writable_copy() -> None:
    raw = bytes(range(32))
    arr = ids_from_bytes(raw)
    arr[0, 0] = 0  # a view of the bytes would be read-only
    assert ids_from_bytes(raw)[0, 0] != 0


def test_ids_to_bytes_takes_any_layout() -> None:
    arr = np.arange(8, dtype=np.uint64).reshape(2, 4)[:, ::2]  # not contiguous
    assert ids_to_bytes(arr) == ids_to_bytes(np.array([[0, 2], [4, 6]], dtype=np.uint64))


def test_check_report_is_clean_without_problems() -> None:
    assert CheckReport().clean
    assert CheckReport(segments=3, routing_points=9).clean
    report = CheckReport(segments=3, problems=["segment 2: bad checksum"], fixed=1)
    assert not report.clean and report.fixed == 1
    assert CheckReport().problems is not CheckReport().problems  # no shared default


def test_requests_are_frozen_slotted_records() -> None:
    seq = SeqSpec(ns="a", tokens=np.arange(32, dtype=np.uint32))
    reqs: list[Request] = [
        Hello(1), Ping(2), Stats(3), Snapshot(4), Match(5, seq), Insert(6, seq, meta=0),
        Remove(7, seq=seq), Clear(8, ns="a"), Check(9), Dump(10, seq), Report(11, "b", {}),
    ]
    for req in reqs:
        assert dataclasses.is_dataclass(req) and not hasattr(req, "__dict__")
        with pytest.raises(dataclasses.FrozenInstanceError):
            req.id = 99  # type: ignore[misc]
    assert [r.id for r in reqs] == list(range(1, 12))


def test_request_defaults() -> None:
    seq = SeqSpec(ns="")
    assert seq.tokens is None and seq.hashes is None
    assert Match(1, seq).with_ids is False
    assert Insert(1, seq, meta=3).parent is None
    rm = Remove(1, ns="x", ids=np.zeros((1, 2), np.uint64))
    assert rm.seq is None and rm.start == 0
    assert (Clear(1, ns="n").mask, Clear(1, ns="n").value) == (0, 0)
    assert Check(1).fix is False


def test_results_compare_by_value() -> None:
    assert InsertResult(2, 1, 1) == InsertResult(2, 1, 1)
    assert RemoveResult(3) == RemoveResult(3) != RemoveResult(4)
    assert SnapshotResult(7, 0.5) == SnapshotResult(7, 0.5)
    res = MatchResult(2, np.array([1, 2], dtype=np.uint64))
    assert res.ids is None and res.meta.tolist() == [1, 2]
