"""Routing geometry and fingerprint arithmetic (pure numpy, no state).

Offsets inside a window of `segment_blocks` blocks:
- base points: multiples of `spacing` (= segment_blocks / routing_points): 0, 16, 32, 48;
- refinement lattice: multiples of `refine_min_gap` (4); a point at offset o with
  interval I (I = spacing for a base point, else the lowest set bit of o) refines
  into o + I/2, o + I/4, ... down to `refine_min_gap`.
A filter is eight 8-bit fingerprints, one per two-block region after the point
(byte j covers blocks point + 2j + 1 and point + 2j + 2): its high nibble is the
4-bit fingerprint of the first block, its low nibble that of the second, so
agreement is resolved per block. A block's fingerprint is 1..15, from a
multiplicative mix of both 64-bit halves of its id (engine ids are 64-bit: their
high half is the same for every block of a namespace); 0 stands for "no block here"
(past the end of the segment or window).
Agreement bounds a candidate: one that agrees on the first a blocks after the point
matches the query through at most point + a.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sarpd.config import IndexConfig
from sarpd.model import IdArray, U64Array

_SPAN = np.arange(1, 17, dtype=np.int64)  # the 16 blocks after a point
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True, slots=True)
class Geometry:
    sb: int  # blocks per segment / window
    spacing: int
    gap: int
    offsets: tuple[int, ...]  # every offset that can carry a routing point, ascending

    @staticmethod
    def of(cfg: IndexConfig) -> Geometry:
        gap = max(1, min(cfg.refine_min_gap, cfg.point_spacing))
        return Geometry(cfg.segment_blocks, cfg.point_spacing, gap,
                        tuple(range(0, cfg.segment_blocks, gap)))

    def is_base(self, o: int) -> bool:
        return o % self.spacing == 0

    def interval(self, o: int) -> int:
        return self.spacing if o % self.spacing == 0 else (o & -o)

    def refinements(self, o: int) -> list[int]:
        """Offsets that refine the interval after `o`, coarsest first."""
        out, step = [], self.interval(o) // 2
        while step >= self.gap:
            if o + step < self.sb:
                out.append(o + step)
            step //= 2
        return out


def fingerprints(ids: IdArray, pad_to: int) -> npt.NDArray[np.uint8]:
    """4-bit fingerprint per block (1..15), zero-padded to `pad_to` + 18 entries."""
    fp = np.zeros(pad_to + 18, dtype=np.uint8)
    n = len(ids)
    mixed = (ids[:, 0] ^ ids[:, 1]) * _GOLDEN  # both halves: caller ids may be 64-bit
    fp[:n] = ((mixed >> np.uint64(32)) % np.uint64(15)).astype(np.uint8) + np.uint8(1)
    return fp


def filters_at(fp: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> U64Array:
    """The 64-bit filter of a point at each offset, from padded fingerprints."""
    nib = fp[offsets[:, None] + _SPAN[None, :]].reshape(-1, 8, 2)
    packed = np.ascontiguousarray((nib[:, :, 0] << 4) | nib[:, :, 1])
    out: U64Array = packed.view("<u8").reshape(-1).astype(np.uint64)
    return out


def filter_at(fp: npt.NDArray[np.uint8], offset: int) -> int:
    return int(filters_at(fp, np.array([offset], dtype=np.int64))[0])


def agreement(filts: U64Array, qfilt: int) -> npt.NDArray[np.int64]:
    """Leading blocks after the point on which each candidate agrees with the query (0..16)."""
    x = np.bitwise_xor(filts, np.uint64(qfilt)).astype("<u8").view(np.uint8).reshape(-1, 8)
    ne = np.empty((x.shape[0], 16), dtype=bool)
    ne[:, 0::2] = (x >> 4) != 0
    ne[:, 1::2] = (x & 0xF) != 0
    first = ne.argmax(axis=1)
    out: npt.NDArray[np.int64] = np.where(ne.any(axis=1), first, 16).astype(np.int64)
    return out


def bounds(filts: U64Array, qfilt: int, offset: int, length: int) -> npt.NDArray[np.int64]:
    """The most blocks from the window start each candidate under the point at `offset`
    can match a query with `length` blocks in the window: a fingerprint that differs at
    block offset + a + 1 proves the ids differ there; agreement on all 16 blocks after
    the point bounds nothing short of the query's end."""
    ag = agreement(filts, qfilt)
    out: npt.NDArray[np.int64] = np.minimum(np.where(ag >= 16, length, offset + 1 + ag), length)
    return out


def strongest(segs: U64Array, filts: U64Array, qfilt: int, cap: int) -> tuple[list[int], int]:
    """The `cap` strongest candidates (most fingerprint agreement, then newest), and
    the agreement of the weakest of them (no other candidate agrees more)."""
    ag = agreement(filts, qfilt)
    score = (ag.astype(np.uint64) << np.uint64(56)) | segs
    if segs.size <= cap:
        idx = np.argsort(score)[::-1]
    else:
        idx = np.argpartition(score, score.size - cap)[score.size - cap:]
        idx = idx[np.argsort(score[idx])[::-1]]
    return [int(s) for s in segs[idx]], int(ag[idx[-1]]) if idx.size else 16
