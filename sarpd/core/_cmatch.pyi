"""sarpd/core/_cmatch.c: the match kernel (layout: sarpd/core/kernel.py)."""

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from sarpd.core.segment import Segment
from sarpd.model import IdArray, U64Array

ROW_FIELDS: int

def route(qids: IdArray, qlens: npt.NDArray[np.int64], bkeys: U64Array, bsegs: U64Array,
          bfilts: U64Array, dkeys: U64Array, dsegs: U64Array, dfilts: U64Array,
          dorder: npt.NDArray[np.int64], sb: int, gap: int, cap: int,
          kfilter: U64Array = ..., /) -> tuple[bytes, bytes]: ...
def verify(qids: IdArray, qstarts: npt.NDArray[np.int64], rows: npt.NDArray[np.int64],
           first: U64Array, segs: Mapping[int, Segment], sb: int, /) -> tuple[bytes, bytes]: ...
def assemble(rows: npt.NDArray[np.int64], span: npt.NDArray[np.int64],
             best: npt.NDArray[np.int64], sids: U64Array, segs: Mapping[int, Segment],
             ks: npt.NDArray[np.int64], /) -> tuple[bytes, bytearray, bytearray]: ...
def match(qids: IdArray, qlens: npt.NDArray[np.int64], bkeys: U64Array, bsegs: U64Array,
          bfilts: U64Array, dkeys: U64Array, dsegs: U64Array, dfilts: U64Array,
          dorder: npt.NDArray[np.int64], sb: int, gap: int, cap: int,
          read: Callable[[list[int]], dict[int, Segment | None]],
          indexed: Callable[[bytes], Sequence[bool]] | None, ks: npt.NDArray[np.int64],
          exact: bool, kfilter: U64Array = ..., /) -> tuple[bytes, bytearray, bytearray, int]: ...
def salt(ids: IdArray, out: IdArray, lo: int, hi: int, /) -> None: ...
def salt_runs(ids: IdArray, out: IdArray, ends: npt.NDArray[np.int64], salts: U64Array,
              /) -> None: ...
def merge_order(keys: U64Array, old: npt.NDArray[np.int64], old_keys: U64Array,
                /) -> tuple[bytes, bytes]: ...
def _set_gil_free_min(work: int, /) -> int: ...
