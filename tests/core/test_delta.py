"""Delta records (sarpd/core/delta.py): any change a write makes (blocks appended,
presence, first holders, the holder table) round-trips through one record, a record
applies only to the segment it was made for, and every damaged record is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import native
from sarpd.core.delta import HEAD, apply_delta, delta_key, delta_key_id, encode_delta
from sarpd.core.native import Kernels
from sarpd.core.segment import Segment
from sarpd.errors import CorruptData

# the default kernels (the C encode_delta where it is built) and the reference
KERNELS = [native.pick(), native.pick(reference=True)]


def segment(n: int, seed: int, table: int = 0) -> Segment:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**63, size=(n, 2), dtype=np.uint64)
    meta = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    xmeta = np.sort(rng.choice(2**40, size=table, replace=False).astype(np.uint64))
    xmask = rng.integers(1, 2**n, size=table, dtype=np.uint64) if table else xmeta.copy()
    return Segment(7, 3, (1 << n) - 1, 99, ids, meta, xmeta, xmask)


def same(a: Segment, b: Segment) -> bool:
    return (a.presence == b.presence and a.seg_id == b.seg_id and a.window == b.window
            and a.ns_tag == b.ns_tag and np.array_equal(a.ids, b.ids)
            and np.array_equal(a.meta, b.meta) and np.array_equal(a.xmeta, b.xmeta)
            and np.array_equal(a.xmask, b.xmask))


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.name)
@settings(max_examples=200, deadline=None)
@given(n0=st.integers(1, 60), grow=st.integers(0, 4), seed=st.integers(0, 2**16),
       flips=st.integers(0, 2**64 - 1), metas=st.lists(st.integers(0, 63), max_size=4),
       table=st.integers(0, 3), new_table=st.booleans())
def test_a_change_round_trips(k: Kernels, n0: int, grow: int, seed: int, flips: int,
                              metas: list[int], table: int, new_table: bool) -> None:
    before = segment(n0, seed, table)
    after = before.writable()
    n1 = min(64, n0 + grow)
    extra = segment(n1, seed + 1)
    after.ids = np.concatenate([after.ids, extra.ids[n0:]])
    after.meta = np.concatenate([after.meta, extra.meta[n0:]])
    after.presence = (before.presence ^ flips) & ((1 << n1) - 1)
    for o in metas:
        if o < n0:
            after.meta[o] = np.uint64(o * 1000 + 1)
    if new_table:
        t = segment(n1, seed + 2, 2)
        after.xmeta, after.xmask = t.xmeta, t.xmask
    record = encode_delta(before, after, k)
    assert same(apply_delta(before, record, "d"), after)
    if n1 == n0 and not metas and not new_table:
        assert len(record) == HEAD.size  # a presence change is its header alone


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k.name)
def test_a_record_applies_to_its_segment_only_and_checks_itself(k: Kernels) -> None:
    before = segment(8, 1)
    after = before.writable()
    after.presence &= ~1
    record = encode_delta(before, after, k)
    with pytest.raises(CorruptData, match="does not apply to a segment of 9 blocks"):
        apply_delta(segment(9, 1), record, "d")
    for i in (0, 5, 12, 30):
        bad = bytearray(record)
        bad[i] ^= 1
        with pytest.raises(CorruptData):
            apply_delta(before, bytes(bad), "d")
    with pytest.raises(CorruptData, match="shorter"):
        apply_delta(before, record[:10], "d")
    with pytest.raises(ValueError, match="shrink"):
        encode_delta(after, segment(4, 1), k)


def test_keys_sort_by_segment_then_record() -> None:
    keys = [delta_key(2, 0), delta_key(1, 300), delta_key(1, 2), delta_key(2**40, 1)]
    assert [delta_key_id(k) for k in sorted(keys)] == [(1, 2), (1, 300), (2, 0), (2**40, 1)]
    with pytest.raises(CorruptData):
        delta_key_id(b"S" + bytes(12))
