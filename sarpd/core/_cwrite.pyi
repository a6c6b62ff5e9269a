"""sarpd/core/_cwrite.c: the write path's codecs (references: sarpd.core.segment, and
sarpd.core.router's `segment_filters`)."""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sarpd.core.segment import Segment
from sarpd.model import IdArray, U64Array

def encode_segment(seg_id: int, window: int, presence: int, ns_tag: int, ids: U64Array,
                   meta: U64Array, xmeta: U64Array, xmask: U64Array, /) -> bytes: ...
def parse_segment(value: bytes, /) -> tuple[int, int, int, int, int, int, int] | int: ...
def block_keys(ids: U64Array, /) -> list[bytes]: ...
def filters(ids: U64Array, offsets: Sequence[int], /) -> list[int]: ...
# a segment a window kernel changed: (its index in segs, presence, meta, xmeta, xmask)
Change = tuple[int, int, bytearray, bytearray, bytearray]

def encode_delta(before: Segment, after: Segment, /) -> bytes: ...
def drop_windows(segs: Sequence[Segment], seg_ends: npt.NDArray[np.int64],
                 offs: npt.NDArray[np.int64], ids: IdArray, tgt_ends: npt.NDArray[np.int64],
                 holder: int | None, /) -> tuple[list[Change], bytes, bytes]: ...
def add_holders(segs: Sequence[Segment], offs: npt.NDArray[np.int64], ids: IdArray,
                metas: U64Array, /) -> tuple[list[Change], bytes]: ...
def refill_blocks(segs: Sequence[Segment], offs: npt.NDArray[np.int64], ids: IdArray,
                  metas: U64Array, /) -> tuple[list[Change], bytes]: ...

# The C segment library (sarpd/core/csrc/segment.c) driven on values, for
# tests/core/test_csegment.py: the failure codes by name (segment.h's SEG_* codes), the
# holder operations on a decoded value (each op's result and the value after it; an int:
# the check the value fails), and delta records (references: sarpd.core.segment.Segment,
# sarpd.core.delta).
OpResult = bool | int | list[int] | tuple[list[int], list[int]] | None

CHECKS: dict[str, int]

def seg_ops(value: bytes, ops: Sequence[tuple[object, ...]],
            /) -> list[tuple[OpResult, bytes]] | int: ...
def delta(before: bytes, after: bytes, /) -> bytes: ...
def apply_delta(value: bytes, record: bytes, /) -> bytes | int: ...
