"""Routing geometry and fingerprint arithmetic (pure numpy, no state).

Offsets inside a window of `segment_blocks` blocks:
- base points: multiples of `spacing` (= segment_blocks / routing_points): 0, 16, 32, 48;
- refinement lattice: multiples of `refine_min_gap` (4); a point at offset o with
  interval I (I = spacing for a base point, else the lowest set bit of o) refines
  into o + I/2, o + I/4, ... down to `refine_min_gap`.
A filter is eight fingerprint bytes (byte j: the block at point + 2j + 2; 0 past the
end of the segment or query window); fingerprints are `(id_hi & 0xFF) | 1`, so a
real fingerprint never equals the "absent" 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sarpd.config import IndexConfig
from sarpd.model import IdArray, U64Array

_REGION = np.arange(1, 9, dtype=np.int64) * 2  # 2, 4, ..., 16


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
    """Fingerprint byte per block, zero-padded to `pad_to` + 18 entries."""
    fp = np.zeros(pad_to + 18, dtype=np.uint8)
    n = len(ids)
    fp[:n] = (ids[:, 1] & np.uint64(0xFF)).astype(np.uint8) | np.uint8(1)
    return fp


def filters_at(fp: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> U64Array:
    """The 64-bit filter of a point at each offset, from padded fingerprints."""
    pos = offsets[:, None] + _REGION[None, :]
    packed = np.ascontiguousarray(fp[pos])
    out: U64Array = packed.view("<u8").reshape(-1).astype(np.uint64)
    return out


def filter_at(fp: npt.NDArray[np.uint8], offset: int) -> int:
    return int(filters_at(fp, np.array([offset], dtype=np.int64))[0])


def agreement(filts: U64Array, qfilt: int) -> npt.NDArray[np.int64]:
    """Leading fingerprint bytes on which each candidate agrees with the query (0..8)."""
    x = np.bitwise_xor(filts, np.uint64(qfilt)).astype("<u8")
    ne = x.view(np.uint8).reshape(-1, 8) != 0
    first = ne.argmax(axis=1)
    out: npt.NDArray[np.int64] = np.where(ne.any(axis=1), first, 8).astype(np.int64)
    return out


def top_candidates(segs: U64Array, filts: U64Array, qfilt: int, cap: int) -> list[int]:
    """The `cap` strongest candidates: most fingerprint agreement, then newest."""
    score = (agreement(filts, qfilt).astype(np.uint64) << np.uint64(56)) | segs
    if segs.size <= cap:
        idx = np.argsort(score)[::-1]
    else:
        idx = np.argpartition(score, score.size - cap)[score.size - cap:]
        idx = idx[np.argsort(score[idx])[::-1]]
    return [int(s) for s in segs[idx]]
