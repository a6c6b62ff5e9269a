"""Routing geometry and fingerprint arithmetic (sarpd/core/routing.py): the lattice
of offsets, refinement steps, fingerprints, filters, agreement and the ranking."""

from __future__ import annotations

import numpy as np

from sarpd.config import IndexConfig
from sarpd.core.ids import token_ids
from sarpd.core.routing import (
    Geometry,
    agreement,
    bounds,
    filter_at,
    filters_at,
    fingerprints,
    strongest,
)

GEO = Geometry.of(IndexConfig())


def ids(n: int, seed: int = 0) -> np.ndarray:
    toks = np.random.default_rng(seed).integers(0, 50_000, 16 * n).astype(np.uint32)
    return token_ids("", toks, 16)


def test_default_geometry_is_the_documented_lattice() -> None:
    assert (GEO.sb, GEO.spacing, GEO.gap) == (64, 16, 4)
    assert GEO.offsets == tuple(range(0, 64, 4))
    assert [o for o in GEO.offsets if GEO.is_base(o)] == [0, 16, 32, 48]
    assert GEO.interval(16) == 16 and GEO.interval(8) == 8 and GEO.interval(12) == 4
    assert GEO.refinements(0) == [8, 4]  # coarsest first, down to refine_min_gap
    assert GEO.refinements(8) == [12]
    assert GEO.refinements(48) == [56, 52]
    tiny = Geometry.of(IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1))
    assert tiny.offsets == tuple(range(8)) and tiny.refinements(4) == [6, 5]


def test_fingerprints_are_1_to_15_and_zero_padded() -> None:
    fp = fingerprints(ids(10), 64)
    assert fp.shape == (64 + 18,)
    assert ((fp[:10] >= 1) & (fp[:10] <= 15)).all()
    assert not fp[10:].any()
    hi = ids(10).copy()
    hi[:, 0] = 7  # only the high half differs (as 64-bit engine ids salted): still mixed
    assert len(set(fingerprints(hi, 0)[:10].tolist())) > 1
    assert (fingerprints(ids(5, 1), 0)[:5] == fingerprints(ids(5, 1), 64)[:5]).all()


def test_a_filter_packs_the_16_blocks_after_its_point() -> None:
    fp = fingerprints(ids(40), 64)
    f = filter_at(fp, 3)
    raw = f.to_bytes(8, "little")
    for j in range(8):  # byte j: blocks 3 + 2j + 1 (high nibble) and 3 + 2j + 2
        assert raw[j] >> 4 == fp[3 + 2 * j + 1] and raw[j] & 0xF == fp[3 + 2 * j + 2]
    many = filters_at(fp, np.array([0, 3, 20], dtype=np.int64))
    assert many.tolist() == [filter_at(fp, 0), f, filter_at(fp, 20)]


def test_agreement_counts_leading_equal_blocks() -> None:
    fp = fingerprints(ids(40), 64)
    q = filter_at(fp, 0)
    other = fp.copy()
    other[6] = 1 + other[6] % 15  # block 6 differs: agreement ends after 5 blocks
    same_to = filter_at(other, 0)
    short = fp.copy()
    short[3:] = 0  # a segment of 3 blocks: agreement ends where it ends
    got = agreement(np.array([q, same_to, filter_at(short, 0)], dtype=np.uint64), q)
    assert got.tolist() == [16, 5, 2]


def test_ranking_picks_the_strongest_then_the_newest() -> None:
    def filt(first: int) -> int:  # byte 0 (blocks 1 and 2) given, the rest 0x11
        return int.from_bytes(bytes([first]) + b"\x11" * 7, "little")

    segs = np.array([1, 2, 3, 4, 5], dtype=np.uint64)
    q = filt(0x11)
    # agreement: seg 1: 16, seg 2: 0, seg 3: 16, seg 4: 1 (differs at block 2), seg 5: 0
    filts = np.array([q, filt(0x21), q, filt(0x12), filt(0xF1)], dtype=np.uint64)
    assert agreement(filts, q).tolist() == [16, 0, 16, 1, 0]
    assert strongest(segs, filts, q, 2)[0] == [3, 1]
    assert strongest(segs, filts, q, 3)[0] == [3, 1, 4]
    assert strongest(segs, filts, q, 10)[0] == [3, 1, 4, 5, 2]


def _differs_at(qf: int, block: int) -> int:
    """A filter equal to `qf` but for the fingerprint of the block-th block after the
    point (0-based), so that its agreement with `qf` is exactly `block`."""
    byte, high = divmod(block, 2)
    shift = 8 * byte + (0 if high else 4)
    nib = (qf >> shift) & 0xF
    return qf ^ ((nib ^ (nib % 15 + 1)) << shift)


def test_bounds_are_the_blocks_a_candidate_can_match_at_most() -> None:
    q = ids(64, seed=3)
    qf = filter_at(fingerprints(q, 64), 16)
    filts = np.array([qf, _differs_at(qf, 0), _differs_at(qf, 5), _differs_at(qf, 15)],
                     dtype=np.uint64)
    assert agreement(filts, qf).tolist() == [16, 0, 5, 15]
    # agreeing on all 16 blocks after the point bounds nothing short of the query's end
    assert bounds(filts, qf, 16, 64).tolist() == [64, 17, 22, 32]
    assert bounds(filts, qf, 16, 20).tolist() == [20, 17, 20, 20]  # clipped by the query
